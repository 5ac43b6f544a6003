"""The node cache's fan-out directories (`sha256/86/`), entered without following links.

A node cache often lives in a directory its user can write (`/var/cache/bootseer/<user>`), and a
process with more rights than that user (the Slurm prolog's root) may write and delete there. Had
it used paths, a user's `sha256/86 -> /etc/cron.d` would have made root write a blob of the
user's choosing into `/etc/cron.d`, and the LRU eviction would have deleted the files of any
directory. So every write, rename, touch and unlink below the cache root goes through a directory
descriptor reached one component at a time with `O_NOFOLLOW | O_DIRECTORY`, each `fstat`-checked:
a directory, owned by the acting uid (or by root and not writable by others). A link or another
user's directory is refused with `UnsafeCacheDir` (a store error: the blob is a miss, fetched
elsewhere or not at all, and the job still starts). The cache root itself is configured, not
planted, and is opened by path (an admin may make it a link).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import BlobMissing, IntegrityError, StoreError
from .fs import client_error

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeCacheDir(StoreError):
    """A directory below the cache root is a link, not a directory, or someone else's: not entered."""


def _trusted(st: os.stat_result) -> bool:
    """Whether a directory can only be changed by the acting uid (or root): its owner, and no
    group/other write (a root-owned world-writable directory is anyone's)."""
    euid = os.geteuid()
    if st.st_uid == euid:
        return True
    return st.st_uid == 0 and not st.st_mode & 0o022


def _checked(fd: int, where: str, owner: bool) -> int:
    st = os.fstat(fd)
    why = ""
    if not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif owner and not _trusted(st):
        why = f"belongs to uid {st.st_uid}, not to uid {os.geteuid()}"
    if why:
        os.close(fd)
        raise UnsafeCacheDir(f"node cache: {where} {why}: not used")
    return fd


def open_root(root: Path, create: bool) -> int:
    """The cache root, by path (configured; made with its parents when `create`)."""
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return _checked(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), str(root), owner=False)


def open_sub(pfd: int, name: str, where: str, create: bool) -> int:
    """Directory `name` in `pfd`, never through a link, made (0755) when missing and `create`."""
    for attempt in range(2):
        try:
            return _checked(os.open(name, DIR_FLAGS, dir_fd=pfd), where, owner=True)
        except FileNotFoundError:
            if not create or attempt:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=pfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeCacheDir(f"node cache: {where} is a link or not a directory: not followed") from None
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def open_parent(dest: Path, base: Path | None, create: bool = True) -> int:
    """A descriptor of `dest`'s directory. Below `base` (the cache root) every component is entered
    no-follow and must be the acting uid's; without `base`, `dest.parent` is the caller's own path."""
    if base is None:
        if create:
            dest.parent.mkdir(parents=True, exist_ok=True)
        return _checked(os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), str(dest.parent), False)
    try:
        parts = dest.parent.relative_to(base).parts
    except ValueError:
        raise UnsafeCacheDir(f"node cache: {dest} lies outside {base}") from None
    fd = open_root(base, create)
    where = base
    try:
        for part in parts:
            if part in ("..", "."):
                raise UnsafeCacheDir(f"node cache: {dest} is not a plain path below {base}")
            where = where / part
            nfd = open_sub(fd, part, str(where), create)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def parent_fd(dest: Path, base: Path | None, create: bool = True) -> Iterator[int]:
    """`open_parent` for a `with` block (closed after)."""
    fd = open_parent(dest, base, create)
    try:
        yield fd
    finally:
        os.close(fd)


def open_regular(name: str, dfd: int) -> int:
    """A file of the cache for reading: no link followed, non-blocking (a FIFO put there cannot hang
    us), and refused unless it is a regular file."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeCacheDir(f"node cache: {name} is a link: not used") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeCacheDir(f"node cache: {name} is not a regular file: not used")
    return fd


def sha256_fd(fd: int) -> str:
    """Hex sha256 of what `fd` reads from its start."""
    import hashlib

    h = hashlib.sha256()
    off = 0
    while chunk := os.pread(fd, 1 << 20, off):
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


def unlink_at(name: str, dfd: int) -> None:
    """Remove `name` from directory `dfd` if it is there (a temporary file of ours)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dfd)


def download_into(
    chunks: contextlib.AbstractContextManager[Iterator[bytes]],
    dfd: int,
    name: str,
    digest: str,
    uri: str,
    progress: Callable[[int], None] | None,
) -> int:
    """A blob read from `chunks` (`StoreFS.read_chunks`: each chunk has a deadline) into `name` in
    directory `dfd`, through a private temporary name (O_EXCL, no-follow), hashed on the way and renamed
    into place only when it matches."""
    import hashlib
    import uuid

    tmp = f".{name}.part-{uuid.uuid4().hex[:8]}"
    h = hashlib.sha256()
    n = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(tmp, flags, 0o644, dir_fd=dfd), "wb") as out, chunks as src:
            for chunk in src:
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
                if progress:
                    progress(len(chunk))
        if h.hexdigest() != digest:
            raise IntegrityError(f"blob {digest[:12]} from {uri} does not match its digest")
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except FileNotFoundError:
        unlink_at(tmp, dfd)
        raise BlobMissing(f"store {uri}: blob {digest[:12]} not found") from None
    except OSError as e:
        unlink_at(tmp, dfd)
        raise StoreError(f"store {uri}: cannot download blob {digest[:12]}: {client_error(e)}") from None
    except BaseException:
        unlink_at(tmp, dfd)
        raise
    return n


def link_into(stored: str, dfd: int, name: str, digest: str, uri: str) -> int | None:
    """`name` in `dfd` made a hard link to the local store's file `stored`, after hashing it; None
    when a link is not possible here (another filesystem, links refused: the caller copies)."""
    import uuid

    tmp = f".{name}.link-{uuid.uuid4().hex[:8]}"
    try:
        os.link(stored, tmp, dst_dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        raise BlobMissing(f"store {uri}: blob {digest[:12]} not found") from None
    except OSError:
        return None
    try:
        fd = open_regular(tmp, dfd)
        try:
            if sha256_fd(fd) != digest:
                raise IntegrityError(f"blob {digest[:12]} in {uri} does not match its digest")
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        unlink_at(tmp, dfd)
    return size
