"""Does a root's filesystem keep a file's pages across opens? Asked once per filesystem per run.

Hot-block record (mincore at the end of a start) and replay (read before the program) both assume
that pages read through one `open()` are still there at the next. A FUSE filesystem that does not
return `FOPEN_KEEP_CACHE` (rclone mount, s3fs without `kernel_cache`, many others) has the kernel
drop the file's pages at every open: a replay is then thrown away when the program opens the file,
and a record by mincore finds nothing. The probe tells which kind of tree this is, by doing exactly
that: read one page of a file, close, open again, and ask `mincore` on a fresh mapping.

The answer is cached per `st_dev` for the process (one probe per filesystem, whatever the roots).
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections import deque
from dataclasses import dataclass

from .pagecache import _MAP_FAILED, _MAP_SHARED, _PROT_READ, PAGE_SIZE, _lib

# How many directory entries the probe looks at to find a file to read (a root is often huge).
SEARCH_LIMIT = 500


@dataclass(frozen=True)
class Probe:
    """What one root's filesystem does with pages across opens (`keeps` None: could not tell)."""

    root: str
    dev: int
    fstype: str
    keeps: bool | None
    detail: str

    @property
    def drops(self) -> bool:
        return self.keeps is False

    def line(self) -> str:
        """One line for `bootseer doctor` and the image stage."""
        if self.keeps is None:
            return f"{self.root} ({self.fstype}): cannot tell whether pages survive an open ({self.detail})"
        if self.keeps:
            return f"{self.root} ({self.fstype}): keeps pages across opens"
        return f"{self.root} ({self.fstype}): drops a file's pages at every open (no keep-cache)"


_BY_DEV: dict[int, Probe] = {}


def mount_of(path: str) -> tuple[str, str, str]:
    """(mount point, filesystem type, source) of the mount holding `path` (longest mount point prefix
    in mountinfo); ("", "?", "") when it cannot be read."""
    real = os.path.realpath(path)
    best, kind, source = "", "?", ""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mnt = fields[4].replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    tail = right.split()
                    best, kind, source = mnt, tail[0], tail[1] if len(tail) > 1 else ""
    except OSError:
        pass
    return best, kind, source


def fstype_of(path: str) -> str:
    """The filesystem type of the mount holding `path`."""
    return mount_of(path)[1]


def _sample_file(root: str) -> str | None:
    """A regular file of at least two pages under `root` (breadth first, a bounded number of entries)."""
    if os.path.isfile(root):
        return root
    queue, seen = deque([root]), 0
    while queue and seen < SEARCH_LIMIT:
        try:
            entries = list(os.scandir(queue.popleft()))
        except OSError:
            continue
        for e in entries:
            seen += 1
            try:
                if e.is_file(follow_symlinks=False):
                    s = e.stat(follow_symlinks=False)
                    if stat.S_ISREG(s.st_mode) and s.st_size >= 2 * PAGE_SIZE:
                        return e.path
                elif e.is_dir(follow_symlinks=False):
                    queue.append(e.path)
            except OSError:
                continue
    return None


def _page_resident(fd: int, size: int, page: int) -> bool:
    """Whether page `page` of the file behind `fd` is in the page cache (a fresh shared mapping)."""
    lib = _lib()
    addr = lib.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
    if addr in (None, _MAP_FAILED):
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        npages = (size + PAGE_SIZE - 1) // PAGE_SIZE
        vec = (ctypes.c_ubyte * npages)()
        if lib.mincore(ctypes.c_void_p(addr), size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return bool(vec[page] & 1)
    finally:
        lib.munmap(ctypes.c_void_p(addr), size)


def _keeps_pages(path: str, offset: int = PAGE_SIZE) -> bool:
    """Read the page at `offset`, close, reopen, and see whether the page is still cached."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    page = offset // PAGE_SIZE
    fd = os.open(path, flags)
    try:
        size = os.fstat(fd).st_size
        if not os.pread(fd, PAGE_SIZE, page * PAGE_SIZE):
            raise OSError("read returned nothing")
    finally:
        os.close(fd)
    fd = os.open(path, flags)
    try:
        return _page_resident(fd, size, page)
    finally:
        os.close(fd)


def probe_root(root: str, hints: list[tuple[str, int]] | None = None) -> Probe:
    """Probe `root`'s filesystem (cached per st_dev for this process).

    `hints`: (file, offset) pairs the caller will read anyway (a record's extents), so on a lazy tree
    the probe fetches nothing the start does not need; else the first file of two pages found.
    """
    try:
        dev = os.stat(root).st_dev
    except OSError as e:
        return Probe(root, -1, "?", None, f"cannot stat: {e.strerror}")
    cached = _BY_DEV.get(dev)
    if cached is not None:
        return Probe(root, dev, cached.fstype, cached.keeps, cached.detail)
    kind = fstype_of(root)
    sample = _hinted(root, dev, hints or [])
    if sample is None:
        path = _sample_file(root)
        sample = (path, PAGE_SIZE) if path else None
    if sample is None:
        found = Probe(root, dev, kind, None, "no file of two pages or more found to probe")
    else:
        try:
            found = Probe(root, dev, kind, _keeps_pages(*sample), f"probed {sample[0]}")
        except OSError as e:
            found = Probe(root, dev, kind, None, f"probe of {sample} failed: {e.strerror or e}")
    _BY_DEV[dev] = found
    return found


def _hinted(root: str, dev: int, hints: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The first hint on `root`'s filesystem that is a regular file with a page at the offset."""
    for path, offset in hints:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_dev == dev and stat.S_ISREG(st.st_mode) and offset < st.st_size:
            return path, offset
    return None


def probe_roots(roots: list[str], hints: list[tuple[str, int]] | None = None) -> list[Probe]:
    return [probe_root(r, hints) for r in roots]


def forget() -> None:
    """Drop the cached answers (tests remount filesystems at the same device numbers)."""
    _BY_DEV.clear()
