"""Layered builds: on an env-key miss, set up over the nearest published snapshot and capture only the
difference against it.

`setup_over` picks the parent (parent.py), puts it in the tree (already there when this node carries
it; else the chain is restored: restore.py), takes the baseline of that tree, and runs the setup over
it, so pip finds most requirements satisfied. The capture (capture.py) of that baseline's difference
holds only what the setup changed, deletions included (the old version's files of a bumped package).
`ref_fields` says what the ref records so that a later build can compare (the setup inputs, image,
machine) and a restore can find the chain (`parent`, `chain`, `depth`: chain.py).

Any failure to put the parent in place (a blob missing from the store, corrupt, a link that does not
verify) is a miss like any other: the caller sets up from the image (`setup.fresh_setup`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .catalog import FORMAT
from .parent import Choice, choose, setup_inputs

if TYPE_CHECKING:
    from ..keys import Keys
    from ..settings import Settings
    from ..store.cache import BlobCache
    from ..store.core import Store
    from .setup import SetupRun
    from .stamp import Carried
    from .tree import EnvTree

Say = Callable[[str], None]


@dataclass(frozen=True)
class Over:
    """A setup run over a parent env: which parent, why, and what the parent env put in the tree."""

    choice: Choice
    chain: list[dict[str, Any]]  # the new layer's chain: the parent's own links, then the parent
    carried: dict[str, Any]  # the parent's carried doc (stamp.py), to merge the new stamp with

    @property
    def depth(self) -> int:
        return len(self.chain)

    def merged(self, entries: list[Any], deletions: list[str]) -> Carried:
        from .stamp import merged_carried

        return merged_carried(self.carried, entries, deletions)


def ref_fields(settings: Settings, keys: Keys, roots: list[str], over: Over | None) -> dict[str, Any]:
    """The ref's fields beyond the blob's counts: what a later build compares, and a layer's chain."""
    doc = keys.env.doc
    out: dict[str, Any] = {
        "image": doc.get("image"),
        "machine": doc.get("machine"),
        "inputs": setup_inputs(settings.env),
        "depth": 0,
    }
    if over is not None:
        c = over.choice
        out.update(
            parent={"key": c.key, "blob": c.ref["blob"], "why": c.why()},
            chain=over.chain,
            depth=over.depth,
        )
    return out


def setup_over(
    settings: Settings,
    store: Store,
    cache: BlobCache,
    keys: Keys,
    tree: EnvTree,
    info: Say,
    warn: Say,
    on_start: Callable[[], None] | None = None,
) -> tuple[SetupRun, Over] | None:
    """Run the setup over the nearest published snapshot; None (nothing run) when there is none, or
    when it cannot be put in the tree (then the caller sets up from the image). The caller holds the
    tree lock and the build lease."""
    from .aside import set_aside
    from .chain import chain_of
    from .restore import restore
    from .setup import guarded_setup
    from .stamp import remove_stamp, stamped_blob, strip_carried

    env = settings.env
    try:
        choice = choose(store, keys, tree.roots, setup_inputs(env), env.max_layers, FORMAT, env.parent_search_s, warn)
    except Exception as e:  # listing the store failed: build from the image
        warn(f"env: no parent looked for ({e}); setting up from the image")
        return None
    if choice is None:
        return None
    blob = str(choice.ref["blob"])
    try:
        chain = chain_of(choice.key, choice.ref, FORMAT)
        if stamped_blob(tree, choice.key) != blob:
            remove_stamp(tree)
            strip_carried(tree, info)
            restore(settings.p2p, store, cache, choice.key, tree, ref=choice.ref)
    except Exception as e:  # a missing, corrupt or unverifiable link: a miss, the setup runs from the image
        warn(f"env: parent {choice.key[:12]} could not be restored ({e}); setting up from the image")
        return None
    carried = tree.carried()
    if carried is None or carried.get("blob") != blob:
        warn(f"env: parent {choice.key[:12]} is not what the tree carries; setting up from the image")
        return None
    info(f"env: setting up over {choice.key[:12]} (layer {len(chain)}): {choice.why()}")
    # the tree is about to change: the stamp is set aside (back if the setup fails and changed nothing);
    # the paths file stays (the merged stamp needs it)
    prev = set_aside(tree, info, strip=False)
    return guarded_setup(env, settings.store, prev, info, warn, on_start), Over(choice, chain, carried)
