"""Chains of layers: what a layer's ref says about the snapshots it builds on, checked before use.

A layer's ref (publish.py) carries `chain`: every link below it, base first, each as
`{"key", "blob", "size", "bytes", "entries", "files"}`, and `depth` (how many links are layers over
the base: `len(chain)`). The whole chain is in the child's own signed ref, so a restore trusts nothing
but that signature and the blobs' digests: a parent's ref replaced since (squashed, removed by gc) does
not break its children, and `bootseer gc` keeps every link's blob as long as the child's ref lives
(`upkeep.digests_in` finds them in the ref).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..digests import is_digest
from ..errors import IntegrityError
from .stamp import stamped_blob
from .tree import EnvTree

MAX_CHAIN = 64  # links a ref may list, whatever it says: bounds the work a forged-but-signed ref can cause


@dataclass(frozen=True)
class Link:
    """One snapshot of a chain: its env key, its blob, and the counts that bound its restore."""

    key: str
    blob: str
    size: int | None
    ref: dict[str, Any]  # the fields a single-blob restore reads ("blob", "size", "bytes", "entries", "format")

    def doc(self) -> dict[str, Any]:
        """As listed in a child's `chain`."""
        out: dict[str, Any] = {"key": self.key, "blob": self.blob}
        for k in ("size", "bytes", "entries", "files", "deletions"):
            if isinstance(self.ref.get(k), int):
                out[k] = self.ref[k]
        return out


def link_of(key: str, ref: dict[str, Any]) -> Link:
    """The link of a snapshot whose ref is `ref` (a single-blob ref, or the top of a layer's)."""
    blob = ref.get("blob")
    if not is_digest(key) or not is_digest(blob):
        raise IntegrityError(f"ref env/{key[:16]} names no valid blob")
    size = ref.get("size") if isinstance(ref.get("size"), int) else None
    return Link(key, str(blob), size, ref)


def links(env_key: str, ref: dict[str, Any], fmt: int) -> list[Link]:
    """The links to apply for `ref`, base first and `ref` itself last (one link for a full snapshot).

    IntegrityError for a malformed chain (not a list, a link without a valid key or blob, too long)."""
    raw = ref.get("chain")
    if raw is None:
        return [link_of(env_key, ref)]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_CHAIN:
        raise IntegrityError(f"ref env/{env_key[:16]} has a malformed chain")
    out = []
    for d in raw:
        if not isinstance(d, dict):
            raise IntegrityError(f"ref env/{env_key[:16]} has a malformed chain")
        out.append(link_of(str(d.get("key")), {**d, "format": fmt}))
    return [*out, link_of(env_key, ref)]


def chain_of(parent_key: str, parent_ref: dict[str, Any], fmt: int) -> list[dict[str, Any]]:
    """The `chain` of a layer built over `parent_ref`: the parent's own chain, then the parent."""
    return [link.doc() for link in links(parent_key, parent_ref, fmt)]


def present_prefix(tree: EnvTree, chain: list[Link]) -> int:
    """How many links of `chain` this tree already carries intact: the stamp names the key of link
    i-1 with its blob (a restore killed between two links, or a node that holds the parent env)."""
    for i in range(len(chain), 0, -1):
        if stamped_blob(tree, chain[i - 1].key) == chain[i - 1].blob:
            return i
    return 0


def layer_sizes(env_key: str, ref: dict[str, Any]) -> list[dict[str, Any]]:
    """For `bootseer env show`: each link of the ref's chain (base first, the ref itself last) with its
    own compressed size and the cumulative size of the chain up to it (what a node without any of it fetches)."""
    chain = ref.get("chain")
    raw = chain if isinstance(chain, list) else []
    rows = [d for d in raw if isinstance(d, dict)] + [
        {"key": env_key, "blob": ref.get("blob"), "size": ref.get("size")}
    ]
    out, total = [], 0
    for i, d in enumerate(rows):
        own = d.get("size") if isinstance(d.get("size"), int) else 0
        total += own
        out.append({"layer": i, "key": str(d.get("key")), "blob": str(d.get("blob")), "size": own, "cumulative": total})
    return out
