"""One bootseer at a time per env tree on a node: a `flock` held from the stamp check to the new stamp.

Two `bootseer exec` (or `restore`) on one node and one tree must not both restore: the second would
move aside the files the first one's launcher is already using. The lock file lives in the node
cache (`<cache>/env-locks/<hash of the roots>.lock`), is opened without following a symlink planted
at its name, and is released by the kernel when the process dies, so a crash never leaves it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator


def lock_path(roots: list[str]) -> str:
    from ..paths import cache_root

    tag = hashlib.sha256("\n".join(roots).encode()).hexdigest()[:24]
    return str(cache_root() / "env-locks" / f"{tag}.lock")


@contextlib.contextmanager
def tree_lock(roots: list[str], info: Callable[[str], None], warn: Callable[[str], None]) -> Iterator[None]:
    """Hold the node-local lock of `roots` (waiting for another holder, and saying so).

    When the lock file cannot be opened (a read-only cache), the body runs unlocked after a warning:
    the lock protects against a rare race, and must not itself stop a start.
    """
    path = lock_path(roots)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
