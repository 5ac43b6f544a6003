"""Making a blob's torrent at publication, so that every node can join its swarm from the digest alone."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..digests import sha256_file

if TYPE_CHECKING:
    from ..store.core import Store


def publish_torrent(store: Store, digest: str, path: Path) -> str:
    """Store the blob's torrent as a blob and name it by `refs/torrent/<digest>.json`; returns its digest.

    A torrent already published for this blob is kept (the torrent is deterministic, but an older
    bootseer may have chosen another piece size, and the nodes of a job must share one swarm).
    """
    from .swarm import make_torrent

    existing = store.read_ref("torrent", digest)
    if existing and existing.get("torrent") and store.has_blob(str(existing["torrent"])):
        return str(existing["torrent"])
    torrent = make_torrent(Path(path), digest)
    tdigest = store.put_blob_bytes(torrent)
    store.write_ref("torrent", digest, {"torrent": tdigest, "size": Path(path).stat().st_size})
    return tdigest


def publish_file(store: Store, path: Path, with_torrent: bool = True) -> tuple[str, str | None]:
    """Upload a file as a blob and (optionally) its torrent: what `bootseer p2p publish` does."""
    digest = sha256_file(path)
    store.put_blob_file(path, digest)
    return digest, publish_torrent(store, digest, path) if with_torrent else None
