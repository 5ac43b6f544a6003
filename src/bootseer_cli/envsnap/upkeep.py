"""The env capability's upkeep hooks (capability table): which env snapshots `bootseer gc` keeps, and
the snapshot `bootseer prefetch` fetches."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..upkeep import Item, Policy, Scan, aged_refs, prefetch_ref

if TYPE_CHECKING:
    from ..keys import Keys
    from ..settings import Settings
    from ..store.cache import BlobCache
    from ..store.core import Store


def gc_keep(store: Store, policy: Policy, scan: Scan) -> None:
    """Env refs unused for keep_days go; every blob a kept ref names stays, and a layer's ref names
    its whole chain (`chain`, `parent`: chain.py), so every link of a live chain stays with it even when
    the parent's own ref goes. A layer blob no ref names any more is an orphan, which gc removes. A ref
    whose build lease is live stays, however old."""
    aged_refs(store, "env", policy, scan, leased=scan.leased_env)


def prefetch(settings: Settings, store: Store, cache: BlobCache, keys: Keys) -> list[Item]:
    """The blobs `refs/env/<key>` names (a layer's: its whole chain), into the node cache."""
    from ..errors import BootseerError
    from ..upkeep import fetch_into_cache
    from .catalog import FORMAT
    from .chain import links

    if not settings.env.setup:
        return []
    item = prefetch_ref(settings, store, cache, "env", keys.env.digest)
    if item.status == "absent":
        return [item]
    try:
        ref = store.read_ref("env", keys.env.digest) or {}
        below = [link.blob for link in links(keys.env.digest, ref, FORMAT)[:-1]]
        if below:
            fetch_into_cache(settings.p2p, store, cache, below, item)
    except (BootseerError, OSError) as e:
        item.status, item.detail = "failed", str(e)
    return [item]
