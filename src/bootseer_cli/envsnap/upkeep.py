"""The env capability's upkeep hooks (capability table): which env snapshots `bootseer gc` keeps, and
the snapshot `bootseer prefetch` fetches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..upkeep import Item, Policy, Scan, aged_refs, prefetch_ref

if TYPE_CHECKING:
    from ..cache import BlobCache
    from ..keys import Keys
    from ..settings import Settings
    from ..store import Store


def gc_keep(store: Store, policy: Policy, scan: Scan) -> None:
    aged_refs(store, "env", policy, scan)


def prefetch(settings: Settings, store: Store, cache: BlobCache, keys: Keys) -> list[Item]:
    """The blob `refs/env/<key>` names, into the node cache."""
    if not settings.env.setup:
        return []
    return [prefetch_ref(settings, store, cache, "env", keys.env.digest)]
