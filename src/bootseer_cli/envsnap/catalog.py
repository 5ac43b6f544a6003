"""Finding env snapshots in the store: listing, matching a key prefix, removal.

Layout in the store::

    refs/env/<env_key>.json     written last by publish: a snapshot exists once its ref does
    blobs/sha256/…/<digest>     the blob the ref names; two env keys may name one blob

Blobs are content-addressed, so removing a snapshot removes its ref and deletes the blob only when
no other ref still names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..store.core import Store

REF_KIND = "env"  # refs/env/<env_key>.json
FORMAT = 1  # the ref's "format": a restore refuses a ref of any other


def list_snapshots(store: Store) -> list[dict[str, Any]]:
    """Every snapshot's ref, with its `env_key`, newest first."""
    rows = []
    for key in store.list_refs(REF_KIND):
        ref = store.read_ref(REF_KIND, key) or {}
        rows.append({"env_key": key, **ref})
    rows.sort(key=lambda r: -float(r.get("created") or 0))
    return rows


def match_key(store: Store, prefix: str) -> str:
    """The one env key starting with `prefix` (a clear error when none or several do)."""
    keys = [k for k in store.list_refs(REF_KIND) if k.startswith(prefix)]
    if not keys:
        raise BootseerError(f"no env snapshot with a key starting {prefix!r} (see `bootseer env ls`)")
    if len(keys) > 1:
        raise BootseerError(f"{prefix!r} names {len(keys)} snapshots; give more of the key")
    return keys[0]


def read(store: Store, env_key: str) -> dict[str, Any]:
    """The ref of `env_key` ({} when it vanished since it was listed)."""
    return store.read_ref(REF_KIND, env_key) or {}


def remove(store: Store, env_key: str) -> bool:
    """Remove the ref of `env_key`, then its blob unless another ref names it. True if the blob went."""
    from ..upkeep import digests_in

    ref = read(store, env_key)
    store.delete_ref(REF_KIND, env_key)
    blob = ref.get("blob")
    # a layer's ref names its whole chain: a parent's blob stays while a child names it
    still = any(blob in set(digests_in(read(store, k))) for k in store.list_refs(REF_KIND))
    if isinstance(blob, str) and not still:
        store.delete_blob(blob)
        return True
    return False
