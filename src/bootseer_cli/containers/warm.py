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
from typing import Any

from ..errors import BootseerError


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


def _fetch(cfg: Any, store: Any, cache: Any, digests: list[str], item: Item) -> None:
    from ..delivery import fetch_blob

    for digest in digests:
        got = fetch_blob(cfg, store, digest, cache=cache)
        item.blobs += 1
        item.bytes += got.path.stat().st_size
        item.bytes_from_store += got.bytes_from_store
    item.status = "fetched" if item.bytes_from_store else "cached"


def prefetch(cfg: Any) -> Prefetched:
    """Fetch the env snapshot, hot-block record and checkpoint stripes for this config into the node cache."""
    from ..cache import cache_from_config
    from ..keys import compute
    from ..store import store_from_config

    keys = compute(cfg)
    store = store_from_config(cfg)
    cache = cache_from_config(cfg)
    out = Prefetched(cache_dir=str(cache.root), image_key=keys.image.digest, env_key=None)
    wanted: list[tuple[str, str]] = [("hot", keys.image.digest)]
    if cfg.get("env", "setup"):
        out.env_key = keys.env.digest
        wanted.insert(0, ("env", keys.env.digest))
    for kind, key in wanted:
        item = Item(kind, key)
        out.items.append(item)
        try:
            ref = store.read_ref(kind, key)
            if ref is None or not isinstance(ref.get("blob"), str):
                item.status, item.detail = "absent", f"nothing published for {kind} key {key[:16]}"
                continue
            _fetch(cfg, store, cache, [ref["blob"]], item)
        except (BootseerError, OSError) as e:
            item.status, item.detail = "failed", str(e)
    name = cfg.get("checkpoint", "name")
    if name:
        from ..stripe.catalog import Targets, load_manifest

        item = Item("checkpoint", f"{name}:{cfg.get('checkpoint', 'tag')}")
        out.items.append(item)
        try:
            m = load_manifest(store, name, cfg.get("checkpoint", "tag"))
            targets = Targets(store, cfg.get("checkpoint", "targets"))
            for ref in m.stripes:
                _fetch(cfg, targets.get(ref.target), cache, [ref.digest], item)
            item.key = f"{name}:{m.tag}"
        except (BootseerError, OSError) as e:
            item.status, item.detail = ("absent" if "not found" in str(e) or "no tags" in str(e) else "failed"), str(e)
    return out
