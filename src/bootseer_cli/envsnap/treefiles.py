"""bootseer's own files in an env tree (stamp, paths file, journal), used only through the first root's descriptor.

The tree is often writable by a plain user while root restores into it, so anything at these names
may be the user's: a symlink to a root file (`.bootseer-env.json.tmp-<pid>` -> /etc/…, overwritten by
root's write), a FIFO (a read that never returns), a link to /dev/zero or a huge sparse file (a read
that eats the node's memory). So each of these files is opened from a descriptor of the first root
(configured: opened by path) with `O_NOFOLLOW | O_NONBLOCK`, used only when `fstat` says it is a
regular file, read up to a cap, and written under an unpredictable temporary name created with
`O_EXCL` and renamed into place within that same directory (a link planted at the final name is
replaced, never followed). The temporary names start with the journal's name, which a capture never
takes (`manifest.scan`), so one left by a killed writer never lands in a snapshot.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator

from .dirfd import ROOT_FLAGS
from .manifest import JOURNAL_NAME

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
STAMP_MAX = 16 << 20  # keys and at most 512 sentinels: a few hundred kB
CARRIED_MAX = 512 << 20  # a row per env path: ~30 MB for 200k paths
JOURNAL_MAX = 256 << 20  # the new paths' tops and the moves: a few MB at most


@contextlib.contextmanager
def root_dir(root: str) -> Iterator[int]:
    """A descriptor of `root`, a tree's first (by path: an admin may have made it a link), checked to be a directory."""
    fd = os.open(root, ROOT_FLAGS)
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.ENOTDIR, "not a directory", root)
        yield fd
    finally:
        os.close(fd)


def open_regular_at(dir_fd: int, name: str) -> int:
    """`name` in `dir_fd`, opened without following a link or blocking; OSError unless it is a regular file."""
    fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file (never read)", name)
    return fd


def read_fd(fd: int, cap: int, name: str = "") -> bytes:
    """All of the regular file open at `fd`, refused (EFBIG) past `cap` bytes: its size is checked before
    reading and again while reading (a file growing meanwhile)."""
    if os.fstat(fd).st_size > cap:
        raise OSError(errno.EFBIG, f"more than {cap} bytes", name)
    chunks, n = [], 0
    while chunk := os.pread(fd, 1 << 20, n):
        n += len(chunk)
        if n > cap:
            raise OSError(errno.EFBIG, f"more than {cap} bytes", name)
        chunks.append(chunk)
    return b"".join(chunks)


def read_own(root: str, name: str, cap: int) -> bytes:
    """The bytes of bootseer's file `name` at the top of `root` (a tree's first) (FileNotFoundError when absent;
    OSError when it is a link, not a regular file, or bigger than `cap`)."""
    with root_dir(root) as dfd:
        fd = open_regular_at(dfd, name)
        try:
            return read_fd(fd, cap, name)
        finally:
            os.close(fd)


def temp_name() -> str:
    """An unguessable temporary name, one a capture skips (it starts with the journal's)."""
    return f"{JOURNAL_NAME}.tmp-{secrets.token_hex(8)}"


def create_temp(dir_fd: int, mode: int) -> tuple[str, int]:
    """(name, descriptor) of a new file of ours in `dir_fd`: `O_EXCL | O_NOFOLLOW`, never someone's link."""
    while True:
        name = temp_name()
        try:
            return name, os.open(name, CREATE_FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue


def write_own(root: str, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace bootseer's file `name` at the top of `root`: a new temporary, renamed into place."""
    with root_dir(root) as dfd:
        tmp, fd = create_temp(dfd, mode)
        try:
            try:
                _write_all(fd, data)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def unlink_own(root: str, name: str) -> None:
    """Remove bootseer's file `name` from the top of `root` (whatever it is now; never through a link)."""
    with contextlib.suppress(FileNotFoundError), root_dir(root) as dfd:
        os.unlink(name, dir_fd=dfd)
