"""Replay a hot-block record: read its extents so the start finds them in the page cache.

Reads go in the grain of a lazy loader: every open file handle sees one forward stream, its extents
in offset order (a loader that streams ranged GETs restarts its stream on every out-of-order read: 64
threads on 1 MiB pieces of one file cost rclone 4.6x the bytes and 4x the time of one sequential
reader). A file with more than `SEGMENT` bytes recorded is cut into contiguous segments of at least
that size, each read through its own handle: one stream per segment, so one large library (104 of
the 877 chunks `import torch` reads are in libtorch_cpu.so) is not fetched one round trip at a time
while the other readers sit idle. Parallelism is across files and segments: a bounded pool takes the
next one.

How many streams run at once is adapted to what the backend delivers (`_Gate`): it starts at
`START_STREAMS`, doubles while each doubling still raises the reads served per second by `GAIN`
(judged from how long each read takes), and steps back and settles at the first doubling that does
not: a latency-bound loader grows to every thread it is given, a bandwidth-bound one stops where its
link is full (and leaves the rest of the link to the program when the replay runs behind it).

Reads go into a reused per-thread buffer with `preadv`, at most `READ_MAX` at a time (nothing is
kept: the point is the page cache, or the loader's own cache). A bandwidth cap (a virtual clock
shared by the threads) keeps replay from starving the program when they run side by side. A deadline
stops taking new work; what is left is returned so the agent can finish it behind the program.

Stale files (size or mtime changed, gone, no longer regular) are skipped before any read, so a
stale record costs one `stat` per file and nothing else. Into a loader's own cache the stage checks
beside the reads (`run(ready=)`, freshness.py): each stream waits for its own file's stat, not all.

Into a loader's own disk cache (`into_loader`: rclone `--vfs-cache-mode full` and the like, where the
kernel drops a file's pages at every open) two things change, both measured on `import torch`'s record
(80 MB, 756 files) through rclone v1.75.2 (issue 28, docs/notes/hotblocks.md run 12):

- The longest streams first where the replay holds the program back (`wide`): what counts there is
  when the last stream ends, and in record order `import torch`'s two libraries (62 MB in 7 streams)
  started after its 754 small files, 1.3-3.0 s into a 3-5 s replay. Elsewhere the record's order stays
  (a replay into the page cache, or behind the program, follows the order the program asks).
- `POSIX_FADV_RANDOM` on every fd: the kernel's readahead past the end of each extent is a request to
  the loader, which fetches it into its cache for nobody (the pages themselves are dropped at the
  program's open). rclone fetched 9.4 MB for 6.3 MB of sparse 256 KiB extents 2 MiB apart, the 6.3 MB
  with the advice; 3 MB less on torch's record.
- What rclone fetches beyond that is its own doing, and no read order removes it without sending more
  over the wire: a read within 1 MiB past where a download stream stands joins that stream, which
  fetches the gap too (torch's record: 32 MB of gaps under 1 MiB); a read anywhere else starts a new
  ranged GET and leaves the old stream's response in flight (up to the rest of its chunk, 4-5 MB with
  rclone's default 128 MiB chunks). Each file's extents in descending order kept rclone's own fetches
  to 85 MB (from 114) but the bucket sent 690 MB (from 269 MB) with default chunks: ascending, one
  stream per file or segment, moves the fewest bytes over the wire, so it stays.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .record import Record, Staleness, check, stat_many

# Reads are cut at 1 MiB boundaries of the file: large enough to be cheap per byte, aligned with the
# chunks lazily loaded images fetch (stargz, SOCI and our test filesystem use 1 MiB or more), and
# small enough that 64 threads' buffers cost 64 MiB.
READ_MAX = 1 << 20

# A file with more recorded bytes than this is read as several forward streams of at least this
# size: 8 chunks of a lazy image, so a loader streaming ranged GETs still gets long sequential runs.
SEGMENT = 8 << 20
# The stream gate: start with this many streams at once, double while a doubling raises the rate by
# GAIN, judged over windows of at least WINDOW_S seconds on at least MIN_READS reads of a size class
# (reads of LARGE bytes and up, or smaller ones: a chunk of a library against a small file).
START_STREAMS = 16
GAIN = 1.15
WINDOW_S = 0.1
MIN_READS = 4
LARGE = 512 << 10

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
    streams: list[int] = field(default_factory=list)  # the gate's limits, in the order it took them
    stats_left: bool = False  # the stats beside the reads (`run(stats=)`) had not all ended by the deadline

    @property
    def done(self) -> bool:
        return not self.remaining


def plan(rec: Record) -> tuple[list[Extent], Staleness]:
    """The reads to do for `rec` (stale files left out, long extents cut at READ_MAX), and the staleness."""
    staleness, fresh = check(rec)
    return cut(rec, fresh), staleness


def cut(rec: Record, keep: set[str] | None = None) -> list[Extent]:
    """`rec`'s extents (only those of the files in `keep`, unless None) cut at READ_MAX boundaries."""
    work: list[Extent] = []
    for path, off, n in rec.extents:
        if keep is not None and path not in keep:
            continue
        while n > 0:
            step = min(n, READ_MAX - off % READ_MAX)  # aligned pieces: one per chunk of a lazy image
            work.append((path, off, step))
            off += step
            n -= step
    return work


def sources_of(rec: Record, staleness: Staleness) -> list[str]:
    """`dir/mod.py` for each fresh `dir/__pycache__/mod.<tag>.pyc` of `rec` that the record does not list.

    Python's import stats the source of every `.pyc` it loads, and on a loader that answers a stat with
    a request (rclone asks the bucket for each object's mtime) that is one round trip per module: 242
    HEADs, 1.7 s of a start after a replay against 0.3 s warm. `run` stats these beside the reads."""
    stale = set(staleness.stale_files)
    return source_paths([p for p in rec.files if p not in stale], set(rec.files))


def source_paths(paths: list[str], listed: set[str]) -> list[str]:
    """`dir/mod.py` for each `dir/__pycache__/mod.<tag>.pyc` in `paths` that is not in `listed` (sorted)."""
    out = []
    for path in sorted(paths):
        head, name = os.path.split(path)
        if name.endswith(".pyc") and os.path.basename(head) == "__pycache__":
            source = os.path.join(os.path.dirname(head), name.split(".", 1)[0] + ".py")
            if source not in listed:
                out.append(source)
    return out


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


class _Gate:
    """How many streams may read at once, adapted to what the backend delivers (see the module doc).

    Readers hold a slot for a whole file or segment, and report how long each read took (its wait for
    the bandwidth cap included). By Little's law the streams deliver `limit / mean read time` reads per
    second, so a doubling pays when the mean time of a read grows by less than `2 / GAIN`: a
    latency-bound loader serves twice the reads in the same time, a full link takes twice as long for
    each. Read times are compared within a size class (`LARGE` and up, or below), so a window of small
    `.pyc` files is never judged against a window of library chunks. Every `WINDOW_S` the last window is
    judged: a doubling that paid is followed by another, one that did not is undone and the gate settles.
    A window that ends with fewer streams busy than allowed (the work is running out) changes nothing;
    one with no size class in common with the window before it counts as paid: more streams than the
    link needs cost a replay nothing but connections, fewer than the loader needs cost round trips.
    """

    def __init__(self, most: int, start: int = START_STREAMS) -> None:
        self.most = max(1, most)
        self.limit = min(self.most, max(1, start))
        self.settled = self.limit >= self.most
        self.prev_limit = self.limit
        self.prev_means: dict[bool, float] = {}
        self.active = 0
        self.window_start = time.monotonic()
        self.window: dict[bool, list[float]] = {False: [], True: []}
        self.cond = threading.Condition()
        self.steps: list[int] = [self.limit]

    def enter(self, stopped: Callable[[], bool]) -> bool:
        """Wait for a slot; False when `stopped()` says so first."""
        with self.cond:
            while self.active >= self.limit:
                if stopped():
                    return False
                self.cond.wait(0.05)
            self.active += 1
            return True

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify()

    def count(self, n: int, seconds: float) -> None:
        """A read of `n` bytes took `seconds`; at the end of a window, judge the limit."""
        with self.cond:
            if self.settled:
                return
            self.window[n >= LARGE].append(seconds)
            now = time.monotonic()
            if now - self.window_start < WINDOW_S:
                return
            means = {k: sum(v) / len(v) for k, v in self.window.items() if len(v) >= MIN_READS}
            if not means:
                return  # too few reads yet to judge: the window goes on
            self.window_start, self.window = now, {False: [], True: []}
            if self.active < max(1, self.limit * 3 // 4):
                return
            before = self.limit
            self._judge(means)
            if self.limit != before:
                self.steps.append(self.limit)
                self.cond.notify_all()

    def _judge(self, means: dict[bool, float]) -> None:
        """Undo the last doubling if the reads it added took as long as the ones before; else double."""
        common = [k for k in (True, False) if k in means and k in self.prev_means]
        if self.limit > self.prev_limit and common:
            k = common[0]
            slower = means[k] / max(self.prev_means[k], 1e-6)
            if slower > (self.limit / self.prev_limit) / GAIN:
                self.limit, self.settled = self.prev_limit, True
                return
        self.prev_limit, self.prev_means = self.limit, means
        self.limit = min(self.most, self.limit * 2)
        self.settled = self.limit == self.prev_limit


def _segments(pieces: list[Extent]) -> list[list[Extent]]:
    """One file's pieces (in offset order) cut into contiguous runs of at least `SEGMENT` bytes; a short
    tail joins the run before it, so no stream is opened for a few pages."""
    out: list[list[Extent]] = []
    run: list[Extent] = []
    size = 0
    for piece in pieces:
        run.append(piece)
        size += piece[2]
        if size >= SEGMENT:
            out.append(run)
            run, size = [], 0
    if run:
        if out and size < SEGMENT // 2:
            out[-1].extend(run)
        else:
            out.append(run)
    return out


class _Pool:
    """The state the reader threads share: the streams still to read (a file, or a segment of a large
    one, in record order, or the longest first: `longest_first`), the gate, and the tallies.

    One lock guards it; it is held only to take the next stream or to count, never across a read.
    """

    def __init__(
        self,
        work: list[Extent],
        threads: int,
        mbps: float,
        deadline: float | None,
        stop: Callable[[], bool] | None,
        start: int = START_STREAMS,
        longest_first: bool = False,
        random: bool = False,
        ready: Callable[[str], bool | None] | None = None,
    ) -> None:
        by_file: dict[str, list[Extent]] = {}
        for extent in work:
            by_file.setdefault(extent[0], []).append(extent)
        self.jobs = [seg for pieces in by_file.values() for seg in _segments(sorted(pieces, key=lambda e: e[1]))]
        if longest_first:  # stable: equal streams keep the record's order
            self.jobs.sort(key=lambda pieces: -sum(e[2] for e in pieces))
        self.random = random
        self.ready = ready
        self.deadline = deadline
        self.stop = stop
        self.throttle = _Throttle(mbps)
        self.gate = _Gate(min(threads, len(self.jobs)), start)
        self.lock = threading.Lock()
        self.next_index = 0
        self.opened: set[str] = set()
        self.left: list[Extent] = []
        self.result = ReplayResult()

    def stopped(self) -> bool:
        return (self.deadline is not None and time.monotonic() >= self.deadline) or (
            self.stop is not None and self.stop()
        )

    def take(self) -> list[Extent] | None:
        """The next stream's extents, or None when the work is done, the deadline passed or `stop()` said so."""
        with self.lock:
            if self.next_index >= len(self.jobs) or self.stopped():
                return None
            pieces = self.jobs[self.next_index]
            self.next_index += 1
            return pieces

    def worker(self) -> None:
        """One reader thread: hold a slot of the gate, take a stream, read it in order, until `take` says stop."""
        view = memoryview(bytearray(READ_MAX))
        while self.gate.enter(self.stopped):
            try:
                pieces = self.take()
                if pieces is None:
                    return
                if self.ready is not None and not self._fresh(pieces):
                    continue
                fd = _open_regular(pieces[0][0])
                if fd is None:
                    with self.lock:
                        self.result.errors += 1
                    continue
                if self.random:
                    _no_readahead(fd)
                try:
                    self._read_stream(fd, pieces, view)
                finally:
                    os.close(fd)
            finally:
                self.gate.leave()

    def _fresh(self, pieces: list[Extent]) -> bool:
        """Wait for the check of this stream's file (`run(ready=)`): False for a stale file (never read),
        and for one the deadline passed while waiting for, fresh or not yet checked (left for later, as not
        taken: the stage hands the agent all of it but the files found stale)."""
        assert self.ready is not None
        fresh = self.ready(pieces[0][0])
        if fresh is False:
            return False
        if fresh is None or self.stopped():
            with self.lock:
                self.left.extend(pieces)
            return False
        return True

    def _read_stream(self, fd: int, pieces: list[Extent], view: memoryview) -> None:
        """Read one stream's extents front to back; a deadline in the middle leaves the rest for later."""
        with self.lock:
            self.opened.add(pieces[0][0])
        for i, (_path, off, n) in enumerate(pieces):
            if i and self.stopped():
                with self.lock:
                    self.left.extend(pieces[i:])
                return
            t0 = time.monotonic()
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
            self.gate.count(got, time.monotonic() - t0)


def _no_readahead(fd: int) -> None:
    """Tell the kernel not to read ahead on `fd` (`into_loader` in the module doc); advice only."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


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
    stats: list[str] | None = None,
    wide: bool = False,
    into_loader: bool = False,
    ready: Callable[[str], bool | None] | None = None,
) -> ReplayResult:
    """Read `work` file by file on up to `threads` threads; stop at `deadline` (monotonic) or when `stop()`.
    `stats`: paths to stat on a thread beside the reads (`sources_of`), waited for until `deadline`.
    `wide`: every thread's stream at once from the start, no gate: for a replay that holds the program
    back (the stage's, before exec), where nothing else wants the link and every round trip the gate
    spends finding its width is the start's (issue 28: beside the stage's own stats, the gate judged a
    latency-bound rclone "full" at 32 streams by the stats' load, settled at 16, and 402 small files took
    0.9 s). `into_loader`: the replay fills a loader's own disk cache, not the page cache: no readahead,
    and with `wide` the longest streams first (module doc). `ready(path)`: the staleness check running
    beside the reads (`freshness.Check.answer`), asked before a stream's file is opened: it waits for that
    file's stat and says whether it is still fresh; a stale file is skipped, never read, and one not
    checked by the deadline (None) is left in `remaining`. Without it `work` holds fresh files only
    (`plan`)."""
    t0 = time.monotonic()
    stat_thread = threading.Thread(target=stat_many, args=(stats,), name="replay-stat", daemon=True) if stats else None
    if stat_thread is not None:
        stat_thread.start()
    if not work:
        return _joined(stat_thread, deadline, ReplayResult())
    start = threads if wide else START_STREAMS
    pool = _Pool(work, threads, mbps, deadline, stop, start, wide and into_loader, into_loader, ready)
    n = pool.gate.most
    readers = [threading.Thread(target=pool.worker, name=f"replay-{i}", daemon=True) for i in range(n)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    result = _joined(stat_thread, deadline, pool.result)
    result.files = len(pool.opened)
    result.streams = pool.gate.steps
    result.remaining = sorted(pool.left) + [e for pieces in pool.jobs[pool.next_index :] for e in pieces]
    result.seconds = time.monotonic() - t0
    return result


def _joined(stat_thread: threading.Thread | None, deadline: float | None, result: ReplayResult) -> ReplayResult:
    """`result`, once `stat_thread` has ended or the deadline passed (`stats_left` says which)."""
    if stat_thread is not None:
        stat_thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        result.stats_left = stat_thread.is_alive()
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
    result = run(work, threads=threads, mbps=mbps, deadline=deadline, stop=stop, stats=sources_of(rec, staleness))
    result.staleness = staleness
    result.seconds = time.monotonic() - t0
    return result
