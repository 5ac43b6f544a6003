"""The image capability's upkeep hooks (capability table): which hot-block records `bootseer gc` keeps,
the record `bootseer prefetch` fetches, and whether the roots keep pages (`bootseer doctor`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..upkeep import Check, Item, Policy, Scan, aged_refs, prefetch_ref

if TYPE_CHECKING:
    from ..keys import Keys
    from ..settings import Settings
    from ..store.cache import BlobCache
    from ..store.core import Store


def gc_keep(store: Store, policy: Policy, scan: Scan) -> None:
    aged_refs(store, "hot", policy, scan)


def prefetch(settings: Settings, store: Store, cache: BlobCache, keys: Keys) -> list[Item]:
    """The blob `refs/hot/<key>` names, into the node cache."""
    return [prefetch_ref(settings, store, cache, "hot", keys.image.digest)]


def doctor(settings: Settings) -> list[Check]:
    """One line per image root: does its filesystem keep a file's pages across opens (hotblocks/probe.py)?"""
    from .probe import probe_roots
    from .roots import resolve_roots

    out = []
    for p in probe_roots(resolve_roots(settings.image)):
        if p.keeps:
            out.append(Check("image root", "ok", p.line()))
        elif p.drops:
            fix = 'replay is skipped here; set [image] replay = "always" if the loader keeps its own cache'
            out.append(Check("image root", "warn", p.line(), fix))
        else:
            out.append(Check("image root", "warn", p.line(), "check that the root is readable"))
    return out
