"""The restore's journal: what an extraction is about to do, written before its first change.

`<first root>/.bootseer-env.journal` lists the undo directories, every planned move aside (the path
and where it goes) and every path the extraction will create. A restore that finishes marks it
committed, removes its undo directories, then the journal. A restore that dies part way (SIGKILL,
power loss, a dead worker) leaves it behind, and the next bootseer command that touches the roots
(the env stage, `restore`, `baseline`), under the tree lock, puts the tree back from it: it removes
the planned new paths, renames the moved originals back and removes the undo directories. A
committed journal only needs its undo directories removed.

Recovery acts only on a journal whose writer is gone: the writer holds an exclusive `flock` on the
journal file itself (each version is locked before it is renamed into place) for the whole restore,
and the kernel drops it when the writer dies. Recovery takes that flock without waiting; when it is
held, the restore is live (another process, e.g. one that did not share our tree lock) and nothing
of it is touched. A writer likewise refuses to start over a live journal.

The tree may be writable by a plain user while root recovers it, so the journal is a file in the
tree, not a trusted one: it is opened no-follow, non-blocking, type-checked and size-capped
(`treefiles.py`), written under an unguessable temporary name, and what it names is only acted on
through no-follow directory descriptors from the roots (`dirfd.py`): a planted journal naming
`<root>/link/x`, with `link` a symlink out of the tree, removes nothing outside.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import BootseerError
from .dirfd import DirFds, fd_budget, remove_at, rename_at, rmtree_at
from .format import UnsafeArchive
from .manifest import JOURNAL_NAME, UNDO_PREFIX, under
from .treefiles import JOURNAL_MAX, create_temp, open_regular_at, read_fd, root_dir

# journal path -> descriptor of the journal this process is writing, flocked while its restore runs
_held: dict[str, int] = {}


class LiveJournal(BootseerError):
    """Another process's restore of this tree is in progress (its journal's flock is held)."""


def journal_path(roots: list[str]) -> Path:
    return Path(roots[0]) / JOURNAL_NAME


def _is_live(roots: list[str]) -> bool:
    """Some process holds the flock of the journal of `roots`: its restore is still running."""
    try:
        with root_dir(roots[0]) as dfd:
            fd = open_regular_at(dfd, JOURNAL_NAME)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write(roots: list[str], doc: dict[str, Any]) -> None:
    """Write the journal durably (temporary name, fsync, rename): it must exist before the first change.

    Each version is flocked before it is renamed into place, and that flock is kept until `remove`
    (or this process's end): the journal at the path is never one whose writer looks gone while it
    runs. The first write of a restore refuses (LiveJournal, before any change) when another
    process's restore holds the journal there.

    A fresh container has no root yet (the restore is what makes `/opt/venv`): the first root is
    created for the journal, and an interrupted restore leaves at most that empty directory, which
    the setup then fills as it would have."""
    path = journal_path(roots)
    path.parent.mkdir(parents=True, exist_ok=True)
    if str(path) not in _held and _is_live(roots):
        raise LiveJournal(f"another process is restoring {', '.join(roots)} (its journal {path} is live)")
    with root_dir(roots[0]) as dfd:
        tmp, fd = create_temp(dfd, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else can hold it
            os.write(fd, json.dumps(doc).encode())
            os.fsync(fd)
            os.rename(tmp, JOURNAL_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    old = _held.get(str(path))
    _held[str(path)] = fd
    if old is not None:
        os.close(old)


def _release(path: Path) -> None:
    fd = _held.pop(str(path), None)
    if fd is not None:
        os.close(fd)


def remove(roots: list[str]) -> None:
    """Remove the journal, then drop its flock (this process's restore is over)."""
    with contextlib.suppress(FileNotFoundError), root_dir(roots[0]) as dfd:
        os.unlink(JOURNAL_NAME, dir_fd=dfd)
    _release(journal_path(roots))


def _take(roots: list[str]) -> int | None:
    """The journal of `roots`, opened and flocked (its writer is gone); None when there is none.

    Raises BlockingIOError when its writer still holds it. The flock is taken before the journal is
    read, and the name is checked to still be that file (a writer renames each version in)."""
    with root_dir(roots[0]) as dfd:
        while True:
            try:
                fd = open_regular_at(dfd, JOURNAL_NAME)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                st, now = os.fstat(fd), os.stat(JOURNAL_NAME, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                return fd
            os.close(fd)  # replaced while we locked it: look again


def _read(fd: int) -> dict[str, Any]:
    try:
        doc = json.loads(read_fd(fd, JOURNAL_MAX, JOURNAL_NAME))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _strs(v: object) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def undo_paths(roots: list[str], new: list[str], moves: list[tuple[str, str]]) -> int:
    """Remove the planned new paths (deepest first), then rename the moved originals back.

    Only paths under the roots are touched, each through directory descriptors opened from a root
    without following a link (the journal is a file in the tree, not trusted further): a path through
    a symlink counts as not put back. Returns how many paths could not be put back.
    """

    def inside(p: str) -> bool:
        return under(p, roots) and p not in roots

    errors = 0
    d = DirFds(roots, fd_budget())
    try:
        for p in sorted(set(new), key=lambda q: q.count("/"), reverse=True):
            if inside(p):
                errors += not _attempt(remove_at, d, p)
        for path, dest in reversed(moves):
            if inside(path) and inside(dest) and _exists(d, dest):
                errors += not (_attempt(remove_at, d, path) and _attempt(rename_at, d, dest, path))
    finally:
        d.close()
    return errors


def _attempt(op: Callable[..., None], *args: object) -> bool:
    try:
        op(*args)
    except (OSError, UnsafeArchive):
        return False
    return True


def _exists(d: DirFds, path: str) -> bool:
    """Whether `path` is there, its directory reached without following a link."""
    parent, _, name = path.rpartition("/")
    try:
        os.stat(name, dir_fd=d.dir(parent), follow_symlinks=False)
    except (OSError, UnsafeArchive):
        return False
    return True


def recover(roots: list[str], info: Callable[[str], None]) -> None:
    """Finish what a dead restore left: undo an uncommitted journal, remove the undo directories.

    Only a journal whose writer is gone (its flock free) is acted on; a live one is left alone."""
    path = journal_path(roots)
    _release(path)  # this process's own restore that stopped part way is over: its journal is a dead one
    try:
        fd = _take(roots)
    except BlockingIOError:
        info(f"env: another process is restoring {', '.join(roots)}; its journal is live, leaving it alone")
        return
    except OSError:
        fd = None
    if fd is None:
        _sweep_undo_dirs(roots)
        return
    try:
        _recover(roots, _read(fd), info)
    finally:
        os.close(fd)


def _recover(roots: list[str], doc: dict[str, Any], info: Callable[[str], None]) -> None:
    """Undo (or finish) what the dead writer's journal `doc` says, under its flock."""
    if not doc.get("committed"):
        moves = [
            (m[0], m[1])
            for m in doc.get("moves") or []
            if isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m)
        ]
        errors = undo_paths(roots, _strs(doc.get("new")), moves)
        if errors:
            info(f"env: an interrupted restore could not be fully undone ({errors} path(s) left)")
        else:
            info("env: an interrupted restore was undone; the tree is as it was before it")
    with contextlib.suppress(OSError), root_dir(roots[0]) as dfd:
        os.unlink(JOURNAL_NAME, dir_fd=dfd)
    _sweep_undo_dirs(roots)


def _sweep_undo_dirs(roots: list[str]) -> None:
    """Remove the undo directories at the top of each root (a journal names those of its restore; any
    other is left by a restore from before the journal, and nothing can put it back): under the tree
    lock and with no live journal, no restore is using them. Each goes by descriptor: a symlink put at
    such a name is removed itself, never followed."""
    if _is_live(roots):
        return
    for root in roots:
        with contextlib.suppress(OSError), root_dir(root) as dfd:
            for name in os.listdir(dfd):
                if name.startswith(UNDO_PREFIX):
                    _remove_undo_dir(dfd, name)


def _remove_undo_dir(dfd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
            rmtree_at(dfd, name)
