"""`bootseer prefetch`: put what the next start will fetch into the node cache, ahead of the start.

The hooks call it while the scheduler is still allocating the job (Slurm prolog) or before the
training container starts (Kubernetes init container), so the start itself finds the env snapshot,
the hot-block record and the checkpoint stripes in the node cache instead of waiting for the store.
It fetches exactly what the stages would: the blobs named by `refs/env/<env_key>`,
`refs/hot/<image_key>` and the stripes of `[checkpoint] name`, through `delivery.fetch_blob`
(verified, and over the swarm when `[p2p]` is on). Whatever is not published yet is reported and
skipped: warming a cache must never be the reason a job does not start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..cache import BlobCache
    from ..settings import Settings
    from ..store import Store


@dataclass
class Item:
    what: str  # "env" | "hot" | "checkpoint"
    key: str
    blobs: int = 0
    bytes: int = 0
    bytes_from_store: int = 0
    status: str = "fetched"  # fetched | cached | absent | failed
    detail: str = ""


@dataclass
class Prefetched:
    cache_dir: str
    image_key: str
    env_key: str | None
    items: list[Item] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cache_dir": self.cache_dir,
            "image_key": self.image_key,
            "env_key": self.env_key,
            "items": [i.__dict__ for i in self.items],
        }


def _fetch(settings: Settings, store: Store, cache: BlobCache, digests: list[str], item: Item) -> None:
    from ..delivery import fetch_blob

    for digest in digests:
        got = fetch_blob(settings.p2p, store, digest, cache=cache)
        item.blobs += 1
        item.bytes += got.path.stat().st_size
        item.bytes_from_store += got.bytes_from_store
    item.status = "fetched" if item.bytes_from_store else "cached"


def prefetch(settings: Settings) -> Prefetched:
    """Fetch the env snapshot, hot-block record and checkpoint stripes for these settings into the node cache."""
    from ..cache import cache_for
    from ..identity import keys_for
    from ..store import open_store

    keys = keys_for(settings)
    store = open_store(settings.store.uri)
    cache = cache_for(settings.store)
    out = Prefetched(cache_dir=str(cache.root), image_key=keys.image.digest, env_key=None)
    wanted: list[tuple[str, str]] = [("hot", keys.image.digest)]
    if settings.env.setup:
        out.env_key = keys.env.digest
        wanted.insert(0, ("env", keys.env.digest))
    for kind, key in wanted:
        out.items.append(_prefetch_ref(settings, store, cache, kind, key))
    if settings.checkpoint.name:
        out.items.append(_prefetch_checkpoint(settings, store, cache, settings.checkpoint.name))
    return out


def _prefetch_ref(settings: Settings, store: Store, cache: BlobCache, kind: str, key: str) -> Item:
    """The blob `refs/<kind>/<key>` names; nothing published yet is `absent`, not a failure."""
    item = Item(kind, key)
    try:
        ref = store.read_ref(kind, key)
        if ref is None or not isinstance(ref.get("blob"), str):
            item.status, item.detail = "absent", f"nothing published for {kind} key {key[:16]}"
            return item
        _fetch(settings, store, cache, [ref["blob"]], item)
    except (BootseerError, OSError) as e:
        item.status, item.detail = "failed", str(e)
    return item


def _prefetch_checkpoint(settings: Settings, store: Store, cache: BlobCache, name: str) -> Item:
    """Every stripe of checkpoint NAME at `[checkpoint] tag`, each from the target store it was written to."""
    from ..stripe.catalog import Targets, load_manifest

    tag = settings.checkpoint.tag
    item = Item("checkpoint", f"{name}:{tag}")
    try:
        m = load_manifest(store, name, tag)
        targets = Targets(store, list(settings.checkpoint.targets))
        for ref in m.stripes:
            _fetch(settings, targets.get(ref.target), cache, [ref.digest], item)
        item.key = f"{name}:{m.tag}"
    except (BootseerError, OSError) as e:
        item.status, item.detail = ("absent" if "not found" in str(e) or "no tags" in str(e) else "failed"), str(e)
    return item
