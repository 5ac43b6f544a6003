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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import BootseerError
from .manifest import JOURNAL_NAME, UNDO_PREFIX, under

# journal path -> descriptor of the journal this process is writing, flocked while its restore runs
_held: dict[str, int] = {}


class LiveJournal(BootseerError):
    """Another process's restore of this tree is in progress (its journal's flock is held)."""


def journal_path(roots: list[str]) -> Path:
    return Path(roots[0]) / JOURNAL_NAME


def _is_live(path: Path) -> bool:
    """Some process holds the flock of the journal at `path`: its restore is still running."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
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
    if str(path) not in _held and _is_live(path):
        raise LiveJournal(f"another process is restoring {', '.join(roots)} (its journal {path} is live)")
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else can hold it
        os.write(fd, json.dumps(doc).encode())
        os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
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
    path = journal_path(roots)
    path.unlink(missing_ok=True)
    _release(path)


def _remove_path(p: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def _take(path: Path) -> int | None:
    """The journal at `path`, opened and flocked (its writer is gone); None when there is none.

    Raises BlockingIOError when its writer still holds it. The flock is taken before the journal is
    read, and the path is checked to still name that file (a writer renames each version in)."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
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
        with os.fdopen(os.dup(fd)) as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _strs(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def undo_paths(roots: list[str], new: list[str], moves: list[tuple[str, str]]) -> int:
    """Remove the planned new paths (deepest first), then rename the moved originals back.

    Only paths under the roots, also through the symlinks on disk, are touched (the journal is a
    file in the tree, not trusted further). Returns how many paths could not be put back.
    """
    real_roots = [os.path.realpath(r) for r in roots]

    def inside(p: str) -> bool:
        return under(p, roots) and p not in roots and under(os.path.realpath(os.path.dirname(p)), real_roots)

    errors = 0
    for p in sorted(set(new), key=lambda q: q.count("/"), reverse=True):
        if inside(p):
            try:
                _remove_path(p)
            except OSError:
                errors += 1
    for path, dest in reversed(moves):
        if not (inside(path) and inside(dest)) or not os.path.lexists(dest):
            continue
        try:
            if os.path.lexists(path):
                _remove_path(path)
            os.rename(dest, path)
        except OSError:
            errors += 1
    return errors


def recover(roots: list[str], info: Callable[[str], None]) -> None:
    """Finish what a dead restore left: undo an uncommitted journal, remove the undo directories.

    Only a journal whose writer is gone (its flock free) is acted on; a live one is left alone."""
    path = journal_path(roots)
    _release(path)  # this process's own restore that stopped part way is over: its journal is a dead one
    try:
        fd = _take(path)
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
    undo_dirs = [d for d in _strs(doc.get("undo_dirs")) if under(d, roots) and d not in roots]
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
    for d in undo_dirs:
        shutil.rmtree(d, ignore_errors=True)
    journal_path(roots).unlink(missing_ok=True)
    _sweep_undo_dirs(roots)


def _sweep_undo_dirs(roots: list[str]) -> None:
    """Undo directories no journal names (left by a restore from before the journal): nothing can
    put them back, and under the tree lock no restore is using them (nor, with a live journal, at all)."""
    if _is_live(journal_path(roots)):
        return
    for root in roots:
        with contextlib.suppress(OSError), os.scandir(root) as it:
            for e in it:
                if e.name.startswith(UNDO_PREFIX) and e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
