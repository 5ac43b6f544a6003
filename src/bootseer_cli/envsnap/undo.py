"""The undo of an extraction: what it moves aside before a change, and putting the tree back.

Existing paths the snapshot replaces or deletes are renamed aside first, after the moves and the
paths it will create are written to the journal (`journal.py`), so a failure, or a process killed
half way, is undone exactly. The tree may be writable by a user while root restores into it, so
every rename and removal here is an `*at` call on one name in a directory descriptor opened from
the root without following a link (`dirfd.py`), never a call by path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import sys
from typing import Any

from ..errors import interrupts_deferred
from .apply import State
from .dirfd import DirFds, NotADir, fd_budget, remove_at, rename_at
from .format import UnsafeArchive
from .manifest import DIR, UNDO_PREFIX, below_any, under


class Undo:
    """Renames paths aside before they are replaced or deleted, so a failure can put them back.

    The moves are planned first (`plan_move`), written to the journal with their destinations, and
    only then carried out: a process killed half way leaves a journal that says where everything is.
    A directory swapped for a symlink fails the move instead of moving through it.
    """

    def __init__(self, roots: list[str]) -> None:
        self.roots = roots
        self.tag = os.urandom(5).hex()  # 10 hex digits, as uuid4's first ten (without importing uuid)
        self.dirs: dict[str, str] = {r: os.path.join(r, f"{UNDO_PREFIX}{self.tag}") for r in roots}
        self.planned: list[tuple[str, str]] = []
        self.moved: list[tuple[str, str]] = []

    def plan_move(self, path: str) -> None:
        """Plan moving `path` into the undo directory of its root (nothing moves before the journal is written)."""
        root = max((r for r in self.roots if under(path, [r])), key=len)
        self.planned.append((path, os.path.join(self.dirs[root], str(len(self.planned)))))

    def carry_out(self) -> None:
        """Move the planned paths aside, each from its directory reached without following a link."""
        if not self.planned:
            return
        d = DirFds(self.roots, fd_budget())
        try:
            for path, dest in self.planned:
                undo_dir = os.path.dirname(dest)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.basename(undo_dir), 0o700, dir_fd=d.dir(os.path.dirname(undo_dir)))
                rename_at(d, path, dest)
                self.moved.append((path, dest))
        finally:
            d.close()

    def restore(self) -> None:
        """Put what was moved aside back, newest first, then remove the undo directories."""
        d = DirFds(self.roots, fd_budget())
        failed: list[BaseException] = []
        try:
            for path, dest in reversed(self.moved):
                try:
                    rename_at(d, dest, path)
                except (OSError, UnsafeArchive) as e:  # the others still go back; the journal keeps this one
                    failed.append(e)
        finally:
            d.close()
        if failed:
            raise failed[0]
        self.moved.clear()
        self.discard()

    def discard(self) -> None:
        """Remove the undo directories (after a commit: what they hold is replaced for good). shutil's
        rmtree walks by descriptor and refuses a symlink at the top: nothing outside is removed."""
        for d in self.dirs.values():
            shutil.rmtree(d, ignore_errors=True)


def plan_changes(st: State, undo: Undo) -> None:
    """What the extraction will move aside (what the snapshot deletes or replaces) and what it will
    create (entries and parents that do not exist, or lie below something moved), before any change.

    A path whose parent is known to be absent is absent too: into a fresh tree this costs one
    `lstat` per directory level that exists, not one per entry."""
    moved: set[str] = set()
    for path in st.plan.deletions:
        if os.path.lexists(path) and not (moved and below_any(path, moved)):
            undo.plan_move(path)
            moved.add(path)
    absent: set[str] = set()
    tops: list[str] = []  # the absent entries whose parent is not an absent entry
    for path, e in st.plan.entries.items():
        if path.rpartition("/")[0] in absent:
            absent.add(path)
            continue
        if moved and below_any(path, moved):
            continue
        try:
            cur = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            absent.add(path)
            tops.append(path)
            continue
        if e.kind == DIR and stat.S_ISDIR(cur.st_mode):
            continue
        undo.plan_move(path)
        moved.add(path)
    kept: set[str] = set(st.plan.roots)
    if not moved and absent.isdisjoint(kept):
        # Nothing replaced and every root there (a first restore, or one that only adds): every absent
        # entry is new, and so is each missing directory above one, up to the first that exists. Only
        # the `tops` need that walk up: the walk over every entry cost ~25 ms of a 21k-entry restore's
        # start, and finding the maximal new paths for the journal among them another ~10 ms.
        st.new |= absent
        highest: dict[str, None] = {}
        for path in tops:
            top, p = path, path.rpartition("/")[0] or "/"
            while p not in kept and p not in st.new:
                if os.path.lexists(p):
                    kept.add(p)
                    break
                st.new.add(p)
                top, p = p, p.rpartition("/")[0] or "/"
            if p in kept:  # `top`'s parent exists: `top` is a maximal new path
                highest[top] = None
        st.new_tops = list(highest)
        return
    for path in st.plan.entries:
        p = path
        while p not in kept and p not in st.new:
            if p not in absent and p not in moved and not (moved and below_any(p, moved)) and os.path.lexists(p):
                kept.add(p)
                break
            if p not in moved:
                st.new.add(p)
            p = p.rpartition("/")[0] or "/"  # `dirname` of a normal absolute path, at a third of its cost


def rollback(st: State, undo: Undo) -> str:
    """Remove what the extraction created (a dead worker's paths too: the planned new paths, and
    whatever now stands where an original was moved aside), put back what it moved aside. Returns what
    was done.

    Ctrl-C is held off meanwhile (`interrupts_deferred`): the tree is never left half put back. After
    an interrupt the user is told at once why the exit takes a moment, and the forked workers, which
    may still be writing, are stopped first.

    A directory swapped for a symlink is counted as not put back (the journal stays for the next
    start's recovery), never removed through."""
    with interrupts_deferred():
        cause = sys.exc_info()[1]
        if cause is not None and not isinstance(cause, Exception):  # Ctrl-C (KeyboardInterrupt), SystemExit
            if isinstance(cause, KeyboardInterrupt):
                print("bootseer: interrupted: putting the tree back…", file=sys.stderr, flush=True)
            _stop_forked_workers()
        return _rollback(st, undo)


def _rollback(st: State, undo: Undo) -> str:
    st.abort.set()
    errors = 0
    made = set(st.created) | set(st.made_dirs)
    replaced = {path for path, _ in undo.moved}  # the original is aside: what is there now is ours
    d = DirFds(st.plan.roots, fd_budget())
    try:
        gone = made | replaced | (st.new - set(st.plan.roots))
        for q in sorted(gone, key=lambda q: q.count("/"), reverse=True):
            try:
                remove_at(d, q)
            except NotADir:  # below a symlink: only planned, never written through (else: out of reach)
                errors += q in made
            except (OSError, UnsafeArchive):
                errors += 1
    finally:
        d.close()
    try:
        undo.restore()
    except (OSError, UnsafeArchive):
        errors += 1
    if errors:
        return f"undo incomplete: {errors} path(s) could not be put back"
    return "the tree was put back as it was"


def _stop_forked_workers() -> None:
    """Kill and reap this process's forked restore workers (children running our own command line,
    never exec'd), which an interrupt of the parent leaves writing: the undo must not race them."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/cmdline", "rb") as f:
            mine = f.read()
        names = os.listdir("/proc")
    except OSError:  # no procfs: the workers got the same Ctrl-C (one process group) and stop on their own
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rpartition(b")")[2].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() != mine:
                    continue
        except (OSError, ValueError, IndexError):
            continue
        with contextlib.suppress(OSError):
            os.kill(int(name), signal.SIGKILL)
            os.waitpid(int(name), 0)


def journal_doc(st: State, undo: Undo, committed: bool = False) -> dict[str, Any]:
    """The journal's record of this extraction: what `journal.recover` needs to put a killed restore back.

    A committed journal only has its undo directories removed: it leaves out the moves and the new
    paths (tens of thousands of them, written and fsynced again on the commit's critical path)."""
    doc: dict[str, Any] = {"v": 1, "committed": committed, "undo_dirs": sorted(undo.dirs.values())}
    if not committed:
        doc["moves"] = [list(m) for m in undo.planned]
        # only the new paths whose parent is not new: recovery removes a new directory whole
        # (`journal.undo_paths`), and below one everything is new (the plan's walk up stops at the
        # first path that exists). A first restore of the torch venv listed 21,759 paths (a 2 MB
        # journal written and fsynced before the first change); it lists the root's new children.
        new = st.new
        tops = st.new_tops if st.new_tops is not None else (p for p in new if p.rpartition("/")[0] not in new)
        doc["new"] = sorted(tops)
    return doc
