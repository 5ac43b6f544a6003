"""The page cache as an instrument: evict files' pages, and ask which pages are resident.

Recording the hot set of a start needs no tracer: evict the pages of the files under the roots
(`posix_fadvise(DONTNEED)` after `sync`, since dirty pages cannot be dropped), let the program start,
then ask the kernel with `mincore` which pages came back. Pages mapped by running processes (libc)
cannot be evicted and show as resident: they are hot anyway.

`mincore` lies to the unprivileged: since Linux 5.2 a caller that neither owns a file, nor may write
it, nor holds CAP_FOWNER is told that every page is resident (a side-channel fix). A record taken like
that would replay whole images, so `untrusted_files` finds such files before anything is recorded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
WORKERS = 8
_T = TypeVar("_T")
_R = TypeVar("_R")

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc: ctypes.CDLL | None = None
_LOW_BIT = bytes(b & 1 for b in range(256))


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.restype = ctypes.c_int
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = lib
    return _libc


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int
    mtime_ns: int
    uid: int


def walk_files(roots: Iterable[str | os.PathLike[str]]) -> Iterator[FileInfo]:
    """Regular files under `roots`, each real file once (roots overlap: /lib → /usr/lib on merged /usr).

    Symlinks are not followed (their targets are under some root or not hot for us); unreadable
    directories are skipped, not fatal: a root is a hint, not a contract.
    """
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: set[tuple[int, int]] = set()
    for root in roots:
        top = os.path.realpath(root)
        try:
            st = os.stat(top)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            if (st.st_dev, st.st_ino) not in seen_files:
                seen_files.add((st.st_dev, st.st_ino))
                yield FileInfo(top, st.st_size, st.st_mtime_ns, st.st_uid)
            continue
        stack = [top]
        while stack:
            d = stack.pop()
            try:
                st = os.stat(d)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen_dirs:
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        s = e.stat(follow_symlinks=False)
                        ident = (s.st_dev, s.st_ino)
                        if ident in seen_files or not stat.S_ISREG(s.st_mode):
                            continue
                        seen_files.add(ident)
                        yield FileInfo(e.path, s.st_size, s.st_mtime_ns, s.st_uid)
                except OSError:
                    continue


def mincore_trustworthy(info: FileInfo) -> bool:
    """Whether the kernel tells this process the truth about `info`'s pages (see the module docstring)."""
    euid = os.geteuid()
    if euid == 0 or info.uid == euid:
        return True
    return os.access(info.path, os.W_OK)


def untrusted_files(files: Iterable[FileInfo]) -> list[FileInfo]:
    """The files whose residency this process cannot see (empty when running as root)."""
    if os.geteuid() == 0:
        return []
    return [f for f in files if f.size > 0 and not mincore_trustworthy(f)]


def _evict_one(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def evict(files: Iterable[FileInfo | str], threads: int = WORKERS) -> int:
    """Drop the clean cached pages of `files` (after a `sync`); returns how many files were advised.

    Threads, because with cold metadata each open waits on the disk (or a FUSE server) and many
    can wait at once; the syscalls release the GIL.
    """
    os.sync()
    paths = [f.path if isinstance(f, FileInfo) else f for f in files]
    return sum(parallel_map(_evict_one, paths, threads))


def parallel_map(fn: Callable[[_T], _R], items: list[_T], threads: int = WORKERS) -> list[_R]:
    """`fn` over `items` in order, on a small thread pool when there is enough to share."""
    if threads <= 1 or len(items) < 256:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items, chunksize=256))


def resident_runs(path: str, size: int | None = None) -> list[tuple[int, int]]:
    """Runs of resident pages of `path` as (first page, page count); empty for empty or vanished files.

    The file is mapped (which reads nothing) and the kernel fills one byte per page.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if size is None:
            size = os.fstat(fd).st_size
        if size <= 0:
            return []
        lib = _lib()
        addr = lib.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            return []
        try:
            npages = (size + PAGE_SIZE - 1) // PAGE_SIZE
            vec = (ctypes.c_ubyte * npages)()
            if lib.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return []
            return runs_from_vector(bytes(vec))
        finally:
            lib.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def runs_from_vector(vec: bytes) -> list[tuple[int, int]]:
    """(first page, count) for each run of set low bits in a mincore vector (bytes.find: C speed)."""
    bits = vec.translate(_LOW_BIT)
    runs: list[tuple[int, int]] = []
    i, n = 0, len(bits)
    while (start := bits.find(1, i)) >= 0:
        end = bits.find(0, start)
        if end < 0:
            end = n
        runs.append((start, end - start))
        i = end
    return runs
