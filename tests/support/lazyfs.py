"""A read-only FUSE mirror of a directory that is slow the way lazily loaded images are.

Each 1 MiB chunk of each file is "fetched" on its first read: the reading thread waits a fixed delay
(a round trip to a registry) plus the chunk's transfer time at an optional bandwidth, then the bytes
come from the mirrored directory; later reads of the chunk are immediate, as in stargz, SOCI or
nydus once a chunk is local. Concurrent readers of one chunk wait for one fetch; different chunks
are fetched in parallel (the mount is multithreaded and allows many background requests), so the
latency is what a parallel reader can hide and a one-import-at-a-time reader cannot. netem is not
available on this kernel, which is why the latency comes from user space.

Every fetch is appended to `--log` as "<path> <chunk>\\n", so tests can see exactly which chunks a
start or a replay pulled.

    python -m tests.support.lazyfs SRC MNT --delay-ms 10 [--chunk 1048576] [--mbps 0] [--log FILE]

`LazyMount` runs it as a subprocess (so it can be restarted with a cold chunk cache) and unmounts it
however the caller ends.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import errno
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .fuseproc import FuseProcess

CHUNK = 1 << 20
MAX_THREADS = 64
HANG_S = 6.0  # how long the stat of `--hang`'s file takes (bounded: the server must still exit)


def _make_ops(source: str, delay_s: float, chunk: int, mbps: float, log: str | None, hang: str = "") -> Any:
    import mfusepy

    class LazyFS(mfusepy.Operations):
        use_ns = True

        def __init__(self) -> None:
            # (not `self.lock`: that name is the FUSE lock operation to mfusepy)
            self.fetched: set[tuple[str, int]] = set()
            self.inflight: dict[tuple[str, int], threading.Event] = {}
            self._mutex = threading.Lock()  # not `self.lock`: mfusepy would take it for the FUSE lock op
            self.log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else None

        def init_with_config(self, conn: Any, config: Any) -> None:
            # Many reads in flight at once (readahead requests are "background" ones, 12 by default).
            if conn is not None:
                conn.max_background = 128
                conn.congestion_threshold = 96
                conn.max_read = 1 << 20  # must match the max_read mount option
            if config is not None:
                config.kernel_cache = 1  # keep the page cache across opens, as an image mount does
                config.attr_timeout = 3600.0
                config.entry_timeout = 3600.0
                config.negative_timeout = 3600.0

        def _real(self, path: str) -> str:
            return os.path.join(source, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            if hang and os.path.basename(path) == hang:  # a dead mount: this stat answers late
                time.sleep(HANG_S)
            try:
                st = os.lstat(self._real(path))
            except OSError as e:
                raise mfusepy.FuseOSError(e.errno or errno.EIO) from None
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
            out = {k: getattr(st, k) for k in keys}
            out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return out

        def readlink(self, path: str) -> str:
            return os.readlink(self._real(path))

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._real(path))]

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise mfusepy.FuseOSError(errno.EROFS)
            return os.open(self._real(path), os.O_RDONLY)

        def release(self, path: str, fh: int) -> int:
            with contextlib.suppress(OSError):
                os.close(fh)
            return 0

        def statfs(self, path: str) -> dict[str, Any]:
            sv = os.statvfs(source)
            keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_namemax")
            return {k: getattr(sv, k) for k in keys}

        def _fetch(self, path: str, index: int) -> None:
            key = (path, index)
            with self._mutex:
                if key in self.fetched:
                    return
                ev = self.inflight.get(key)
                owner = ev is None
                if owner:
                    ev = self.inflight[key] = threading.Event()
            if not owner:
                ev.wait()
                return
            time.sleep(delay_s + (chunk / (mbps * 1e6) if mbps > 0 else 0.0))
            with self._mutex:
                self.fetched.add(key)
                del self.inflight[key]
            ev.set()
            if self.log_fd is not None:
                os.write(self.log_fd, f"{path} {index}\n".encode())

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            data = os.pread(fh, size, offset)
            if data:
                for index in range(offset // chunk, (offset + len(data) - 1) // chunk + 1):
                    self._fetch(path, index)
            return data

    return LazyFS()


def serve(
    source: str, mountpoint: str, delay_ms: float, chunk: int, mbps: float, log: str | None, hang: str = ""
) -> None:
    import mfusepy

    ops = _make_ops(os.path.realpath(source), delay_ms / 1000.0, chunk, mbps, log, hang)
    mfusepy.FUSE(
        ops,
        mountpoint,
        foreground=True,
        ro=True,
        fsname="lazyfs",
        allow_other=True,
        max_read=1 << 20,
        max_threads=MAX_THREADS,  # libfuse3 serves 10 requests at a time by default: too few for a parallel reader
        max_idle_threads=MAX_THREADS,  # else libfuse 3.12-3.14.0 logs "Ignoring invalid max threads value"
    )


class LazyMount(FuseProcess):
    """The lazy filesystem as a subprocess (the FuseProcess lifecycle: `start()` waits until mounted,
    `stop()` unmounts however the caller ends, `restart()` is a cold chunk cache and page cache)."""

    name = "lazyfs"

    def __init__(
        self,
        source: Path,
        mountpoint: Path,
        delay_ms: float = 10.0,
        chunk: int = CHUNK,
        mbps: float = 0.0,
        hang: str = "",
    ) -> None:
        super().__init__(mountpoint, mountpoint.parent)
        self.source = source
        self.delay_ms, self.chunk, self.mbps = delay_ms, chunk, mbps
        self.hang = hang  # a file name whose stat answers only after HANG_S (a dead mount, for a while)
        self.log = mountpoint.parent / f".{mountpoint.name}.fetches"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "tests.support.lazyfs", str(self.source), str(self.mountpoint)]
        argv += ["--delay-ms", str(self.delay_ms), "--chunk", str(self.chunk), "--mbps", str(self.mbps)]
        return [*argv, "--log", str(self.log), "--hang", self.hang]

    def env(self) -> dict[str, str]:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        libfuse3 = ctypes.util.find_library("fuse3")
        if libfuse3 and "FUSE_LIBRARY_PATH" not in env:  # mfusepy prefers libfuse2 where both are installed
            env["FUSE_LIBRARY_PATH"] = libfuse3
        return env

    def start(self, timeout: float = 20.0) -> LazyMount:
        self.log.unlink(missing_ok=True)  # each mount's fetches from scratch
        self.log.touch()
        super().start(timeout)
        return self

    def fetches(self) -> list[tuple[str, int]]:
        """(path inside the mount, chunk index) of every chunk fetched so far, in order."""
        out = []
        for line in self.log.read_text().splitlines():
            path, _, index = line.rpartition(" ")
            out.append((path, int(index)))
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source")
    p.add_argument("mountpoint")
    p.add_argument("--delay-ms", type=float, default=10.0)
    p.add_argument("--chunk", type=int, default=CHUNK)
    p.add_argument("--mbps", type=float, default=0.0, help="per-fetch bandwidth in MB/s (0: only the delay)")
    p.add_argument("--log")
    p.add_argument("--hang", default="", help="a file name whose stat answers only after HANG_S")
    a = p.parse_args()
    serve(a.source, a.mountpoint, a.delay_ms, a.chunk, a.mbps, a.log, a.hang)


if __name__ == "__main__":
    main()
