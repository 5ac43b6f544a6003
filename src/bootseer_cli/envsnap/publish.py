"""Publishing an env snapshot: upload the captured blob, adopt it into the node cache, write the ref last.

Also the pending area of the node cache, which keeps a capture out of eviction from the moment the
builder hands it to the agent ("env-publish", agent_tasks.py) until the agent has uploaded it, and
`Upload`, the part of a capture that travels to the agent in its task.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .capture import Captured
from .catalog import FORMAT, REF_KIND

if TYPE_CHECKING:
    from ..settings import P2PSettings
    from ..store.cache import BlobCache
    from ..store.core import Store


@dataclass(frozen=True)
class Upload:
    """What publishing needs of a capture, small enough to hand to the agent in its task (JSON)."""

    blob: Path
    digest: str
    size: int
    files: int
    raw_bytes: int
    deletions: int
    entries: int  # how many entries the blob lists (ref field "entries"), deletions included

    @classmethod
    def of(cls, cap: Captured) -> Upload:
        """The upload of a capture (its entries counted: the ref's `entries` bounds a restore's metadata read)."""
        entries = len(cap.entries) + cap.deletions
        return cls(cap.blob, cap.digest, cap.size, cap.files, cap.raw_bytes, cap.deletions, entries)

    def as_task(self) -> dict[str, Any]:
        """As the agent task's JSON parameter."""
        return {**self.__dict__, "blob": str(self.blob)}

    @classmethod
    def from_task(cls, d: dict[str, Any]) -> Upload:
        """Back from the agent task's JSON parameter (types checked: the task file is read back from disk)."""
        ints = {k: int(d[k]) for k in ("size", "files", "raw_bytes", "deletions", "entries")}
        return cls(blob=Path(str(d["blob"])), digest=str(d["digest"]), **ints)


PENDING_DIR = "pending"


def pin_pending(cache: BlobCache, cap: Captured) -> Captured:
    """Move a capture to `<cache>/pending/`, out of the evictable part of the cache (eviction only
    walks `sha256/`), until the agent has uploaded it and adopts it into the cache."""
    pending = cache.root / PENDING_DIR
    pending.mkdir(parents=True, exist_ok=True)
    dest = pending / f"{cap.digest}-{uuid.uuid4().hex[:8]}.tar.zst"
    os.replace(cap.blob, dest)
    return replace(cap, blob=dest)


def sweep_pending(cache: BlobCache, ttl_s: float) -> int:
    """Remove pending captures whose uploader is gone: the agent touches its blob at every lease
    renewal (every TTL/3), so a blob untouched for 3 TTLs (10 minutes at least) has no uploader."""
    pending = cache.root / PENDING_DIR
    cutoff = time.time() - max(3 * ttl_s, 600.0)
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for p in pending.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed += 1
    return removed


def publish(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    cap: Captured | Upload,
    env_key: str,
    roots: list[str],
    progress: bool | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Upload the blob, adopt it into the node cache, then write the ref (last). Returns the cached path.

    Called by `exec` before the launcher starts (`[exec] agent = false`, the `snapshot` verb), or by
    the agent's "env-publish" task (envsnap/agent_tasks.py) with the capture's `Upload`. `extra`: the
    fields that let a later build pick this snapshot as a parent (`image`, `machine`, `inputs`) and, for
    a layer, its `parent`, `chain` and `depth` (layers.py)."""
    from .. import delivery
    from ..progress import byte_bar

    if isinstance(cap, Captured):
        cap = Upload.of(cap)
    with byte_bar(cap.size, "upload", enabled=progress) as advance:
        store.put_blob_file(cap.blob, cap.digest, progress=advance, own=True)
    path = cache.adopt(cap.blob, cap.digest, store)  # a local store: one copy, linked
    torrent = delivery.after_publish(p2p, store, cap.digest, path) or {}
    from ..envmount.image import upload_images

    upload_images(store, cache, extra)  # `[env] mode = "mount"`: the image the ref names, uploaded first
    doc = {
        "blob": cap.digest,
        "size": cap.size,
        "files": cap.files,
        "bytes": cap.raw_bytes,
        "deletions": cap.deletions,
        "entries": cap.entries,
        "created": time.time(),
        "creator": socket.gethostname(),
        "roots": roots,
        "format": FORMAT,
        **(extra or {}),
        **torrent,
    }
    store.write_ref(REF_KIND, env_key, doc)
    return path
