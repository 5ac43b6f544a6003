"""Replay a hot-block record: read its extents so the start finds them in the page cache.

Reads go in the grain of a lazy loader: each file is read by one thread, its extents in offset
order, so the loader sees one forward stream per file (a loader that streams ranged GETs restarts
its stream on every out-of-order read: 64 threads on 1 MiB pieces of one file cost rclone 4.6x the
bytes and 4x the time of one sequential reader). Parallelism is across files: a bounded pool takes
the next file. Reads go into a reused per-thread buffer with `preadv`, at most `READ_MAX` at a time
(nothing is kept: the point is the page cache, or the loader's own cache). A bandwidth cap (a virtual
clock shared by the threads) keeps replay from starving the program when they run side by side. A
deadline stops taking new work; what is left is returned so the agent can finish it behind the
program.

Stale files (size or mtime changed, gone, no longer regular) are skipped before any read, so a
stale record costs one `stat` per file and nothing else.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .record import Record, Staleness, check

# Reads are cut at 1 MiB boundaries of the file: large enough to be cheap per byte, aligned with the
# chunks lazily loaded images fetch (stargz, SOCI and our test filesystem use 1 MiB or more), and
# small enough that 64 threads' buffers cost 64 MiB.
READ_MAX = 1 << 20

Extent = tuple[str, int, int]


@dataclass
class ReplayResult:
    bytes_read: int = 0
    extents_done: int = 0
    files: int = 0
    errors: int = 0
    seconds: float = 0.0
    staleness: Staleness = field(default_factory=Staleness)
    remaining: list[Extent] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.remaining


def plan(rec: Record) -> tuple[list[Extent], Staleness]:
    """The reads to do for `rec` (stale files left out, long extents cut at READ_MAX), and the staleness."""
    staleness, fresh = check(rec)
    work: list[Extent] = []
    for path, off, n in rec.extents:
        if path not in fresh:
            continue
        while n > 0:
            step = min(n, READ_MAX - off % READ_MAX)  # aligned pieces: one per chunk of a lazy image
            work.append((path, off, step))
            off += step
            n -= step
    return work, staleness


class _Throttle:
    """A shared virtual clock: each read of n bytes advances it by n / rate; readers wait for it."""

    def __init__(self, mbps: float) -> None:
        self.rate = mbps * 1e6 if mbps and mbps > 0 else 0.0
        self.clock = 0.0
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            start = max(self.clock, now)
            self.clock = start + n / self.rate
        if start > now:
            time.sleep(start - now)


class _Pool:
    """The state the reader threads share: the files still to read, and the tallies.

    One lock guards it; it is held only to take the next file or to count, never across a read.
    """

    def __init__(
        self, work: list[Extent], mbps: float, deadline: float | None, stop: Callable[[], bool] | None
    ) -> None:
        by_file: dict[str, list[Extent]] = {}
        for extent in work:
            by_file.setdefault(extent[0], []).append(extent)
        self.files = [sorted(pieces, key=lambda e: e[1]) for pieces in by_file.values()]
        self.deadline = deadline
        self.stop = stop
        self.throttle = _Throttle(mbps)
        self.lock = threading.Lock()
        self.next_index = 0
        self.opened = 0
        self.left: list[Extent] = []
        self.result = ReplayResult()

    def stopped(self) -> bool:
        return (self.deadline is not None and time.monotonic() >= self.deadline) or (
            self.stop is not None and self.stop()
        )

    def take(self) -> list[Extent] | None:
        """The next file's extents, or None when the work is done, the deadline passed or `stop()` said so."""
        with self.lock:
            if self.next_index >= len(self.files) or self.stopped():
                return None
            pieces = self.files[self.next_index]
            self.next_index += 1
            return pieces

    def worker(self) -> None:
        """One reader thread: take a file, read its extents in order, until `take` says stop."""
        view = memoryview(bytearray(READ_MAX))
        while (pieces := self.take()) is not None:
            fd = _open_regular(pieces[0][0])
            if fd is None:
                with self.lock:
                    self.result.errors += 1
                continue
            try:
                self._read_file(fd, pieces, view)
            finally:
                os.close(fd)

    def _read_file(self, fd: int, pieces: list[Extent], view: memoryview) -> None:
        """Read one file's extents front to back; a deadline in the middle leaves the rest for later."""
        with self.lock:
            self.opened += 1
        for i, (_path, off, n) in enumerate(pieces):
            if i and self.stopped():
                with self.lock:
                    self.left.extend(pieces[i:])
                return
            self.throttle.take(n)
            got = 0
            try:
                while got < n:
                    k = os.preadv(fd, [view[: min(n - got, READ_MAX)]], off + got)
                    if k <= 0:
                        break
                    got += k
            except OSError:
                with self.lock:
                    self.result.errors += 1
            with self.lock:
                self.result.bytes_read += got
                self.result.extents_done += 1


def _open_regular(path: str) -> int | None:
    """An fd for reading `path`, or None when it cannot be opened or is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # never block on a FIFO or read a device
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def run(
    work: list[Extent],
    threads: int = 16,
    mbps: float = 0.0,
    deadline: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> ReplayResult:
    """Read `work` file by file on up to `threads` threads; stop at `deadline` (monotonic) or when `stop()`."""
    t0 = time.monotonic()
    if not work:
        return ReplayResult()
    pool = _Pool(work, mbps, deadline, stop)
    n = max(1, min(threads, len(pool.files)))
    readers = [threading.Thread(target=pool.worker, name=f"replay-{i}", daemon=True) for i in range(n)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    result = pool.result
    result.files = pool.opened
    result.remaining = sorted(pool.left) + [e for pieces in pool.files[pool.next_index :] for e in pieces]
    result.seconds = time.monotonic() - t0
    return result


def replay(
    rec: Record,
    threads: int = 16,
    mbps: float = 0.0,
    deadline: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> ReplayResult:
    """Check `rec` against the files, then read what is still fresh (see `run`)."""
    t0 = time.monotonic()
    work, staleness = plan(rec)
    result = run(work, threads=threads, mbps=mbps, deadline=deadline, stop=stop)
    result.staleness = staleness
    result.seconds = time.monotonic() - t0
    return result
