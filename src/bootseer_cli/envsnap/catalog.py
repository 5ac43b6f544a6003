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
    """Every snapshot's ref, with its `env_key`, newest first; a ref that does not verify (trust.py) as
    `{"env_key": …, "unverified": why}` after them, with none of its fields: a start would not use it,
    and what it says (its size, its files) is not to be believed."""
    rows, refused, whys = [], [], []

    def tell(_store: object, _rel: str, _domain: str, why: str) -> None:
        whys.append(why)

    for key in store.list_refs(REF_KIND):
        whys.clear()
        ref = store.get_doc(store.ref_path(REF_KIND, key), tell=tell)
        if ref is not None:
            rows.append({"env_key": key, **ref})
        elif whys:
            refused.append({"env_key": key, "unverified": whys[0]})
    rows.sort(key=lambda r: -float(r.get("created") or 0))
    return rows + refused


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


def shown(store: Store, env_key: str) -> dict[str, Any]:
    """The ref of `env_key` for `env show`: a clear error when it does not verify (trust.py) or vanished,
    rather than an empty ref (a listing of nothing reads like a snapshot of nothing)."""
    whys: list[str] = []
    ref = store.get_doc(store.ref_path(REF_KIND, env_key), tell=lambda _s, _r, _d, why: whys.append(why))
    if ref is None:
        why = f"unverified: {whys[0]} (bootseer trust sign)" if whys else "removed since it was listed"
        raise BootseerError(f"env {env_key[:16]}: {why}")
    return ref


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
