"""Which files a start opens, from fanotify: the record without the pre-exec eviction walk.

The image stage (in `bootseer exec`, before exec) creates a fanotify group of the notification class
(FAN_CLASS_NOTIF: events are queued, never waited for, so nothing can block on bootseer) and marks
the mounts of the roots for FAN_OPEN. The group's fd goes to the agent, which leaves the queue alone
while the program starts (the kernel opens a file for each event as it is read: an open the loader
must serve) and, when the start is over, removes the marks, reads the whole queue, keeps the paths
under the roots and closes the group. The file set replaces the eviction walk: only the files the start opened are
asked about (`mincore`), so pages of other files that happen to be cached are never recorded, and
nothing is evicted before exec.

Needs CAP_SYS_ADMIN (mount marks); `open_group` returns None otherwise and the stage falls back to a
time-bounded eviction walk (see stage.py). Each event carries an fd the kernel opens for us: it is
used for one `readlink` and closed at once.

Bounded: the group has the kernel's default queue (16384 events), never FAN_UNLIMITED_QUEUE. A mount
mark sees every process on the mount, so an unlimited queue read only at ready let any user on the
node pin unreclaimable kernel memory (100k opens in seconds); when the queue overflows, the kernel
queues FAN_Q_OVERFLOW and the record is incomplete (`overflowed`), which the caller discards. For
the same reason only the opens of the launcher and its descendants are kept (`launcher`): another
job's opens on the same mount are not this start's.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import struct
import time

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
    by `launcher` or its descendants (any process when `launcher` is None)."""

    def __init__(
        self, fd: int, roots: list[str], ignore_pids: tuple[int, ...] = (), launcher: int | None = None
    ) -> None:
        if not is_group(fd):
            raise OSError(errno.EBADF, f"fd {fd} is not a fanotify group")
        self.fd = fd
        self.prefixes = tuple(os.path.realpath(r).rstrip("/") + "/" for r in roots)
        self.ignore = set(ignore_pids)
        self.launcher = launcher
        self._ours: dict[int, bool] = {}
        self.paths: dict[str, None] = {}
        self.events = 0
        self.others = 0  # events of processes that are not the launcher's
        self.overflowed = False

    def is_ours(self, pid: int) -> bool:
        """Whether `pid` is the launcher or one of its descendants, by the /proc parent chain now.

        Read when the queue is read (at ready): a process that has exited and been reaped by then cannot
        be told from another user's and is dropped; the launcher's workers are alive at ready. The
        launcher execs in place, so its pid is the one `bootseer exec` had."""
        if self.launcher is None:
            return pid not in self.ignore
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

    def _keep(self, path: str) -> bool:
        return path.startswith(self.prefixes) or path + "/" in self.prefixes

    def _handle(self, buf: bytes) -> None:
        pos = 0
        while pos + _META.size <= len(buf):
            length, _vers, _res, _mlen, mask, efd, pid = _META.unpack_from(buf, pos)
            if length < _META.size:
                break
            pos += length
            self.events += 1
            if mask & FAN_Q_OVERFLOW:
                self.overflowed = True
            if efd < 0:
                continue
            try:
                if not self.is_ours(pid):
                    self.others += 1
                    continue
                path = os.readlink(f"/proc/self/fd/{efd}")
                if self._keep(path):
                    self.paths.setdefault(path, None)
            except OSError:
                pass
            finally:
                os.close(efd)

    def drain(self, timeout: float = 0.0) -> None:
        """Read every queued event, waiting up to `timeout` seconds for the first."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return
            try:
                buf = os.read(self.fd, _BUF)
            except BlockingIOError:
                continue
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            self._handle(buf)
            deadline = time.monotonic()  # after the first batch: take what is queued, do not wait

    def close(self) -> None:
        """Remove the marks, take what is left in the queue, close the group (never raises)."""
        with contextlib.suppress(OSError):
            _libc().fanotify_mark(self.fd, FAN_MARK_FLUSH | FAN_MARK_MOUNT, 0, -1, None)
            self.drain(0.0)
        with contextlib.suppress(OSError):
            os.close(self.fd)
