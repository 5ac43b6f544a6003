"""Replay a hot-block record: read its extents in parallel so the start finds them in the page cache.

On a lazily loaded image every import is a round trip; here the same bytes are asked for by a
bounded pool of threads in large aligned reads (`READ_MAX`), so the round trips overlap. Reads go
into a reused per-thread buffer with `preadv` (nothing is kept: the point is the page cache). A
bandwidth cap (a virtual clock shared by the threads) keeps replay from starving the program when
they run side by side. A deadline stops taking new work; what is left is returned so the agent can
finish it behind the program.

Stale files (size or mtime changed, gone, no longer regular) are skipped before any read, so a
stale record costs one `stat` per file and nothing else.
"""

from __future__ import annotations

import contextlib
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
    """The state the reader threads share: the work list and its cursor, open fds, and the tallies.

    One lock guards all of it; it is held only to take the next extent or to count, never across a read.
    """

    def __init__(
        self, work: list[Extent], mbps: float, deadline: float | None, stop: Callable[[], bool] | None
    ) -> None:
        self.work = work
        self.deadline = deadline
        self.stop = stop
        self.throttle = _Throttle(mbps)
        self.lock = threading.Lock()
        self.fds: dict[str, int] = {}
        self.bad: set[str] = set()
        self.next_index = 0
        self.result = ReplayResult()

    def fd_for(self, path: str) -> int | None:
        """An fd for `path`, opened once and shared; None (counted as an error once) when it cannot be read."""
        with self.lock:
            if path in self.bad:
                return None
            fd = self.fds.get(path)
            if fd is not None:
                return fd
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # never block on a FIFO or read a device
                    os.close(fd)
                    raise OSError("not a regular file")
            except OSError:
                self.bad.add(path)
                self.result.errors += 1
                return None
            self.fds[path] = fd
            return fd

    def take(self) -> Extent | None:
        """The next extent to read, or None when the work is done, the deadline passed or `stop()` said so."""
        with self.lock:
            if self.next_index >= len(self.work):
                return None
            if (self.deadline is not None and time.monotonic() >= self.deadline) or (
                self.stop is not None and self.stop()
            ):
                return None
            extent = self.work[self.next_index]
            self.next_index += 1
            return extent

    def worker(self) -> None:
        """One reader thread: take extents and read them into a reused buffer until `take` says stop."""
        view = memoryview(bytearray(READ_MAX))
        while (extent := self.take()) is not None:
            path, off, n = extent
            fd = self.fd_for(path)
            if fd is None:
                continue
            self.throttle.take(n)
            got = 0
            try:
                while got < n:
                    k = os.preadv(fd, [view[: n - got]], off + got)
                    if k <= 0:
                        break
                    got += k
            except OSError:
                with self.lock:
                    self.result.errors += 1
            with self.lock:
                self.result.bytes_read += got
                self.result.extents_done += 1

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def run(
    work: list[Extent],
    threads: int = 16,
    mbps: float = 0.0,
    deadline: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> ReplayResult:
    """Read `work` with `threads` threads; stop taking work at `deadline` (monotonic) or when `stop()`."""
    t0 = time.monotonic()
    if not work:
        return ReplayResult()
    pool = _Pool(work, mbps, deadline, stop)
    readers = [threading.Thread(target=pool.worker, name=f"replay-{i}", daemon=True) for i in range(max(1, threads))]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    pool.close()
    result = pool.result
    result.files = len(pool.fds)
    result.remaining = work[pool.next_index :]
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
