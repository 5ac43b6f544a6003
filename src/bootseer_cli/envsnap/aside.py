"""The env a tree carries, kept until the setup that replaces it has succeeded.

A setup on a tree that carries another env (a changed config, a new requirement) used to drop the
stamp and remove that env's files before it ran. When the setup then failed (a typo, "command not
found", an index down), the good env was gone: its packages stripped, its stamp deleted, so the next
start with the old config restored it again (938 MB) instead of finding it in place.

Now the previous env is set aside, not thrown away (`set_aside`): its stamp and paths file are read
and kept in memory, and the paths `strip_carried` would have removed are renamed into an undo
directory at the top of their root (one `rename` each, no copy; the scan skips those names). The
moves are journaled first (journal.py), so a start killed during the setup puts them back at the next
start, as an interrupted restore is put back. Then:

- the setup succeeds (`Previous.done`): the journal goes, the undo directory is removed, and the
  previous env's paths file with it (the new stamp is written after the capture, as before);
- the setup fails (`Previous.failed`): what was moved aside is renamed back, and the tree is compared
  with the baseline taken just before the setup. Unchanged: the stamp and paths file are written back
  as they were, so the next start with the old config finds its env present (no restore, no setup).
  Changed: the paths file is written back (its rows still tell bootseer's files from a user's), not
  the stamp, and a warning names what the failed setup changed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from .manifest import CARRIED_NAME, STAMP_NAME, Diff, Manifest, diff, scan, under
from .tree import EnvTree
from .treefiles import STAMP_MAX

if TYPE_CHECKING:
    from .undo import Undo

Say = Callable[[str], None]


@dataclass
class Previous:
    """What the tree carried before a setup: the stamp's bytes, the carried document (the tree's, as read
    once: written back from it, not from a second read of the file), the paths moved aside."""

    tree: EnvTree
    stamp: bytes | None
    carried: dict[str, Any] | None
    undo: Undo | None
    stripped: bool

    def done(self) -> None:
        """The setup succeeded: what was moved aside goes for good (the journal first: a start killed
        while the undo directory is removed leaves one that `journal.recover` sweeps)."""
        from . import journal

        if self.undo is not None:
            journal.remove(self.tree.roots)
            self.undo.discard()
        if self.stripped:
            self.tree.unlink_own(CARRIED_NAME)

    def failed(self, baseline: Manifest | None, exclude: list[str], info: Say, warn: Say) -> None:
        """The setup failed: put the previous env back, and its stamp too if the setup changed nothing
        (`baseline` None: it never ran, the tree is only put back)."""
        from . import journal

        roots = self.tree.roots
        d = diff(baseline, scan(roots, exclude)) if baseline is not None else Diff()
        back = 0
        if self.undo is not None:
            moved = list(self.undo.moved)
            missed = journal.undo_paths(roots, [], moved)
            back = len(moved) - missed
            self.undo.discard()
            journal.remove(roots)
            # what the setup wrote where the previous env's paths were is replaced by them again
            tops = [p for p, _ in moved]
            d.changed = [p for p in d.changed if not under(p, tops)]
        changed = d.changed + d.deleted
        with contextlib.suppress(OSError):
            if self.carried is not None:
                self.tree.write_own(CARRIED_NAME, json.dumps(self.carried, check_circular=False).encode())
                self.tree.keep_carried(self.carried)
            if self.stamp is not None and not changed:
                self.tree.write_own(STAMP_NAME, self.stamp)
        put = f"; {back} path(s) of the previous env put back" if back else ""
        if not changed:
            if self.stamp is not None:
                info(f"env: the setup failed and changed nothing under the roots: the tree still carries its env{put}")
            return
        shown = ", ".join(changed[:8]) + (" …" if len(changed) > 8 else "")
        warn(
            f"env: the failed setup changed {len(changed)} path(s) under the roots{put}; the tree no longer "
            f"counts as its previous env (the next start restores or sets up again): {shown}"
        )


def set_aside(tree: EnvTree, info: Say, strip: bool) -> Previous:
    """Before a setup: keep the stamp and paths file, drop the stamp (the tree is about to change) and,
    with `strip`, move what the carried env added and nobody changed since into an undo directory.

    A move that cannot be made (another filesystem mounted inside a root) puts back what moved and
    removes those paths as before (`strip_carried`)."""
    from .stamp import remove_stamp, strip_carried

    stamp = _read(tree, STAMP_NAME, STAMP_MAX)
    carried = tree.carried()
    remove_stamp(tree)
    prev = Previous(tree, stamp, carried, None, stripped=strip)
    if not strip or carried is None:
        return prev
    try:
        prev.undo = _move_aside(tree, info)
    except (OSError, BootseerError) as e:
        info(f"env: the previous env could not be set aside ({e}); removing its paths")
        strip_carried(tree, info)
    return prev


def _move_aside(tree: EnvTree, info: Say) -> Undo | None:
    """Rename the carried env's removable paths (the top-most of each subtree) aside, journaled first."""
    from . import journal
    from .format import UnsafeArchive
    from .stamp import removable, say_removal
    from .undo import Undo

    doc = tree.carried()
    if doc is None:
        return None
    roots = tree.roots
    gone = removable(tree, doc)
    say_removal(info, gone, "the tree carries another env (set aside until the setup succeeds)")
    chosen = set(gone.paths)
    tops = [p for p in gone.paths if not _below_any(p, chosen)]  # a directory moves with what it holds
    if not tops:
        return None
    undo = Undo(roots)
    for p in tops:
        undo.plan_move(p)
    doc_j = {"v": 1, "committed": False, "undo_dirs": sorted(undo.dirs.values()), "new": []}
    journal.write(roots, {**doc_j, "moves": [list(m) for m in undo.planned]})
    try:
        undo.carry_out()
    except (OSError, UnsafeArchive) as e:
        journal.undo_paths(roots, [], list(undo.moved))
        undo.discard()
        journal.remove(roots)
        raise BootseerError(str(e)) from None
    return undo


def _below_any(path: str, dirs: set[str]) -> bool:
    parent = path.rpartition("/")[0]
    while parent:
        if parent in dirs:
            return True
        parent = parent.rpartition("/")[0]
    return False


def _read(tree: EnvTree, name: str, cap: int) -> bytes | None:
    try:
        return tree.read_own(name, cap)
    except (OSError, ValueError):
        return None
