"""Getting a blob onto this node: node cache → swarm (when [p2p] is enabled) → store.

Every capability that needs a whole blob (env snapshots, hot-block packs, checkpoint stripes in
`pull` mode) calls `fetch_blob`, so the order of sources, the verification and the accounting of
where the bytes came from live in one place.

This module stays cheap to import: `launch` calls `handoff` on every `exec` that ran stages, and
libtorrent is loaded only once `fetch_blob` actually goes to the swarm.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import BootseerError

if TYPE_CHECKING:
    from .cache import BlobCache
    from .p2p.seed import SeedTask
    from .settings import P2PSettings
    from .store import Store

# What stops the swarm leg without being a bug: a store error while joining, libtorrent's own errors
# (RuntimeError), a socket or file error, a torrent that cannot be made (ValueError: an empty blob),
# a libtorrent that does not load. Each means "fetch this blob from the store instead".
_SWARM_FAILURES = (BootseerError, OSError, RuntimeError, ValueError, ImportError)

# Set once `fetch_blob` has entered the swarm in this process: `handoff` then has a session to stop
# and blobs to hand to the agent. A fact recorded here, rather than guessed from what was imported.
_swarm_used = threading.Event()


@dataclass
class Fetched:
    path: Path
    source: str  # "cache" | "peers" | "store"
    bytes_from_store: int = 0
    bytes_from_peers: int = 0
    note: str = ""  # e.g. why the swarm was not used


def fetch_blob(
    p2p: P2PSettings,
    store: Store,
    digest: str,
    progress: Callable[[int], None] | None = None,
    *,
    cache: BlobCache,
) -> Fetched:
    """The verified blob as a file in the node cache.

    With `[p2p] enabled`, a cache miss goes to the job's swarm first (the store serving about one
    copy to the whole job); anything that stops the swarm (no torrent for this blob, libtorrent
    cannot listen, a store error while joining) falls back to the store, with the reason in `note`.
    """
    hit = cache.get(digest)
    if hit is not None:
        return Fetched(hit, "cache")
    note = ""
    if p2p.enabled:
        from .p2p.fetch import NoSwarm, fetch_from_swarm

        _swarm_used.set()
        try:
            r = fetch_from_swarm(p2p, store, digest, cache, progress=progress)
            source = "peers" if r.bytes_from_peers > 0 else "store"
            return Fetched(r.path, source, r.bytes_from_store, r.bytes_from_peers, r.note)
        except NoSwarm as e:
            note = f"swarm not used: {e}"
        except _SWARM_FAILURES as e:  # the swarm is an optimisation: it never stops a fetch
            note = f"swarm failed ({e or type(e).__name__}); fetched from the store"
            _warn(f"blob {digest[:12]}: {note}")
    path, n = cache.fetch(store, digest, progress=progress)
    return Fetched(path, "store", bytes_from_store=n, note=note)


def _warn(msg: str) -> None:
    import sys

    print(f"bootseer: warning: {msg}", file=sys.stderr, flush=True)


def after_publish(p2p: P2PSettings, store: Store, digest: str, path: Path) -> dict[str, Any]:
    """Called by whoever publishes a blob that many nodes will fetch (a snapshot, a stripe).

    Returns extra fields for the ref that names the blob: with [p2p] enabled, the digest of the
    blob's torrent, which is also stored as a blob and named by `refs/torrent/<digest>.json` so
    that `fetch_blob` finds the swarm from the blob's digest alone. Nothing to add without P2P; a
    failure to make the torrent only means this blob travels from the store.
    """
    if not p2p.enabled:
        return {}
    try:
        from .p2p.publish import publish_torrent

        return {"torrent": publish_torrent(store, digest, path)}
    except _SWARM_FAILURES as e:
        _warn(f"no torrent for blob {digest[:12]} (it will be fetched from the store): {e}")
        return {}


HANDOFF_LINGER_S = 5.0


def handoff(cap_s: float | None = HANDOFF_LINGER_S) -> list[SeedTask]:
    """Before `exec`: stop this process's swarm (after serving the peers still downloading from it, a
    few seconds at most: the agent serves them again right after) and return the agent tasks that keep
    seeding the fetched blobs. `cap_s=None` lingers up to `[p2p] deadline_s`. No-op without P2P (and
    then libtorrent is never imported)."""
    if not _swarm_used.is_set():
        return []
    _swarm_used.clear()
    from .p2p.fetch import shutdown
    from .p2p.seed import SeedTask

    return [SeedTask(blobs=spec["blobs"], fetches=spec["fetches"]) for spec in shutdown(cap_s)]
