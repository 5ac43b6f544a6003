"""Extracting a snapshot blob safely: the plan (checks), the apply (three strategies), the undo.

Extraction treats the blob as untrusted whatever its digest (the ref naming it comes from a store
anyone with write access can fill; a streamed restore checks the digest only at the end, before the
commit): every entry must be listed in the metadata, lie
lexically under a root (no absolute escape, no `..`), be reached from its root without following a
symlink on disk at any component, even one swapped in mid-restore (`dirfd.py`: every write is an
`*at` call in a directory descriptor opened with O_NOFOLLOW), never lie below a symlink of the same
snapshot, and be a regular file, directory, symlink or hardlink (no device nodes, fifos). Existing
paths the snapshot replaces or deletes are renamed aside first (the journal), so a failure is
undone exactly.

This module holds `extract()`, which runs the three steps in order and all or nothing: the plan
(every check before a write: `plan.py`), the apply (the frames in forked workers, threads or this
thread: `apply.py`) and the undo (moves aside, journal, rollback: `undo.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import BootseerError, IntegrityError
from . import journal
from .apply import FAULT_ENV, MODE_MASK, RestoreError, State, apply_frames, fault
from .dirfd import DirFds, fd_budget
from .format import Meta, Progress, UnsafeArchive
from .manifest import DIR
from .plan import check_space, plan
from .undo import Undo, journal_doc, plan_changes, rollback


@dataclass
class Extracted:
    """What an extraction wrote: the restore reports these counts."""

    files: int
    raw_bytes: int
    backup_note: str = ""


def _finish(st: State) -> None:
    """Hardlinks (their targets may have been in any frame), the completeness check, directory modes.

    Through descriptors opened afresh from the roots, never following a link (`dirfd.py`): a
    directory swapped for a symlink since the workers wrote into it fails the restore (undone)
    here, and `fchmod`/`futimens` act on the directory opened, never on where a name now points."""
    d = DirFds(st.plan.roots, fd_budget(), on_made=st.made_dirs.append)
    try:
        for path, target, _mtime in st.hardlinks:
            tparent, _, tname = target.rpartition("/")
            tfd = os.dup(d.dir(tparent))  # held across the next `dir`, which may evict it
            try:
                parent, _, name = path.rpartition("/")
                os.link(tname, name, src_dir_fd=tfd, dst_dir_fd=d.dir(parent, create=True), follow_symlinks=False)
            finally:
                os.close(tfd)
            st.created.append(path)
        missing = [q for q in st.plan.entries if q not in st.seen]
        if missing:
            raise IntegrityError(f"snapshot lacks {len(missing)} listed entries (e.g. {missing[0]})")
        dirs = sorted((p for p, e in st.plan.entries.items() if e.kind == DIR), reverse=True)
        for path in dirs:  # children first: a parent may turn 0o555
            e = st.plan.entries[path]
            fd = d.dir(path)
            os.fchmod(fd, e.mode & MODE_MASK)
            os.utime(fd, (e.mtime, e.mtime))
    finally:
        d.close()


def _after_rollback(e: BaseException, note: str) -> BaseException:
    """The error to raise once the tree is put back: archive faults keep their type, anything else
    a malformed blob can provoke (ValueError, RecursionError, zstd's errors …) is an IntegrityError."""
    if isinstance(e, (IntegrityError, UnsafeArchive)):
        return type(e)(f"{e} ({note})")
    if isinstance(e, BootseerError):
        return RestoreError(f"{e} ({note})", undone=True)
    if isinstance(e, OSError):
        return RestoreError(f"restore failed: {e} ({note})", undone=True)
    if isinstance(e, Exception):
        return IntegrityError(f"unusable snapshot ({type(e).__name__}: {e}) ({note})")
    return e


def extract(
    blob: Path | int,
    meta: Meta,
    roots: list[str],
    threads: int | None = None,
    progress: Progress | None = None,
    verify: Callable[[], None] | None = None,
    start_verify: Callable[[], None] | None = None,
    arriving: bool = False,
) -> Extracted:
    """Apply a snapshot blob (a path or an open descriptor) under `roots`: deletions, then the
    members, all or nothing.

    `verify` is called once everything is written, before the journal is committed: a restore that
    hashes the blob while it is extracted (started by `start_verify` once the workers run) raises
    there when the digest does not match, and the tree is undone like after any other failure. The
    path checks never depend on it. `arriving`: the blob (a descriptor) is still being downloaded
    into its file, in order; each frame is waited for.

    Raises UnsafeArchive/IntegrityError/NoSpace (nothing written, or undone) or RestoreError. The
    journal (see journal.py) is written before the first change and removed once done or undone;
    the caller holds the tree lock.
    """
    p = plan(meta, roots)
    check_space(p)
    st = State(p, on_workers=start_verify, arriving=arriving)
    planned_fault = os.environ.get(FAULT_ENV, "")
    if planned_fault.startswith("member:") and planned_fault[7:].isdigit():
        st.member_fault = int(planned_fault[7:])
    st.umask = os.umask(0o022)
    os.umask(st.umask)
    undo = Undo(p.roots)
    plan_changes(st, undo)
    journal.write(p.roots, journal_doc(st, undo))
    fault("journal")
    try:
        undo.carry_out()
        apply_frames(st, blob, threads, progress)
        _finish(st)
        if verify is not None:
            verify()
    except BaseException as e:
        note = rollback(st, undo)
        if not note.startswith("undo incomplete"):
            journal.remove(p.roots)
        err = _after_rollback(e, note)
        if err is e:
            raise
        raise err from None
    if undo.planned:
        # What was moved aside goes for good next: a crash from here on must keep the new tree. With
        # nothing moved aside (a first restore) there is nothing to drop, and a crash before the journal
        # is gone just removes a whole tree that the next start restores again: no commit (a json
        # write and an fsync that waited for the journal to hold ~20k new inodes: ~15 ms).
        journal.write(p.roots, journal_doc(st, undo, committed=True))
    fault("committed")
    undo.discard()
    journal.remove(p.roots)
    return Extracted(p.files, p.raw_bytes)
