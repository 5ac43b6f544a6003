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
    """The verified blob as a file in the node cache."""
    if cache is None:
        from .cache import cache_from_config

        cache = cache_from_config(cfg)
    hit = cache.get(digest)
    if hit is not None:
        return Fetched(hit, "cache")
    path, n = cache.fetch(store, digest, progress=progress)
    return Fetched(path, "store", bytes_from_store=n)


def after_publish(cfg: Any, store: Any, digest: str, path: Path) -> dict[str, Any]:
    """Called by whoever publishes a blob that many nodes will fetch (a snapshot, a stripe).

    Returns extra fields for the ref that names the blob (e.g. the digest of its torrent, when
    [p2p] is enabled), so the swarm can find it. Nothing to add without P2P.
    """
    return {}
