"""A store that stopped answering is not asked again for a while, and its small requests give up soon.

Issue 29 bounds what a start waits for its store: the job starts within `[p2p] deadline_s` (+5 s) of
`bootseer exec` whatever the store does. Closed ports were tested; a store that takes the connection
and then never answers (a hung load balancer or proxy) was not. There each request cost the S3 SDK's
low-speed timeout (60 s, set for large transfers from a busy server) times its three attempts, and
every stage paid again: `bootseer exec` with the env and image stages took 363 s before the job ran,
and 63 s where the endpoint dropped SYNs (10 s connect timeout, three attempts, two stages).

Two parts, both per store handle (so per process), both for small requests only (refs, stats,
listings, deletes, small writes such as a run's events: `StoreFS.meta`). Blob transfers keep their
long timeout and are not guarded: their readers own their retries (the stripe reader rides out a
link cut of seconds).

- **Short timeouts** (`META_*`, applied in `fs`). On S3 the small requests go through a second
  client whose requests give up after `META_REQUEST_S` without a byte and `META_CONNECT_S` to connect,
  in `META_ATTEMPTS` attempts, so the first contact with a silent store ends in ~20 s. A URI that sets
  `request_timeout` or `connect_timeout` itself gets those for both clients.
- **A breaker** (`Breaker`). A small request that fails at the network level (the SDK's
  NETWORK_CONNECTION, a timeout, a refused or unresolvable endpoint), after the client's own retries,
  marks the store down; every small request until then fails at once with that reason, as an OSError,
  which each caller already turns into its one-line StoreError and its fallback. A start holds it down
  until exec (its agent, another process, asks again); elsewhere it is down for `DOWN_S`, then one
  request may try again, so a long-lived agent is not cut off by a blip of a restarting server. Other
  errors (not found, access denied) do not trip it: they say nothing of whether the next request is
  answered.
- **A deadline on blob reads** (`within`, `Chunks`). A store may answer the ref and then stop sending
  the blob (a hung proxy, an overloaded server). The transfers' client waits its low-speed timeout
  (60 s without a byte on S3) per attempt, three attempts: `bootseer exec` took 201 s before the job
  ran, where issue 29 promises `[p2p] deadline_s` + 5 s. Every blob read of the stages now runs in a
  daemon thread that the reader waits for at most `STALL_S` per read (a chunk of at most 4 MiB: a store
  slower than ~200 kB/s is taken for stalled, and the stage's fallback beats the blob then). A read
  that overruns marks the store down (`Breaker.down`) and fails as an OSError, which each caller turns
  into its StoreError and fallback; the abandoned thread ends with its client's timeout, or with the
  process at exec. The swarm's origin reads up to 16 MiB at once under the same deadline (0.8 MB/s:
  an origin slower than that serves its job nothing). The checkpoint's stripe reader waits as long per
  request, with a breaker per stripe (`stripe/reader.py`). Not for uploads (pyarrow's S3 writes return
  at once and the close waits for every part: no progress to judge a stall by).
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import pyarrow.fs as pafs

T = TypeVar("T")

# After a network failure, how long every small request fails at once (then one may try again): short,
# for long-lived processes (the agent) that a blip of a restarting server must not cut off for long.
DOWN_S = 15.0
# The small requests' client (S3): seconds without a byte, seconds to connect, attempts in all.
META_REQUEST_S = 10.0
META_CONNECT_S = 5.0
META_ATTEMPTS = 2
# A blob read (one chunk, or an open) that brings nothing for this long is given up (`within`, `Chunks`).
STALL_S = 20.0
# Texts of errors that mean "the store did not answer", from pyarrow's S3 (curl), GCS and HDFS clients.
NETWORK_MARKERS = (
    "NETWORK_CONNECTION",
    "Timeout was reached",
    "Connection refused",
    "Couldn't connect",
    "Could not resolve",
    "Couldn't resolve",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
)


class Breaker:
    """Whether a store is down, why, and until when (`time.monotonic`). `hold_s`: how long a failure
    keeps it down; a start holds it down until exec (`StageContext.store`)."""

    def __init__(self, hold_s: float = DOWN_S) -> None:
        self.reason = ""
        self.until = 0.0
        self.hold_s = hold_s

    def is_down(self) -> bool:
        """Whether a failure still holds the store down (`check` raises meanwhile)."""
        return bool(self.reason) and time.monotonic() < self.until

    def check(self) -> None:
        """Raise at once while the store is down."""
        if self.is_down():
            raise OSError(f"the store did not answer an earlier request ({self.reason}); not asked again for a while")

    def trip(self, e: BaseException) -> None:
        """Mark the store down when `e` says it did not answer; any other error leaves it up."""
        text = str(e)
        marker = next((m for m in NETWORK_MARKERS if m in text), None)
        if marker is not None:
            curl = re.search(r"curlCode: \d+, [^;.]*", text)  # "curlCode: 28, Timeout was reached"
            self.reason = curl.group(0) if curl else marker
            self.until = time.monotonic() + self.hold_s

    def down(self, reason: str) -> None:
        """Mark the store down for `reason` (a read that overran its deadline: no error text to go on)."""
        self.reason = reason
        self.until = time.monotonic() + self.hold_s


class Guarded:
    """A pyarrow filesystem whose every method call passes `breaker` first and trips it on failure.
    Attributes that are not methods (`type_name`, `region`) are read through unchanged."""

    def __init__(self, fs: pafs.FileSystem, breaker: Breaker) -> None:
        self._fs = fs
        self._breaker = breaker

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if not callable(attr):
            return attr
        return self._call(attr)

    def _call(self, method: Callable[..., Any]) -> Callable[..., Any]:
        breaker = self._breaker

        def call(*args: object, **kwargs: object) -> Any:
            breaker.check()
            try:
                return method(*args, **kwargs)
            except OSError as e:
                breaker.trip(e)
                raise

        return call


# Set once a read was given up: its thread is still inside the client, and pyarrow's S3 finalizer at
# exit waits for it (a command that had printed its error at 21 s ended at 200 s): `skip_s3_finalizer`.
ABANDONED = threading.Event()


def _stalled(breaker: Breaker, what: str, limit_s: float) -> OSError:
    """The error of a read that overran its deadline; the store is marked down meanwhile."""
    ABANDONED.set()
    breaker.down(f"{what}: nothing for {limit_s:g} s")
    return OSError(f"the store sent nothing for {limit_s:g} s ({what}); given up")


def within(call: Callable[[], T], breaker: Breaker, what: str, limit_s: float = STALL_S) -> T:
    """`call()` (one read of a blob, an open, a size) waited for at most `limit_s`, in a daemon thread
    that is left to its client's own timeout when it overruns (a blocked C++ read cannot be interrupted).
    The store is asked only while `breaker` says it is up."""
    breaker.check()
    box: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as e:  # handed to the waiting thread as it is
            box.append((False, e))
        finally:
            done.set()

    threading.Thread(target=run, name="bootseer-store-read", daemon=True).start()
    if not done.wait(limit_s):
        raise _stalled(breaker, what, limit_s)
    ok, value = box[0]
    if ok:
        return value
    raise value


class Ranged:
    """A blob opened for ranged reads whose open, `size()` and each `read_at` wait at most `limit_s`
    (`within`): the one way the stages, the swarm's origin and the stripe reader read parts of a blob."""

    def __init__(self, open_file: Callable[[], Any], breaker: Breaker, what: str, limit_s: float = STALL_S) -> None:
        self._breaker, self._what, self._limit = breaker, what, limit_s
        self._f = within(open_file, breaker, what, limit_s)

    def size(self) -> int:
        return int(within(self._f.size, self._breaker, self._what, self._limit))

    def read_at(self, n: int, offset: int) -> bytes:
        f = self._f
        return within(lambda: f.read_at(n, offset), self._breaker, self._what, self._limit)

    def close(self) -> None:
        """Close the file (only when no read of it may still be running: not after a read overran)."""
        self._f.close()


class Chunks:
    """A blob streamed in chunks (`with Chunks(...) as chunks: for chunk in chunks`): a daemon thread
    opens the stream and reads ahead of the consumer (two chunks at most), and the consumer waits at
    most `limit_s` for each chunk. An open or a read that overruns marks the store down and raises
    OSError; leaving the `with` stops the reader at its next chunk."""

    def __init__(
        self, open_stream: Callable[[], Any], chunk: int, breaker: Breaker, what: str, limit_s: float = STALL_S
    ) -> None:
        self._open, self._chunk, self._breaker, self._what, self._limit = open_stream, chunk, breaker, what, limit_s
        self._q: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=2)
        self._stop = threading.Event()

    def __enter__(self) -> Iterator[bytes]:
        self._breaker.check()
        threading.Thread(target=self._pump, name="bootseer-store-stream", daemon=True).start()
        return self._chunks()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _chunks(self) -> Iterator[bytes]:
        while True:
            try:
                item = self._q.get(timeout=self._limit)
            except queue.Empty:
                self._stop.set()
                raise _stalled(self._breaker, self._what, self._limit) from None
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item

    def _pump(self) -> None:
        try:
            with self._open() as src:
                while not self._stop.is_set():
                    piece = bytes(src.read(self._chunk))
                    self._put(piece)
                    if not piece:
                        return
        except BaseException as e:  # handed to the consumer as it is
            self._put(e)

    def _put(self, item: bytes | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.5)
                return
            except queue.Full:
                continue


def skip_s3_finalizer() -> None:
    """Leave pyarrow's S3 finalizer out of the exit handlers: it waits for the requests of the reads
    given up (the client's own timeouts, 180 s: a command that printed its error at 21 s ended at 200 s).
    For a process that then ends by `os._exit` (`entry._exit_now`), which also skips the C++ static
    destructors that would otherwise meet an S3 client never shut down."""
    import atexit
    import sys

    fs = sys.modules.get("pyarrow.fs")
    if fs is not None and hasattr(fs, "ensure_s3_finalized"):
        atexit.unregister(fs.ensure_s3_finalized)
