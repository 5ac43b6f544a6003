"""Directory descriptors opened without following links, for writing into a tree others can write.

A restore often runs as root into a tree (a venv) a plain user can write. Checking a path once and
then using it by name is a race: between the check and the use, the user can swap a directory of
the tree for a symlink to anywhere, and root's `open`/`chmod`/`utime` by path would follow it (a
root-owned 0700 directory became 0755 that way). So every write goes through a directory
descriptor reached from the root one component at a time with `O_NOFOLLOW | O_DIRECTORY`, each
`fstat`-checked as a directory, and then only `*at` calls on a single name below it: a swapped
component fails the open (ELOOP/ENOTDIR) instead of being followed, and a directory already open
stays the directory that was inside the tree, wherever it is moved.

`DirFds` caches those descriptors by path (entries arrive sorted, so a file's directory is nearly
always the last one used): the restore opens each directory about once per worker, not once per
file. It is not shared between threads: each worker owns one, so an eviction never closes a
descriptor another thread is using. The roots themselves come from the configuration, not the
snapshot, and are opened by path.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable

from .manifest import open_regular_stat
from .unsafe import UnsafeArchive

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # a root is configured: it may be a link


def fd_budget(share: int = 1) -> int:
    """How many directory descriptors one of `share` caches in this process may hold: half of
    what the open-files limit leaves, so the blob, pipes and the files being written always fit."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 16
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(8, min(4096, (soft - 64) // (2 * max(1, share))))


class NotADir(UnsafeArchive):
    """A path the restore must enter is not a real directory (a symlink, a file put there)."""


class DirFds:
    """Open, no-follow directory descriptors below `roots`, by absolute path, at most `cap` of them.

    `on_made` is told each directory `dir(..., create=True)` had to make (the undo removes it)."""

    def __init__(self, roots: Iterable[str], cap: int = 1024, on_made: Callable[[str], None] | None = None) -> None:
        self.roots = frozenset(roots)
        self.cap = max(4, cap)
        self.on_made = on_made
        self.fds: OrderedDict[str, int] = OrderedDict()
        self._last_path = ""
        self._last_fd = -1

    def dir(self, path: str, create: bool = False) -> int:
        """The descriptor of directory `path` (kept open here: do not close it; it stays valid until
        the next `dir` call only if that call may evict it, so `os.dup` one held across calls)."""
        if path == self._last_path:
            return self._last_fd
        fd = self.fds.get(path)
        if fd is None:
            fd = self._open(path, create)
            self.fds[path] = fd
            if len(self.fds) > self.cap:
                _, old = self.fds.popitem(last=False)
                os.close(old)
        else:
            self.fds.move_to_end(path)
        self._last_path, self._last_fd = path, fd
        return fd

    def _open(self, path: str, create: bool) -> int:
        if path in self.roots:
            return self._open_root(path, create)
        parent, name = _split(path)
        pfd = self.dir(parent, create)
        try:
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=pfd)
                    if self.on_made is not None:
                        self.on_made(path)
                except FileExistsError:
                    pass
                fd = os.open(name, DIR_FLAGS, dir_fd=pfd)
        except FileNotFoundError:
            raise
        except OSError as e:
            raise _not_a_dir(path, e) from None
        return _checked(fd, path)

    def _open_root(self, path: str, create: bool) -> int:
        """A configured root: by path (it may be a link the admin set up); made, with any missing
        parents, when the restore is what creates it (a fresh container)."""
        try:
            fd = os.open(path, ROOT_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            missing = []
            p = path
            while not os.path.lexists(p):
                missing.append(p)
                p = os.path.dirname(p)
            for d in reversed(missing):
                try:
                    os.mkdir(d, 0o755)
                    if self.on_made is not None:
                        self.on_made(d)
                except FileExistsError:
                    pass
            fd = os.open(path, ROOT_FLAGS)
        return _checked(fd, path)

    def close(self) -> None:
        """Close every descriptor held (the cache stays usable: it reopens on demand)."""
        fds, self.fds = self.fds, OrderedDict()
        self._last_path, self._last_fd = "", -1
        for fd in fds.values():
            os.close(fd)


def _checked(fd: int, path: str) -> int:
    """`fd` if it is a directory (what O_DIRECTORY promised: checked, not trusted), else closed and refused."""
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotADir(f"{path} is not a directory: refusing to write below it")
    return fd


def _not_a_dir(path: str, e: OSError) -> BaseException:
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return NotADir(
            f"{path} is not a directory (a symlink put there?): refusing to follow it, it could lead outside the roots"
        )
    return e


def _split(path: str) -> tuple[str, str]:
    """(parent, name) of `path`; UnsafeArchive for a name that is not one entry of its directory (`..`
    would climb out of the roots through descriptors that never see a link)."""
    parent, _, name = path.rpartition("/")
    if not parent or name in ("", ".", ".."):
        raise UnsafeArchive(f"{path} lies outside the roots")
    return parent, name


def rename_at(d: DirFds, src: str, dst: str) -> None:
    """rename(2) between the no-follow descriptors of both directories (the names themselves are
    renamed, never followed)."""
    sparent, sname = _split(src)
    sfd = os.dup(d.dir(sparent))  # held across the next `dir`, which may evict it
    try:
        dparent, dname = _split(dst)
        os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=d.dir(dparent))
    finally:
        os.close(sfd)


def remove_at(d: DirFds, path: str) -> None:
    """Remove `path` (a file, link or directory tree) from its directory, reached without following a
    link: a parent swapped for a symlink raises, nothing is removed through it."""
    parent, name = _split(path)
    try:
        pfd = d.dir(parent)
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=pfd)
        return
    try:
        os.rmdir(name, dir_fd=pfd)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        rmtree_at(pfd, name)


def rmtree_at(pfd: int, name: str) -> None:
    """A non-empty directory the extraction created (a dead worker's files in it): by descriptor."""
    if sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=pfd)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=pfd)  # pragma: no cover - Python 3.10
    try:  # pragma: no cover
        for child in os.listdir(fd):
            if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                rmtree_at(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    finally:  # pragma: no cover
        os.close(fd)
    os.rmdir(name, dir_fd=pfd)  # pragma: no cover


class TreeOpener:
    """Opens the files a capture reads through no-follow directory descriptors from the roots.

    The scan lists a tree a plain user may change while root reads it: a directory swapped for a
    symlink to a root-only one after the scan would make a read by path publish root's files. Here
    every component below a root is entered with `O_NOFOLLOW | O_DIRECTORY` (`DirFds`), so the swap
    fails the read (NotADir), and a directory opened before the swap stays the tree's own."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.dirs = DirFds([r.rstrip("/") or "/" for r in roots], fd_budget(4))

    def open(self, path: str) -> tuple[int, os.stat_result]:
        """(descriptor, fstat) of regular file `path`, as `manifest.open_regular_stat` gives them."""
        parent, name = _split(path)
        return open_regular_stat(name, dir_fd=self.dirs.dir(parent))

    def close(self) -> None:
        self.dirs.close()
