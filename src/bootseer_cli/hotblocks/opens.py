"""Which files a start opens, from fanotify: the record without the pre-exec eviction walk.

The image stage (in `bootseer exec`, before exec) creates a fanotify group of the notification class
(FAN_CLASS_NOTIF: events are queued, never waited for, so nothing can block on bootseer) and marks
the mounts of the roots for FAN_OPEN. The group's fd goes to the agent, which keeps the paths under the
roots opened by the launcher and its descendants (`launcher`: a mount mark sees every process on the
mount, and another job's opens are not this start's) and, when the start is over, removes the marks,
reads what is left and closes the group. The file set replaces the eviction walk: only the files the
start opened are asked about (`mincore`), so pages of other files that happen to be cached are never
recorded, and nothing is evicted before exec.

Drained while the start runs (`start`), but only once the queue holds `DRAIN_AT` events (FIONREAD,
polled): the kernel opens a file for each event as it is read, an open the loader must serve (on s3fs
a request; on a tree that drops pages at open, the program's pages of that file), so a small start's
events are still read after it (s3fs: reading them during the start cost +737 requests, 1.14x), while a
start that reads a dataset, or a node where another process opens many files, never fills the queue
(issue 44: both lost the whole record when the queue was read only at ready). The group keeps the
kernel's default, bounded queue (16384 events), never FAN_UNLIMITED_QUEUE (which let any user on the
node pin kernel memory); what is kept is bounded too (`max_paths` unique paths under the roots). Where
the queue overflows anyway, the kernel queues FAN_Q_OVERFLOW: the opens of that window are lost, the
overflow is counted, and the record is published with its coverage stated (`coverage`), not dropped.

Needs CAP_SYS_ADMIN (mount marks); `open_group` returns None otherwise and the stage falls back to a
time-bounded eviction walk (see stage.py). Each event carries an fd the kernel opens for us: it is
used for one `readlink` and closed at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import select
import struct
import termios
import threading

FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_CLASS_NOTIF = 0x0
FAN_MARK_ADD = 0x1
FAN_MARK_FLUSH = 0x80
FAN_MARK_MOUNT = 0x10
FAN_OPEN = 0x20
FAN_Q_OVERFLOW = 0x4000
_META = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
_BUF = 1 << 16
QUEUE_EVENTS = 16384  # the kernel's default queue, which the group keeps
DRAIN_AT = QUEUE_EVENTS // 8 * _META.size  # bytes queued (FIONREAD) at which the start's events are read
POLL_S = 0.02  # how often the queue's length is asked while the start runs
MAX_PATHS = 1_000_000  # unique paths kept at most ([image] record_max_files)
_MAX_PIDS = 1 << 16  # pids whose lineage is remembered, at most (then forgotten and asked again)

_lib: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
        lib.fanotify_init.restype = ctypes.c_int
        lib.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        lib.fanotify_mark.restype = ctypes.c_int
        _lib = lib
    return _lib


def open_group(roots: list[str]) -> tuple[int | None, str]:
    """A fanotify group watching opens on the mounts of `roots`; (fd, "") or (None, why not)."""
    if os.geteuid() != 0:
        return None, "fanotify mount marks need root"
    lib = _libc()
    flags = FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK  # the default, bounded queue (module doc)
    fd = lib.fanotify_init(flags, os.O_RDONLY | os.O_CLOEXEC | os.O_LARGEFILE)
    if fd < 0:
        return None, f"fanotify_init: {os.strerror(ctypes.get_errno())}"
    for root in roots:
        if lib.fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_OPEN, -1, os.fsencode(root)) != 0:
            err = ctypes.get_errno()
            os.close(fd)
            return None, f"fanotify_mark {root}: {os.strerror(err)}"
    return fd, ""


def is_group(fd: int) -> bool:
    """Whether `fd` is a fanotify group (the agent checks the fd it was handed before reading it)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[fanotify]"
    except OSError:
        return False


def parent_pid(pid: int) -> int | None:
    """The parent of `pid` from /proc/<pid>/stat (a zombie still has one); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        return int(data.rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


class OpenLog:
    """Drains a fanotify group: the regular files under `roots` that were opened, in first-open order,
    by `launcher` or its descendants (any process when `launcher` is None), `max_paths` at most."""

    def __init__(
        self,
        fd: int,
        roots: list[str],
        ignore_pids: tuple[int, ...] = (),
        launcher: int | None = None,
        max_paths: int = MAX_PATHS,
    ) -> None:
        if not is_group(fd):
            raise OSError(errno.EBADF, f"fd {fd} is not a fanotify group")
        self.fd = fd
        self.prefixes = tuple(os.path.realpath(r).rstrip("/") + "/" for r in roots)
        self.ignore = set(ignore_pids)
        self.launcher = launcher
        self.max_paths = max_paths
        self._ours: dict[int, bool] = {}
        self.paths: dict[str, None] = {}
        self.events = 0
        self.others = 0  # events of processes that are not the launcher's
        self.overflows = 0  # FAN_Q_OVERFLOW events: each a window whose opens were lost
        self.past_cap = 0  # opens of new paths once `max_paths` were kept
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def overflowed(self) -> bool:
        return self.overflows > 0

    def coverage(self) -> str:
        """The record's coverage: "full", or "partial (why)", what a record taken from this log may have missed."""
        lost = [f"the queue overflowed {self.overflows}×"] if self.overflows else []
        if self.past_cap:
            lost.append(f"{self.past_cap} opens past the cap of {self.max_paths} files")
        return f"partial ({', '.join(lost)})" if lost else "full"

    def is_ours(self, pid: int) -> bool:
        """Whether `pid` is the launcher or one of its descendants, by the /proc parent chain now.

        Read when the event is read: a process that has exited and been reaped by then cannot be told
        from another user's and is dropped (the launcher's workers are alive at ready). The launcher
        execs in place, so its pid is the one `bootseer exec` had."""
        if self.launcher is None:
            return pid not in self.ignore
        if len(self._ours) > _MAX_PIDS:
            self._ours.clear()
        seen: list[int] = []
        ours = False
        cur: int | None = pid
        while cur is not None and cur > 1 and len(seen) < 4096:
            if cur in self._ours:
                ours = self._ours[cur]
                break
            if cur == self.launcher:
                ours = True
                break
            seen.append(cur)
            cur = parent_pid(cur)
        for p in seen:
            self._ours[p] = ours
        return ours and pid not in self.ignore

    def _keep(self, path: str) -> None:
        if not (path.startswith(self.prefixes) or path + "/" in self.prefixes) or path in self.paths:
            return
        if len(self.paths) >= self.max_paths:
            self.past_cap += 1
        else:
            self.paths[path] = None

    def _handle(self, buf: bytes) -> None:
        pos = 0
        while pos + _META.size <= len(buf):
            length, _vers, _res, _mlen, mask, efd, pid = _META.unpack_from(buf, pos)
            if length < _META.size:
                break
            pos += length
            self.events += 1
            if mask & FAN_Q_OVERFLOW:
                self.overflows += 1
            if efd < 0:
                continue
            try:
                if not self.is_ours(pid):
                    self.others += 1
                    continue
                self._keep(os.readlink(f"/proc/self/fd/{efd}"))
            except OSError:
                pass
            finally:
                os.close(efd)

    def _read_once(self) -> int:
        """One read of the queue: the bytes read (0 when it was empty; -1 when interrupted)."""
        with self._lock:
            try:
                buf = os.read(self.fd, _BUF)
            except BlockingIOError:
                return 0
            except InterruptedError:
                return -1
            self._handle(buf)
            return len(buf)

    def queued(self) -> int:
        """Bytes of events in the queue now (FIONREAD)."""
        buf = bytearray(4)
        fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        return int.from_bytes(buf, "little", signed=True)

    def drain(self, timeout: float = 0.0) -> None:
        """Read every queued event, waiting up to `timeout` seconds for the first."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if ready:
            while self._read_once():
                pass

    def start(self, before_launch: bool = False) -> OpenLog:
        """Drain the queue on a thread while the start runs, whenever it holds `DRAIN_AT` (module doc).

        `before_launch`: the launcher has not begun yet (it waits for the agent: stage._wait_for_drain), so
        what is queued is read now and an overflow in it is not the start's: the opens it lost were
        bootseer's own before exec and other processes' (a busy node overflows the queue in the second the
        agent takes to start)."""
        if before_launch:  # what is queued now, not more: another process may keep the queue filling
            left = self.queued()
            while left > 0 and (n := self._read_once()):
                left -= max(n, 0)
            self.overflows = 0
        self._thread = threading.Thread(target=self._follow, name="hot-opens", daemon=True)
        self._thread.start()
        return self

    def _follow(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                if self.queued() >= DRAIN_AT:
                    while not self._stop.is_set() and self._read_once():
                        pass
        except OSError:  # the group is gone (closed under us): `close` reads what is left, if anything
            return

    def close(self) -> None:
        """Stop the drain, remove the marks, take what is left in the queue, close the group (never raises)."""
        if self._stop.is_set():
            return  # closed already: the fd number may be another file's by now
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError):
            _libc().fanotify_mark(self.fd, FAN_MARK_FLUSH | FAN_MARK_MOUNT, 0, -1, None)
            self.drain(0.0)
        with contextlib.suppress(OSError):
            os.close(self.fd)
