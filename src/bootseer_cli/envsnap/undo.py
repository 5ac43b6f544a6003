"""The undo of an extraction: what it moves aside before a change, and putting the tree back.

Existing paths the snapshot replaces or deletes are renamed aside first, after the moves and the
paths it will create are written to the journal (`journal.py`), so a failure, or a process killed
half way, is undone exactly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from typing import Any

from . import journal
from .apply import State
from .format import UnsafeArchive
from .manifest import DIR, UNDO_PREFIX, under


class Undo:
    """Renames paths aside before they are replaced or deleted, so a failure can put them back.

    The moves are planned first (`plan_moves`), written to the journal with their destinations, and
    only then carried out: a process killed half way leaves a journal that says where everything is.
    """

    def __init__(self, roots: list[str]) -> None:
        self.roots = roots
        self.tag = uuid.uuid4().hex[:10]
        self.dirs: dict[str, str] = {r: os.path.join(r, f"{UNDO_PREFIX}{self.tag}") for r in roots}
        self.planned: list[tuple[str, str]] = []
        self.moved: list[tuple[str, str]] = []

    def plan_move(self, path: str) -> None:
        """Plan moving `path` into the undo directory of its root (nothing moves before the journal is written)."""
        root = max((r for r in self.roots if under(path, [r])), key=len)
        self.planned.append((path, os.path.join(self.dirs[root], str(len(self.planned)))))

    def carry_out(self, real_roots: list[str]) -> None:
        """Move the planned paths aside, each only if its directory still resolves inside the roots."""
        for path, dest in self.planned:
            check_real_parent(path, real_roots)
            d = os.path.dirname(dest)
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
            os.rename(path, dest)
            self.moved.append((path, dest))

    def restore(self) -> None:
        """Put what was moved aside back, newest first, then remove the undo directories."""
        for path, dest in reversed(self.moved):
            os.rename(dest, path)
        self.moved.clear()
        self.discard()

    def discard(self) -> None:
        """Remove the undo directories (after a commit: what they hold is replaced for good)."""
        for d in self.dirs.values():
            shutil.rmtree(d, ignore_errors=True)


def check_real_parent(path: str, real_roots: list[str]) -> None:
    """Refuse to move or link `path` when its directory resolves outside the roots (through a symlink on disk)."""
    real = os.path.realpath(os.path.dirname(path))
    if not under(real, real_roots):
        raise UnsafeArchive(f"{path}: its directory resolves to {real}, outside the roots")


def _below(path: str, tops: set[str]) -> bool:
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        if parent in tops:
            return True
        parent = os.path.dirname(parent)
    return False


def plan_changes(st: State, undo: Undo) -> None:
    """What the extraction will move aside (what the snapshot deletes or replaces) and what it will
    create (entries and parents that do not exist, or lie below something moved), before any change.

    A path whose parent is known to be absent is absent too: into a fresh tree this costs one
    `lstat` per directory level that exists, not one per entry."""
    moved: set[str] = set()
    for path in st.plan.deletions:
        if os.path.lexists(path) and not (moved and _below(path, moved)):
            undo.plan_move(path)
            moved.add(path)
    absent: set[str] = set()
    for path, e in st.plan.entries.items():
        if path.rpartition("/")[0] in absent:
            absent.add(path)
            continue
        if moved and _below(path, moved):
            continue
        try:
            cur = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            absent.add(path)
            continue
        if e.kind == DIR and stat.S_ISDIR(cur.st_mode):
            continue
        undo.plan_move(path)
        moved.add(path)
    kept: set[str] = set(st.plan.roots)
    for path in st.plan.entries:
        p = path
        while p not in kept and p not in st.new:
            if p not in absent and p not in moved and not (moved and _below(p, moved)) and os.path.lexists(p):
                kept.add(p)
                break
            if p not in moved:
                st.new.add(p)
            p = os.path.dirname(p)


def rollback(st: State, undo: Undo) -> str:
    """Remove what the extraction created (a dead worker's paths too: the planned new paths), put
    back what it moved aside. Returns what was done."""
    st.abort.set()
    errors = 0
    created = sorted(set(st.created) | set(st.made_dirs), key=lambda q: q.count("/"), reverse=True)
    for q in created:
        try:
            if os.path.isdir(q) and not os.path.islink(q):
                os.rmdir(q)
            else:
                os.unlink(q)
        except FileNotFoundError:
            pass
        except OSError:
            errors += 1
    errors += journal.undo_paths(st.plan.roots, sorted(st.new), [])
    try:
        undo.restore()
    except OSError:
        errors += 1
    if errors:
        return f"undo incomplete: {errors} path(s) could not be put back"
    return "the tree was put back as it was"


def journal_doc(st: State, undo: Undo, committed: bool = False) -> dict[str, Any]:
    """The journal's record of this extraction: what `journal.recover` needs to put a killed restore back."""
    return {
        "v": 1,
        "committed": committed,
        "undo_dirs": sorted(undo.dirs.values()),
        "moves": [list(m) for m in undo.planned],
        "new": sorted(st.new),
    }
