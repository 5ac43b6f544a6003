"""THE read engine for striped checkpoints, shared by `pull` and the FUSE mount.

- **Parallel ranged reads across stripes.** A read of logical bytes [lo, hi) becomes one fetch per
  cell, run on a thread pool; consecutive cells live on different stripes, so a large read pulls from
  every target at once.
- **Read-ahead that follows sequential readers.** Each stream (an open file in the mount, the
  writer in `pull`) remembers where its last read ended; a read that continues it doubles the
  stream's window (up to `readahead`), and the cells ahead of it are fetched in the background.
- **One global memory bound.** Verified cells are kept in one LRU shared by every stream, and the
  bytes held (cached + in flight) stay under `memory` bytes: read-ahead is only started when it fits,
  cells already consumed are evicted first. A demand read always proceeds (it is what the caller
  waits for), so the bound can be exceeded by at most the reads in progress.
- **Retries.** A failed ranged read (connection reset, timeout, a server restarting, which may
  briefly answer "not found") is retried with backoff on a freshly opened handle, a few times. A
  stripe that has run out of retries fails the reads queued for it at once for `down_s`, so a dead
  server costs a reader one retry cycle, not one per queued cell.
- **A deadline on each request.** A store that takes a ranged read and then sends nothing (a hung
  proxy, an overloaded server) held each attempt for the S3 client's low-speed timeout times its own
  attempts (3 x 60 s), and every retry again: `ckpt pull`, the checkpoint stage before exec and a read
  through the mount waited minutes (the stage: 802 s). Each open and read of a store's stripe now waits at most
  `storeguard.STALL_S` (`within`); one that overruns marks the stripe down (its retries and queued
  reads fail at once, so the caller gets its error in about `STALL_S`: the stage starts without the
  checkpoint, the mount answers EIO) and its store (the start's later stages do not ask it again). A
  stripe keeps a breaker of its own: a failed small request elsewhere (the store's breaker) does not
  stop its retries, so a link cut is still ridden out, and a cut shorter than `STALL_S` by the
  request itself.
- **Checksums.** Every cell is checked against the manifest before anyone sees it. A mismatch is an
  `IntegrityError`, which the mount turns into EIO: never silent bad bytes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..errors import IntegrityError, StoreError
from ..store.core import blob_path
from ..store.guard import STALL_S, Breaker, Ranged
from .layout import FileEntry, Manifest

if TYPE_CHECKING:
    from ..store.core import Store
    from .catalog import Targets


@functools.cache
def read_errors() -> tuple[type[Exception], ...]:
    """What a ranged read fails with when the stripe's server, disk or network does.

    OS errors (local files, sockets, and pyarrow's ArrowIOError, which is one), the store's own
    errors (a missing or short stripe), and the rest of pyarrow's ArrowException family. pyarrow is
    imported when a read first fails, not when this module loads (the mount's `--help` stays fast).
    """
    from pyarrow.lib import ArrowException

    return (OSError, StoreError, ArrowException)


class StripeSource(Protocol):
    def read_at(self, offset: int, n: int) -> bytes: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


class _StripeBreaker(Breaker):
    """A stripe's own breaker: tripped only by a read that overran its deadline, which also marks the
    stripe's store down."""

    def __init__(self, store: Breaker) -> None:
        super().__init__()
        self._store = store

    def down(self, reason: str) -> None:
        super().down(reason)
        self._store.down(reason)


class StoreStripe:
    """Ranged reads of one stripe object on its target (pyarrow's ReadAt is thread-safe), each waited for
    at most `storeguard.STALL_S`."""

    def __init__(self, store: Store, digest: str, index: int) -> None:
        self.store = store
        self.rel = blob_path(digest)
        self.index = index
        self._f: Ranged | None = None
        self._lock = threading.Lock()
        self._breaker = _StripeBreaker(store.breaker)
        self._what = f"stripe {index} of a checkpoint"

    def _handle(self) -> Ranged:
        with self._lock:
            if self._f is None:
                try:
                    self._f = self.store.open_ranged(self.rel, self._what, self._breaker)
                except OSError:
                    self._raise_if_stalled()
                    raise
                except StoreError:
                    if self._is_missing():  # worth naming: a removed checkpoint, not a flaky server
                        raise MissingStripe(
                            f"stripe {self.index} ({self.rel}) is missing on {self.store.uri}"
                        ) from None
                    raise
            return self._f

    def _is_missing(self) -> bool:
        """Whether the stripe object is known to be absent (an unreachable server: not known)."""
        try:
            return not self.store.exists(self.rel)
        except StoreError:
            return False

    def _raise_if_stalled(self) -> None:
        """Raise StripeStalled while a request of this stripe has lately overrun its deadline."""
        if self._breaker.is_down():
            raise StripeStalled(
                f"stripe {self.index} ({self.store.uri}): the store sent nothing for {STALL_S:g} s; given up"
            ) from None

    def read_at(self, offset: int, n: int) -> bytes:
        self._raise_if_stalled()
        f = self._handle()
        try:
            return f.read_at(n, offset)
        except read_errors():
            with self._lock:  # the next attempt opens a fresh handle; others may still use this one
                if self._f is f:
                    self._f = None
            self._raise_if_stalled()
            raise

    def reset(self) -> None:
        pass  # a failed handle was already dropped by read_at (closing it would break other readers)

    def close(self) -> None:
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            with contextlib.suppress(*read_errors()):
                f.close()


class FileStripe:
    """A stripe already on local disk (fetched whole, e.g. from the swarm): plain pread."""

    def __init__(self, path: str, index: int) -> None:
        self.fd = os.open(path, os.O_RDONLY)  # an open fd survives the cache evicting the file
        self.index = index

    def read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def reset(self) -> None:
        pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class StripeError(StoreError):
    """A read failure that already names its stripe (reported as it is, not wrapped)."""


class MissingStripe(StripeError):
    """A stripe object is not on its target."""


class StripeStalled(StripeError):
    """A request of the stripe brought nothing for `STALL_S`: not retried (each retry would wait as long)."""


@dataclass
class ReaderOptions:
    memory: int = 512 << 20  # global bound for buffered cells (cached + in flight)
    readahead: int = 0  # per-stream maximum window in bytes; 0: 32 rows of cells, within memory/2
    threads: int = 0  # fetch threads; 0: 16 per stripe, 16 to 64
    retries: int = 3  # re-tries of a failed ranged read (so 4 attempts)
    backoff_s: float = 0.2  # first retry delay, doubled each time
    run_bytes: int = 8 << 20  # read-ahead fetches up to this many bytes of one stripe per request
    down_s: float = 2.0  # after a stripe exhausts its retries, its queued reads fail at once this long


@dataclass
class _Stream:
    next: int = -1  # logical offset where the last read ended
    window: int = 0  # current read-ahead in cells


class Reader:
    def __init__(self, manifest: Manifest, sources: list[StripeSource], opts: ReaderOptions | None = None) -> None:
        self.m = manifest
        self.sources = sources
        self.opts = opts or ReaderOptions()
        k, cell = manifest.k, manifest.cell_size
        self.threads = self.opts.threads or min(64, max(16, 16 * k))
        memory_cells = max(2, self.opts.memory // cell)
        window = self.opts.readahead // cell if self.opts.readahead else 32 * k
        self.max_window = max(1, min(window, memory_cells // 2))
        self.run_cells = max(1, self.opts.run_bytes // cell)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ckpt-read")
        # Re-entrant: a future that is already done runs its callback (which locks) in add_done_callback.
        self.lock = threading.RLock()
        self.cache: OrderedDict[int, bytes] = OrderedDict()
        self.ahead: set[int] = set()  # cached or in flight by read-ahead, not read yet
        self.inflight: dict[int, Future[bytes]] = {}
        self.cached_bytes = 0
        self.inflight_bytes = 0
        self.ahead_bytes = 0
        self.streams: dict[Hashable | None, _Stream] = {}
        self.down: dict[int, tuple[float, str]] = {}  # stripe -> (until, error) after retries ran out
        self.stats = {"fetched": 0, "bytes": 0, "retries": 0, "hits": 0, "prefetched": 0}
        self.closed = False

    # ---- fetching ------------------------------------------------------------------------------
    def _read_range(self, s: int, off: int, n: int) -> bytes:
        """`n` bytes at `off` of stripe `s`, retried with backoff on transient failures."""
        src = self.sources[s]
        attempt = 0
        while True:
            down = self.down.get(s)
            if down is not None and down[0] > time.monotonic():
                raise StoreError(down[1])  # fail fast: this stripe just failed all its retries
            try:
                data = src.read_at(off, n)
                if len(data) != n:
                    raise StripeError(f"stripe {s}: short read at {off} ({len(data)} of {n} bytes): truncated stripe")
                return data
            except StripeStalled as e:
                self.down[s] = (time.monotonic() + self.opts.down_s, str(e))
                raise
            except read_errors() as e:
                if self.closed or attempt >= self.opts.retries:
                    err = e if isinstance(e, StripeError) else None
                    msg = str(e) if err else f"stripe {s}: read failed after {attempt + 1} attempts: {e}"
                    # Queued reads of this stripe fail at once for a moment instead of each waiting out
                    # its own retries: a reader gets its EIO in seconds, not minutes.
                    self.down[s] = (time.monotonic() + self.opts.down_s, msg)
                    raise err or StoreError(msg) from None
                attempt += 1
                with self.lock:
                    self.stats["retries"] += 1
                src.reset()
                time.sleep(self.opts.backoff_s * (2 ** (attempt - 1)))

    def _verified(self, c: int, data: bytes, reread: bool = True) -> bytes:
        if hashlib.sha256(data).hexdigest() == self.m.cells[c]:
            return data
        if reread:  # one re-read, in case the bytes were damaged in transit
            s, off, n = self.m.cell_location(c)
            return self._verified(c, self._read_range(s, off, n), reread=False)
        s, off, _ = self.m.cell_location(c)
        raise IntegrityError(
            f"checkpoint {self.m.name}:{self.m.tag}: cell {c} (stripe {s}, offset {off}) does not match its checksum"
        )

    def _fetch(self, c: int) -> bytes:
        s, off, n = self.m.cell_location(c)
        return self._verified(c, self._read_range(s, off, n))

    def _fetch_run(self, cells: list[int], futs: list[Future[bytes]]) -> None:
        """Read-ahead of consecutive cells of one stripe in one ranged request, then split and verify.

        One request per run instead of per cell: fewer round trips and less per-request work on
        the servers, which is what limits a reader when they are busy.
        """
        s, off, _ = self.m.cell_location(cells[0])
        sizes = [self.m.cell_len(c) for c in cells]
        try:
            data = self._read_range(s, off, sum(sizes))
        except BaseException as e:
            for f in futs:
                f.set_exception(e)
            return
        pos = 0
        for c, n, f in zip(cells, sizes, futs, strict=True):
            try:
                f.set_result(self._verified(c, data[pos : pos + n]))
            except BaseException as e:
                f.set_exception(e)
            pos += n

    def _done(self, c: int, fut: Future[bytes]) -> None:
        n = self.m.cell_len(c)
        with self.lock:
            self.inflight.pop(c, None)
            self.inflight_bytes -= n
            if not fut.cancelled() and fut.exception() is None and not self.closed:
                self.cache[c] = fut.result()
                self.cached_bytes += n
                if c in self.ahead:
                    self.ahead_bytes += n
                self.stats["fetched"] += 1
                self.stats["bytes"] += n
                self._evict(0)
            else:
                self.ahead.discard(c)

    def _unahead(self, c: int) -> None:
        """`c` was read (or dropped): it no longer counts as read-ahead (lock held)."""
        if c in self.ahead:
            self.ahead.discard(c)
            if c in self.cache:
                self.ahead_bytes -= len(self.cache[c])

    def _drop(self, c: int) -> None:
        self._unahead(c)
        self.cached_bytes -= len(self.cache.pop(c))

    def _evict(self, need: int) -> None:
        """Drop cached cells until `need` more bytes fit the bound: read ones first, oldest first (lock held)."""
        limit = self.opts.memory - need
        if self.cached_bytes + self.inflight_bytes <= limit:
            return
        for c in [c for c in self.cache if c not in self.ahead]:
            if self.cached_bytes + self.inflight_bytes <= limit:
                return
            self._drop(c)
        for c in list(self.cache):  # read-ahead nobody came for: oldest first
            if self.cached_bytes + self.inflight_bytes <= limit:
                return
            self._drop(c)

    def _start(self, c: int, prefetch: bool) -> Future[bytes] | None:
        """A future for cell `c` (lock held); None when read-ahead does not fit the memory bound.

        Bytes held = cached + in flight. Read-ahead is admitted while the read-ahead already cached
        plus everything in flight fits the bound, so it only ever displaces cells that were read.
        """
        if c in self.cache:
            if prefetch:
                return None
            fut: Future[bytes] = Future()
            self.cache.move_to_end(c)
            self._unahead(c)
            self.stats["hits"] += 1
            fut.set_result(self.cache[c])
            return fut
        if c in self.inflight:
            if not prefetch:
                self.ahead.discard(c)
            return self.inflight[c]
        n = self.m.cell_len(c)
        if prefetch:
            if self.ahead_bytes + self.inflight_bytes + n > self.opts.memory:
                return None
            self.ahead.add(c)
            self.stats["prefetched"] += 1
        self._evict(n)
        self.inflight_bytes += n
        fut = self.pool.submit(self._fetch, c)
        self.inflight[c] = fut
        fut.add_done_callback(functools.partial(self._done, c))
        return fut

    def _prefetch(self, cells: range) -> None:
        """Start read-ahead of `cells` (lock held), as runs of consecutive cells per stripe."""
        missing = [c for c in cells if c not in self.cache and c not in self.inflight]
        # Top up in batches (a few cells per stripe), not one cell per small read: runs stay long.
        if len(missing) < min(len(cells) // 4, 4 * self.m.k) and cells and cells[-1] != self.m.n_cells - 1:
            return
        admitted: list[int] = []
        for c in missing:
            n = self.m.cell_len(c)
            if self.ahead_bytes + self.inflight_bytes + n > self.opts.memory:
                break
            self.ahead.add(c)
            self.stats["prefetched"] += 1
            self._evict(n)
            self.inflight_bytes += n
            self.inflight[c] = Future()
            admitted.append(c)
        k = self.m.k
        runs: dict[int, list[int]] = {}
        for c in admitted:  # logical order, so each stripe's runs are in stripe order
            run = runs.setdefault(c % k, [])
            if run and (c - run[-1] != k or len(run) >= self.run_cells):
                self._submit_run(run)
                run = runs[c % k] = []
            run.append(c)
        for run in runs.values():
            if run:
                self._submit_run(run)

    def _submit_run(self, run: list[int]) -> None:
        futs = [self.inflight[c] for c in run]
        for c, f in zip(run, futs, strict=True):
            f.add_done_callback(functools.partial(self._done, c))
        self.pool.submit(self._fetch_run, list(run), futs)

    # ---- reading -------------------------------------------------------------------------------
    def read(self, lo: int, hi: int, stream: Hashable | None = None) -> bytes:
        """Logical bytes [lo, hi) (clamped to the stream's end), verified."""
        parts = self.read_parts(lo, hi, stream)
        if not parts:
            return b""
        if len(parts) == 1:
            whole = parts[0].obj
            return whole if isinstance(whole, bytes) and len(parts[0]) == len(whole) else bytes(parts[0])
        return b"".join(parts)

    def read_parts(self, lo: int, hi: int, stream: Hashable | None = None) -> list[memoryview]:
        """Like `read`, as views of the cells (no copy: `pull` writes them out as they are)."""
        if self.closed:
            raise StoreError("reader closed")
        hi = min(hi, self.m.total_size)
        if hi <= lo:
            return []
        cells = self.m.cells_in(lo, hi)
        with self.lock:
            futs = [self._start(c, prefetch=False) for c in cells]
            self._readahead(stream, lo, hi)
        parts = []
        cell = self.m.cell_size
        for c, fut in zip(cells, futs, strict=True):
            assert fut is not None
            data = fut.result()
            start = max(lo - c * cell, 0)
            end = min(hi - c * cell, len(data))
            parts.append(memoryview(data)[start:end])
        return parts

    def _readahead(self, stream: Hashable | None, lo: int, hi: int) -> None:
        """Grow the window of a stream that reads on from where it stopped; fetch ahead of it (lock held)."""
        st = self.streams.get(stream)
        if st is None:
            st = self.streams[stream] = _Stream()
        cell = self.m.cell_size
        # A new stream starts with a small window; one that reads on from where it stopped doubles it.
        sequential = st.next < 0 or st.next - 4 * cell <= lo <= st.next + self.m.k * cell
        if sequential:
            st.window = min(self.max_window, max(self.m.k, st.window * 2))
        else:
            st.window = 0
        st.next = hi
        if not st.window:
            return
        first = (hi - 1) // cell + 1
        self._prefetch(range(first, min(self.m.n_cells, first + st.window)))

    def forget(self, stream: Hashable | None) -> None:
        with self.lock:
            self.streams.pop(stream, None)

    def pread(self, entry: FileEntry, offset: int, size: int, stream: Hashable | None = None) -> bytes:
        """Bytes [offset, offset+size) of one file of the checkpoint."""
        if offset >= entry.size or size <= 0:
            return b""
        end = min(entry.size, offset + size)
        return self.read(entry.offset + offset, entry.offset + end, stream)

    def pread_parts(self, entry: FileEntry, offset: int, size: int, stream: Hashable | None = None) -> list[memoryview]:
        if offset >= entry.size or size <= 0:
            return []
        end = min(entry.size, offset + size)
        return self.read_parts(entry.offset + offset, entry.offset + end, stream)

    def close(self) -> None:
        self.closed = True
        self.pool.shutdown(wait=True, cancel_futures=True)
        for s in self.sources:
            s.close()
        with self.lock:
            self.cache.clear()
            self.ahead.clear()
            self.cached_bytes = self.ahead_bytes = 0


def open_reader(manifest: Manifest, targets: Targets, opts: ReaderOptions | None = None) -> Reader:
    """A reader over the stripes on their targets."""
    sources: list[StripeSource] = [
        StoreStripe(targets.get(ref.target), ref.digest, i) for i, ref in enumerate(manifest.stripes)
    ]
    return Reader(manifest, sources, opts)
