"""One bootseer at a time per env tree on a node: a `flock` held from the stamp check to the new stamp.

Two `bootseer exec` (or `restore`) on one node and one tree must not both restore: the second would
move aside the files the first one's launcher is already using. So the lock belongs to the tree, not
to whoever runs: it is keyed by the roots' real paths (sorted), never by `XDG_CACHE_HOME`, which two
processes of one node may well set differently.

- root: `/run/lock/bootseer/<hash>.lock` (else `/run/bootseer/locks`), a directory only root can
  write, checked without following links: no user can hold, swap or delete root's lock.
- another user: `<first root>/.bootseer-env.journal.lock`, inside the tree itself, so every user who
  can restore the tree (who can write its root) finds the same lock. The name is one the snapshot
  never captures (it starts with the journal's).

The lock file is opened without following a symlink planted at its name, and is released by the
kernel when the process dies, so a crash never leaves it held. Root and a plain user restoring one
user-owned tree at once do not share a lock; the journal's own flock (journal.py) still keeps either
from undoing the other's live restore.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable, Iterator

from .manifest import JOURNAL_NAME

ROOT_LOCK_DIRS = ("/run/lock/bootseer", "/run/bootseer/locks")


def tree_key(roots: list[str]) -> str:
    """The tree's identity: its roots' real paths, sorted (the order a config lists them in, or a symlink
    on the way, does not make another tree), with the device and inode of each that exists: one path in
    two mount namespaces or containers of a node (its own /opt/venv each) is two trees, which must
    not wait for each other."""
    parts = []
    for r in sorted(os.path.realpath(r) for r in roots):
        try:
            st = os.stat(r)
            parts.append(f"{r}\0{st.st_dev}:{st.st_ino}")
        except OSError:
            parts.append(r)  # not made yet: its path (the restore creates it under the lock)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _root_lock_dir() -> str | None:
    """The first of ROOT_LOCK_DIRS that is (or could be made) a real directory of root's that only root
    can write; None when neither is (a read-only /run)."""
    for d in ROOT_LOCK_DIRS:
        with contextlib.suppress(FileExistsError, OSError):
            os.makedirs(os.path.dirname(d), mode=0o755, exist_ok=True)
            os.mkdir(d, 0o755)
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022:
            return d
    return None


def lock_path(roots: list[str], euid: int | None = None) -> str:
    """Where the tree lock of `roots` lives for this user (see the module's docstring)."""
    if (os.geteuid() if euid is None else euid) == 0:
        d = _root_lock_dir()
        if d is not None:
            return os.path.join(d, f"{tree_key(roots)}.lock")
    first = sorted(os.path.realpath(r) for r in roots)[0]
    return os.path.join(first, f"{JOURNAL_NAME}.lock")


def _open_lock(path: str) -> int:
    """Open (create) the lock file: never through a link, only a regular file; root only its own."""
    if os.geteuid() != 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)  # a fresh container: the restore makes the root
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (os.geteuid() == 0 and st.st_uid != 0):
        os.close(fd)
        raise OSError(0, "not a regular file of this user's", path)
    return fd


@contextlib.contextmanager
def tree_lock(roots: list[str], info: Callable[[str], None], warn: Callable[[str], None]) -> Iterator[None]:
    """Hold the node-local lock of `roots` (waiting for another holder, and saying so).

    When the lock file cannot be opened (a read-only tree root), the body runs unlocked after a
    warning: the lock protects against a rare race, and must not itself stop a start.
    """
    path = lock_path(roots)
    try:
        fd = _open_lock(path)
    except OSError as e:
        warn(f"env: cannot open the tree lock {path} ({e.strerror}); going on without it")
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info(f"env: another bootseer is working on {', '.join(roots)}; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
