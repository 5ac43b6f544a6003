"""`bootseer prefetch`: put what the next start will fetch into the node cache, ahead of the start.

The hooks call it while the scheduler is still allocating the job (Slurm prolog) or before the
training container starts (Kubernetes init container), so the start itself finds the env snapshot,
the hot-block record and the checkpoint stripes in the node cache instead of waiting for the store.
It fetches exactly what the stages would, as each capability's `prefetch` hook says (the blobs named
by `refs/hot/<image_key>`, `refs/env/<env_key>`, the stripes of `[checkpoint] name` where the start
pulls it with `[p2p] enabled`: a mount, or a pull without the swarm, reads the store, not the cache), through
`delivery.fetch_blob` (verified, and over the swarm when `[p2p]` is on). Whatever is not published yet is reported and
skipped: warming a cache must never be the reason a job does not start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..settings import Settings
    from ..upkeep import Item


@dataclass
class Prefetched:
    cache_dir: str
    image_key: str
    env_key: str | None
    items: list[Item] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "cache_dir": self.cache_dir,
            "image_key": self.image_key,
            "env_key": self.env_key,
            "items": [i.__dict__ for i in self.items],
        }


def prefetch(settings: Settings) -> Prefetched:
    """Fetch what each capability's next start will fetch (its `prefetch` hook in the capability table)."""
    from ..capabilities import CAPABILITIES, resolve
    from ..identity import keys_for
    from ..store.cache import cache_for
    from ..store.core import open_store_for

    keys = keys_for(settings)
    store = open_store_for(settings)
    cache = cache_for(settings.store)
    out = Prefetched(cache_dir=str(cache.root), image_key=keys.image.digest, env_key=None)
    if settings.env.setup:
        out.env_key = keys.env.digest
    for cap in CAPABILITIES:
        if cap.prefetch:
            out.items += resolve(cap.prefetch)(settings, store, cache, keys)
    return out
