"""Getting a blob onto this node: node cache → swarm (when [p2p] is enabled) → store.

Every capability that needs a whole blob (env snapshots, hot-block packs, checkpoint stripes in
`pull` mode) calls `fetch_blob`, so the order of sources, the verification and the accounting of
where the bytes came from live in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Fetched:
    path: Path
    source: str  # "cache" | "peers" | "store"
    bytes_from_store: int = 0
    bytes_from_peers: int = 0
    note: str = ""  # e.g. why the swarm was not used


def fetch_blob(
    cfg: Any,
    store: Any,
    digest: str,
    progress: Callable[[int], None] | None = None,
    cache: Any = None,
) -> Fetched:
    """The verified blob as a file in the node cache.

    With `[p2p] enabled`, a cache miss goes to the job's swarm first (the store serving about one
    copy to the whole job); anything that stops the swarm (no torrent for this blob, libtorrent
    cannot listen, a store error while joining) falls back to the store, with the reason in `note`.
    """
    if cache is None:
        from .cache import cache_from_config

        cache = cache_from_config(cfg)
    hit = cache.get(digest)
    if hit is not None:
        return Fetched(hit, "cache")
    note = ""
    if cfg.get("p2p", "enabled"):
        from .p2p.fetch import NoSwarm, fetch_from_swarm

        try:
            r = fetch_from_swarm(cfg, store, digest, cache, progress=progress)
            source = "peers" if r.bytes_from_peers > 0 else "store"
            return Fetched(r.path, source, r.bytes_from_store, r.bytes_from_peers, r.note)
        except NoSwarm as e:
            note = f"swarm not used: {e}"
        except Exception as e:  # the swarm is an optimisation: never let it stop a fetch
            note = f"swarm failed ({e or type(e).__name__}); fetched from the store"
            _warn(f"blob {digest[:12]}: {note}")
    path, n = cache.fetch(store, digest, progress=progress)
    return Fetched(path, "store", bytes_from_store=n, note=note)


def _warn(msg: str) -> None:
    import sys

    print(f"bootseer: warning: {msg}", file=sys.stderr, flush=True)


def after_publish(cfg: Any, store: Any, digest: str, path: Path) -> dict[str, Any]:
    """Called by whoever publishes a blob that many nodes will fetch (a snapshot, a stripe).

    Returns extra fields for the ref that names the blob: with [p2p] enabled, the digest of the
    blob's torrent, which is also stored as a blob and named by `refs/torrent/<digest>.json` so
    that `fetch_blob` finds the swarm from the blob's digest alone. Nothing to add without P2P; a
    failure to make the torrent only means this blob travels from the store.
    """
    if not cfg.get("p2p", "enabled"):
        return {}
    try:
        from .p2p.publish import publish_torrent

        return {"torrent": publish_torrent(store, digest, path)}
    except Exception as e:
        _warn(f"no torrent for blob {digest[:12]} (it will be fetched from the store): {e}")
        return {}


HANDOFF_LINGER_S = 5.0


def handoff(cap_s: float | None = HANDOFF_LINGER_S) -> list[dict[str, Any]]:
    """Before `exec`: stop this process's swarm (after serving the peers still downloading from it, a
    few seconds at most: the agent serves them again right after) and return the agent tasks that keep
    seeding the fetched blobs. `cap_s=None` lingers up to `[p2p] deadline_s`. No-op without P2P."""
    import sys

    if "bootseer_cli.p2p.fetch" not in sys.modules:
        return []
    from .p2p.fetch import shutdown

    return [{"kind": "seed", **spec} for spec in shutdown(cap_s)]
