"""A read-only FUSE filesystem (mfusepy) that shows a striped checkpoint as its original directory.

Every `read()` is served by the shared read engine (`reader.Reader`), with the open file handle as
the read-ahead stream, so a sequential `torch.load` pulls from all stripes at once. What makes
Python FUSE fast enough here (measured in tests/benchmarks/bench_stripe.py):

- multithreaded libfuse loop (the default), so the kernel's parallel read-ahead requests are served
  concurrently by the engine's fetch threads;
- `kernel_cache` and long attribute/entry timeouts: the files never change, so the page cache keeps
  what was read across opens;
- large reads (`max_read` 1 MiB; libfuse3 already negotiates 256 pages) and, after the mount is up,
  the mount's bdi `read_ahead_kb` raised from 128 KiB, which lets the kernel ask for many MiB ahead
  of a sequential reader instead of 128 KiB at a time (about 2-3x through Python FUSE).

A failed or corrupt read is EIO to the caller, never wrong bytes. The mount is read-only (writes are
EROFS), yet its modes say 0644/0755: it is the lower layer of the writable view (overlay.py), whose
copy-up keeps them, so a job (a plain user's too) may replace a restored file or add to its directory.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import BootseerError
from .layout import FileEntry, Manifest
from .libfuse import load_mfusepy
from .reader import Reader

if TYPE_CHECKING:
    from mfusepy import Operations, fuse_config, fuse_conn_info

mfusepy = load_mfusepy()
if not TYPE_CHECKING:
    Operations = mfusepy.Operations  # of the libfuse the loader chose

MAX_READ = 1 << 20


class CheckpointFS(Operations):
    use_ns = True

    def __init__(self, manifest: Manifest, reader: Reader, on_init: Callable[[], None] | None = None) -> None:
        self.m = manifest
        self.reader = reader
        self.on_init = on_init
        self.was_mounted = False  # set by the init callback: the kernel accepted the mount
        self.files: dict[str, FileEntry] = {"/" + f.path: f for f in manifest.files}
        self.dirs: dict[str, set[str]] = {"/": set()}
        for d in manifest.dirs:
            self._add_dir("/" + d)
        for f in manifest.files:
            parent, _, base = ("/" + f.path).rpartition("/")
            self._add_dir(parent or "/")
            self.dirs[parent or "/"].add(base)
        self.ns = int(manifest.created * 1e9)
        self.dir_ns = self._dir_mtimes()
        self.uid, self.gid = os.getuid(), os.getgid()
        self.handles: dict[int, FileEntry] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _add_dir(self, path: str) -> None:
        while path not in self.dirs:
            self.dirs[path] = set()
            parent, _, base = path.rpartition("/")
            parent = parent or "/"
            self._add_dir(parent)
            self.dirs[parent].add(base)
            path = parent

    def _dir_mtimes(self) -> dict[str, int]:
        """Each directory's mtime: the newest recorded mtime of the files under it (the mount's time when none)."""
        out: dict[str, int] = {}
        for f in self.m.files:
            if f.mtime_ns is None:
                continue
            parts = ("/" + f.path).split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i]) or "/"
                out[d] = max(out.get(d, 0), f.mtime_ns)
        return out

    # ---- lifecycle -----------------------------------------------------------------------------
    def init_with_config(self, conn: fuse_conn_info | None, config: fuse_config | None) -> None:
        if conn is not None:
            conn.max_read = MAX_READ  # must agree with the max_read mount option
            conn.max_readahead = 64 << 20  # the kernel keeps min(this, bdi read-ahead)
            conn.max_background = 64
            conn.congestion_threshold = 48
        if config is not None:
            config.kernel_cache = 1
            config.entry_timeout = 3600.0
            config.attr_timeout = 3600.0
            config.negative_timeout = 3600.0
        if self.on_init is not None:
            self.on_init()

    # ---- metadata ------------------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        """Times are the recorded mtimes (a trainer picks its newest checkpoint by them), else the mount's."""
        if path in self.dirs:
            ns = self.dir_ns.get(path, self.ns)
            return {**self._times(ns), "st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_size": 0}
        f = self.files.get(path)
        if f is None:
            raise mfusepy.FuseOSError(errno.ENOENT)
        base = self._times(self.ns if f.mtime_ns is None else f.mtime_ns)
        blocks = (f.size + 511) // 512
        return {**base, "st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": f.size, "st_blocks": blocks}

    def _times(self, ns: int) -> dict[str, int]:
        return {"st_uid": self.uid, "st_gid": self.gid, "st_atime": ns, "st_mtime": ns, "st_ctime": ns}

    def readdir(self, path: str, fh: int) -> list[str]:
        children = self.dirs.get(path)
        if children is None:
            raise mfusepy.FuseOSError(errno.ENOENT)
        return [".", "..", *sorted(children)]

    def statfs(self, path: str) -> dict[str, int]:
        bsize = 4096
        return {
            "f_bsize": bsize,
            "f_frsize": bsize,
            "f_blocks": (self.m.total_size + bsize - 1) // bsize,
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": len(self.files) + len(self.dirs),
            "f_ffree": 0,
            "f_namemax": 255,
        }

    # ---- data ----------------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        f = self.files.get(path)
        if f is None:
            raise mfusepy.FuseOSError(errno.EISDIR if path in self.dirs else errno.ENOENT)
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise mfusepy.FuseOSError(errno.EROFS)
        with self._lock:
            fh = next(self._ids)
            self.handles[fh] = f
        return fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        f = self.handles.get(fh) or self.files.get(path)
        if f is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        try:
            return self.reader.pread(f, offset, size, stream=fh)
        except (BootseerError, OSError) as e:
            print(f"bootseer: read {path} @{offset}+{size}: {e}", file=sys.stderr, flush=True)
            raise mfusepy.FuseOSError(errno.EIO) from None

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            self.handles.pop(fh, None)
        self.reader.forget(fh)
        return 0
