"""Exceptions that the CLI turns into one-line messages instead of tracebacks."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

_T = TypeVar("_T")


class BootseerError(Exception):
    """A user-facing failure: the message is printed as is and the process exits with `exit_code`."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(BootseerError):
    """Bad configuration or bad arguments (exit 2, like a usage error)."""

    exit_code = 2


class StoreError(BootseerError):
    """The store could not be reached, or returned something unusable."""

    exit_code = 1


class IntegrityError(StoreError):
    """Data did not match its digest: never use it."""


class BlobMissing(StoreError):
    """The store answered, and the blob a ref names is not in it (deleted by hand, expired by an object
    store's lifecycle rule). Unlike an unreachable store this does not pass: the ref is unusable until
    something replaces it, so a stage that can make a new one (a hot-block record) does."""


class NoSpace(BootseerError):
    """The filesystem under a root (or every temporary directory) has too little free space for the
    snapshot (nothing was written). Here rather than in envsnap, since delivery raises it too."""


class StageFatal(BootseerError):
    """A stage failure that must stop the start (the user's own setup command failed)."""


# How long Ctrl-C waits for Python to act on it before the process exits anyway.
INTERRUPT_GRACE_S = 0.5
_interrupted = threading.Event()
_watching = False  # once per process
# A tree is being put back (`interrupts_deferred`): Ctrl-C is held off, the watchdog waits for it, as
# long as this at most (an undo is local renames and removals; past this the journal still recovers it).
_deferring = threading.Event()
UNDO_WAIT_S = 300.0
DEFERRED_LINE = "bootseer: still putting the tree back; Ctrl-C is ignored until it is whole"


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C off while a tree is being put back: a press says so in one line and is ignored, and
    the watchdog (`_watch_interrupts`) waits instead of exiting. People press Ctrl-C again exactly when
    the first one seems to do nothing; an undo cut short leaves a half-restored tree."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.getsignal(signal.SIGINT) if main else None
    if main:
        signal.signal(signal.SIGINT, _say_deferred)
    _deferring.set()
    try:
        yield
    finally:
        _deferring.clear()
        if main:
            signal.signal(signal.SIGINT, old)


def fork_deaf_to_interrupts() -> int:
    """`os.fork()`, the child ignoring SIGINT: for a worker whose parent alone answers Ctrl-C.

    Ctrl-C reaches the whole process group. A forked worker (a restore's writers, a digest) that acted
    on it would end as a failure before its parent heard of the interrupt: the parent then reported an
    error and put the tree back without a word (CI, `test_interrupt`). The parent is interrupted and
    stops its workers itself. SIGINT is blocked across the fork, so none lands in the child before it
    ignores it (setting SIG_IGN discards one already pending; one for the parent is delivered once it
    is unblocked)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


def _say_deferred(signum: int, frame: object) -> None:
    os.write(2, DEFERRED_LINE.encode() + b"\n")


def run_guarded(fn: Callable[[], _T]) -> _T:
    """Run a CLI body: a BootseerError becomes one line on stderr and its exit code, never a traceback;
    Ctrl-C exits 130 within a second, even while a store client blocks in C (`_watch_interrupts`)."""
    _watch_interrupts()
    try:
        return fn()
    except BootseerError as e:
        from .redact import redact_text  # defence in depth: no URI's credentials in an error line

        print(f"bootseer: error: {redact_text(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _interrupted.set()
        print("bootseer: interrupted", file=sys.stderr)
        sys.exit(130)


# Descriptors a run may hold at once: a restore's directory caches (`envsnap.dirfd.fd_budget`, at
# most 4096) and its other files
FD_RESERVE = 4096 + 256


def _reserve_fds(fd: int) -> None:
    """Grow this process's descriptor table, once, to what a run may hold: before it has a second thread.

    The kernel grows the table on demand, and in a process with more than one thread every growth
    waits out an RCU grace period (`expand_fdtable` calls synchronize_rcu): 10-20 ms each on a small
    VM. A restore's last step opens every directory it made (1,700 for the torch venv), so the table
    grew three times there: 45 ms of a 1.9 s restore asleep (perf, sched_switch). A single-threaded
    process grows it without that wait, and a table never shrinks; a slot costs 8 bytes. `fd` is
    duplicated to the lowest free number at or above the top (never over a descriptor in use), and
    the copy closed."""
    try:
        import fcntl
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return
    top = FD_RESERVE if soft == resource.RLIM_INFINITY else min(FD_RESERVE, soft)
    if top <= 64:
        return
    with contextlib.suppress(OSError):
        os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top - 1))


def _watch_interrupts() -> None:
    """Make Ctrl-C effective while the main thread is inside a C call that does not return.

    Python raises KeyboardInterrupt only when the main thread next runs Python code, and a store
    client's call (pyarrow's GCS retry loop, a connect to a dead NameNode) can keep it in C for minutes.
    The signal's wakeup fd is written by the C-level handler at once, so a daemon thread learns of the
    signal; when Python's default handler is still the one installed (a verb that handles SIGINT itself,
    like the agent, is left alone) and the process has not exited within `INTERRUPT_GRACE_S`, it exits
    130 itself. A responsive main thread has by then unwound normally, its `finally` blocks run; one
    that is putting a tree back (`interrupts_deferred`) is waited for.
    """
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    _watching = True
    r, w = os.pipe()  # close-on-exec: the launcher `exec` becomes inherits neither end
    _reserve_fds(r)
    os.set_blocking(w, False)
    try:
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        os.close(r)
        os.close(w)
        return

    def watch() -> None:
        while True:
            try:
                got = os.read(r, 64)
            except OSError:
                return
            if not got:
                return
            if signal.SIGINT not in got or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                continue
            time.sleep(INTERRUPT_GRACE_S)
            if _deferring.is_set():  # the main thread is putting a tree back: let it finish
                deadline = time.monotonic() + UNDO_WAIT_S
                while _deferring.is_set() and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(INTERRUPT_GRACE_S)
            if not _interrupted.is_set():
                os.write(2, b"bootseer: interrupted\n")
            os._exit(130)

    threading.Thread(target=watch, name="bootseer-interrupt", daemon=True).start()
