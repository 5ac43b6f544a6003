"""The node-local blob cache: verified blobs by digest, bounded in size, least recently used out first.

A restart on the same node then costs no transfer at all. Recency is the file's mtime, touched on
every hit, so the cache needs no index file that could be torn by a crash.

Every hit is verified (sha256) before it is returned: a hit whose bytes fail is dropped, and the
caller fetches it again from its next source (swarm, store), so a corrupt entry costs one refetch
instead of failing every later start. Hashing on hit, rather than trusting a "verified" marker keyed
by inode, size and mtime, because the failure this guards against (a flipped byte on disk, a stray
write that keeps the size) changes none of those, and mtime is rewritten on every hit anyway. The
cost is one sequential read of the blob, which also warms the page cache for the reader that comes
next; that is far cheaper than a start that fails, or runs without its checkpoint, on a wrong byte.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .digests import sha256_file
from .settings import StoreSettings
from .store import Store, blob_path

if TYPE_CHECKING:
    pass


def _touch(p: Path) -> None:
    """Recency with the clock's full resolution (the kernel's file times are coarse, ~4 ms)."""
    now = time.time()
    os.utime(p, (now, now))


class BlobCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def path(self, digest: str) -> Path:
        return self.root / blob_path(digest).removeprefix("blobs/")

    def get(self, digest: str) -> Path | None:
        """The cached file, verified and its recency refreshed; None on a miss or a corrupt entry."""
        p = self.path(digest)
        try:
            _touch(p)
            before = p.stat()
            if sha256_file(p) == digest:
                return p
        except FileNotFoundError:
            return None
        self._drop(p, before.st_ino, digest)
        return None

    @staticmethod
    def _drop(p: Path, ino: int, digest: str) -> None:
        """Remove a corrupt entry, unless a good copy replaced it (another inode) while it was hashed."""
        import sys

        with contextlib.suppress(FileNotFoundError):
            if p.stat().st_ino == ino:
                p.unlink()
        print(
            f"bootseer: warning: cached blob {digest[:12]} failed its sha256 check; dropped, fetching it again",
            file=sys.stderr,
            flush=True,
        )

    def fetch(self, store: Store, digest: str, progress: Callable[[int], None] | None = None) -> tuple[Path, int]:
        """The blob from the cache, else from the store (verified). Returns (path, bytes transferred)."""
        hit = self.get(digest)
        if hit is not None:
            return hit, 0
        dest = self.path(digest)
        n = store.fetch_blob(digest, dest, progress=progress)
        _touch(dest)
        self.evict(keep=digest)
        return dest, n

    def adopt(self, src: Path, digest: str) -> Path:
        """Move a file already known to match `digest` into the cache (e.g. a freshly built snapshot)."""
        dest = self.path(digest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)
        _touch(dest)
        self.evict(keep=digest)
        return dest

    def entries(self) -> list[tuple[float, int, Path]]:
        out = []
        if not self.root.exists():
            return out
        for p in self.root.glob("sha256/*/*"):
            if p.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                out.append((st.st_mtime, st.st_size, p))
        return out

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def evict(self, keep: str | None = None) -> int:
        """Remove least recently used blobs until the cache fits; returns bytes freed."""
        entries = sorted(self.entries())
        total = sum(size for _, size, _ in entries)
        freed = 0
        for _, size, p in entries:
            if total <= self.max_bytes:
                break
            if keep and p.name == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                total -= size
                freed += size
        return freed


def cache_for(settings: StoreSettings) -> BlobCache:
    """The node cache the store settings name (default: under the platformdirs user cache)."""
    from .paths import blob_cache_dir

    return BlobCache(settings.cache_dir or blob_cache_dir(), settings.cache_max_bytes)
