"""No-follow I/O in the compile caches, which may be trees a plain user owns (issue 26, case 2).

The cache roots come from TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and the launcher's TMPDIR: the
training user chooses them, owns them, and may swap any file or directory in them for a symlink at any
time, in particular between the walk that lists a file and the read that uploads it, or between the
check of a directory and the write below it. A root agent that used paths would then upload a
root-only file (`fxgraph/x -> /etc/shadow`) or write through `fxgraph -> /etc`. So:

- every component below a root is opened with `O_NOFOLLOW | O_DIRECTORY` from the directory
  descriptor above it, and `fstat`-checked (a directory, of the tree's owner); a linked component
  fails with ELOOP/ENOTDIR instead of being followed;
- a file is read through `openat(O_NOFOLLOW | O_NONBLOCK)` and used only when `fstat` of what was
  opened says it is a regular file (a FIFO swapped in does not hang the reader) and, when root reads
  a tree another uid owns, only when that uid owns it and can read it itself (never a file that only
  root could read, such as a hard link to a root-only file);
- a file is written through `openat(O_CREAT | O_EXCL | O_NOFOLLOW)` under a temporary name in the
  directory descriptor, then `renameat` within that same directory (which replaces a link put at the
  final name, never follows it); modes are 0o644 for files, 0o700 for the directories made;
- when root writes into a tree another uid owns, the thread doing it drops its filesystem identity
  to that owner (`setfsuid`/`setfsgid`, per thread on Linux: the other threads of `bootseer exec`
  keep theirs), so what it makes is the owner's, and the kernel refuses what the owner could not do.
  Where that is impossible, root does not write there.

The roots themselves are configured (a variable, the settings) and are opened by path: they may be
links an admin set up. What lies below them is the tree's, and is never followed.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o644
DIR_MODE = 0o700

Parts = list[str] | tuple[str, ...]


class Refused(OSError):
    """A path below a cache root that is not the tree's own (a link, a directory of another uid)."""


@dataclass(frozen=True)
class Tree:
    """A cache root as opened: its owner, and whether this process acts for another uid in it."""

    fd: int
    uid: int  # the owner of the root directory
    gid: int
    foreign: bool  # root (euid 0) in a tree another uid owns: filter what is read, drop what is written

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def open_tree(root: str) -> Tree:
    """Open a configured cache root (by path: links set up by an admin are allowed there)."""
    fd = os.open(root, ROOT_FLAGS)
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise Refused(errno.ENOTDIR, f"{root} is not a directory")
    return Tree(fd, st.st_uid, st.st_gid, foreign=os.geteuid() == 0 and st.st_uid != 0)


def acceptable_root(root: str) -> bool:
    """Whether this process may use `root` as a cache: a directory of its own uid, or, for root, of any
    uid (root then acts as that owner). A directory of another user is not this user's cache."""
    try:
        tree = open_tree(root)
    except OSError:
        return False
    tree.close()
    return os.geteuid() == 0 or tree.uid == os.geteuid()


def make_root(root: str) -> None:
    """Create a configured root's missing directories (0o700) below its deepest existing ancestor, entered
    without following links, as that ancestor's owner when root makes them in another uid's directory."""
    path = os.path.abspath(root)
    missing: list[str] = []
    while not os.path.lexists(path):
        path, name = os.path.split(path)
        missing.append(name)
    if not missing:
        return
    tree = open_tree(path)
    fd = os.dup(tree.fd)
    try:
        with acting_as(tree):
            for name in reversed(missing):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                nfd = _open_component(name, fd, os.path.join(path, name))
                os.close(fd)
                fd = nfd
                path = os.path.join(path, name)
        if os.fstat(fd).st_uid != (tree.uid if tree.foreign else os.geteuid()):
            raise Refused(errno.EPERM, f"{path} was made by another user meanwhile: refusing it")
    finally:
        os.close(fd)
        tree.close()


@functools.cache
def _libc_fsid() -> tuple[Callable[[int], int], Callable[[int], int]] | None:
    """libc's setfsuid and setfsgid (loaded on first use: only root in a foreign tree needs them)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.setfsuid, libc.setfsgid
    except (OSError, AttributeError, ImportError):
        return None


@contextlib.contextmanager
def acting_as(tree: Tree) -> Iterator[None]:
    """This thread's file system identity becomes the tree's owner while the block runs (root in a
    foreign tree only; otherwise nothing changes). Raises Refused when the identity cannot be dropped."""
    if not tree.foreign:
        yield
        return
    fsid = _libc_fsid()
    if fsid is None:
        raise Refused(errno.EPERM, f"cannot act as uid {tree.uid} here; root does not write into its tree")
    setfsuid, setfsgid = fsid
    gid = _primary_gid(tree)
    old_gid = setfsgid(gid)
    old_uid = setfsuid(tree.uid)
    try:
        if setfsuid(-1) != tree.uid or setfsgid(-1) != gid:  # -1: an invalid id, which only asks
            raise Refused(errno.EPERM, f"cannot act as uid {tree.uid}; root does not write into its tree")
        yield
    finally:
        setfsuid(old_uid)
        setfsgid(old_gid)


def _primary_gid(tree: Tree) -> int:
    try:
        import pwd

        return pwd.getpwuid(tree.uid).pw_gid
    except (ImportError, KeyError):
        return tree.gid


def _check_dir(fd: int, tree: Tree, what: str) -> int:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != tree.uid:
        os.close(fd)
        raise Refused(errno.EPERM, f"{what} is not a directory of uid {tree.uid}: refusing to use it")
    return fd


def open_dir(tree: Tree, parts: Parts, create: bool = False) -> int:
    """A new descriptor of the directory `parts` below the tree's root, each component entered without
    following links and checked to be the owner's; missing ones made (`create`) as whoever this thread
    acts as. The caller closes it."""
    fd = os.dup(tree.fd)
    try:
        for i, name in enumerate(parts):
            what = "/".join(parts[: i + 1])
            try:
                nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                nfd = _open_component(name, fd, what)
            except OSError as e:
                raise _refused(what, e) from None
            os.close(fd)
            fd = -1
            fd = _check_dir(nfd, tree, what)
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def _open_component(name: str, dir_fd: int, what: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        raise _refused(what, e) from None


def _refused(what: str, e: OSError) -> OSError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return Refused(e.errno, f"{what} is not a directory (a symlink?): refusing to follow it")
    return e


def usable_file(st: os.stat_result, tree: Tree) -> bool:
    """A regular file; in a foreign tree, one its owner owns and can read (never a root-only file)."""
    if not stat.S_ISREG(st.st_mode):
        return False
    return not tree.foreign or (st.st_uid == tree.uid and bool(st.st_mode & stat.S_IRUSR))


def open_file(tree: Tree, parts: Parts) -> tuple[int, os.stat_result]:
    """(descriptor, fstat) of the file `parts` below the root, opened without following any link;
    Refused when what was opened is not a file this process may read for the tree (`usable_file`)."""
    dfd = open_dir(tree, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], READ_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise _refused("/".join(parts), e) from None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not usable_file(st, tree):
        os.close(fd)
        raise Refused(errno.EPERM, f"{'/'.join(parts)} is not a regular file of uid {tree.uid}: not read")
    os.set_blocking(fd, True)
    return fd, st


def stat_file(tree: Tree, parts: Parts) -> os.stat_result | None:
    """lstat of `parts` reached without following links; None when it is not there (or not reachable)."""
    try:
        dfd = open_dir(tree, parts[:-1])
    except OSError:
        return None
    try:
        return os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(dfd)


Found = tuple[tuple[str, ...], int, str, os.stat_result]


def walk(tree: Tree) -> Iterator[Found]:
    """(directory parts, its descriptor, name, lstat) of every usable file below the root (hidden
    directories skipped); the descriptor is valid only until the next item. Directories that are not
    the owner's, and links, are not entered."""
    stack: list[tuple[tuple[str, ...], int]] = [((), os.dup(tree.fd))]
    try:
        while stack:
            parts, fd = stack.pop()
            try:
                yield from _entries(tree, parts, fd, stack)
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)


def _entries(tree: Tree, parts: tuple[str, ...], fd: int, stack: list[tuple[tuple[str, ...], int]]) -> Iterator[Found]:
    """The usable files of one directory; its subdirectories (the owner's, opened no-follow) onto `stack`."""
    with os.scandir(fd) as it:
        entries = list(it)
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if entry.name.startswith(".") or st.st_uid != tree.uid:
                continue
            try:
                sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            if os.fstat(sub).st_uid != tree.uid:
                os.close(sub)
                continue
            stack.append(((*parts, entry.name), sub))
        elif usable_file(st, tree):
            yield parts, fd, entry.name, st


def write_file(tree: Tree, parts: Parts, fill: Callable[[int], int]) -> int:
    """Write a file at `parts` below the root: directories made as needed (no link followed), the data
    written by `fill(fd) -> bytes written` into an `O_EXCL` temporary, then renamed into place in the
    same directory. As the tree's owner when root writes into a foreign tree. Nothing appears on failure."""
    with acting_as(tree):
        dfd = open_dir(tree, parts[:-1], create=True)
    try:
        tmp = f".{parts[-1]}.part-{uuid.uuid4().hex[:8]}"
        with acting_as(tree):
            fd = os.open(tmp, CREATE_FLAGS, FILE_MODE, dir_fd=dfd)
        try:
            try:
                n = fill(fd)
                os.fchmod(fd, FILE_MODE)
            finally:
                os.close(fd)
            with acting_as(tree):
                os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError), acting_as(tree):
                os.unlink(tmp, dir_fd=dfd)
            raise
        return n
    finally:
        os.close(dfd)
