"""Which files outside the roots the setup itself wrote, so a node's other work is never blamed on it.

The capture warns about files the setup changed outside the roots (they are not in the snapshot). It
finds them by time: changed since the setup started, in the places setups write (capture.py's
`OutsideLook`). Time alone blames whatever else ran meanwhile: under load, another process ran
`ldconfig` during a setup and the capture reported `/etc/ld.so.cache` as the setup's.

Where bootseer is root with CAP_SYS_ADMIN, each setup command runs in a mount namespace of its own
(`unshare(CLONE_NEWNS)`, done by a small helper that then execs `/bin/sh -c CMD`; the copy keeps every
mount and its propagation, so files are shared as before, and so are mounts where the node's mounts
propagate, as under systemd; in a container with private mounts, a mount the setup makes stays in its
namespace). Before the exec, the helper marks the namespace's mounts that hold the places the capture
looks in (`look_places`), or lie below one, in a fanotify group bootseer holds, for FAN_CLOSE_WRITE. A mount mark
belongs to one mount instance, and the namespace's copies are used only by the setup's processes
and their descendants (which inherit it): the group sees exactly the files the setup's own process tree
wrote, whichever process it was and however short-lived, and nothing another process writes through
the node's own mounts. Each event's file is identified by (device, inode), which a write-then-rename
keeps. A path the time look found is then the setup's only if its inode is among them.

What this does not see: a file the setup only renamed, chmod'ed or linked (no write), a symlink; those
are still reported by time, and so is a file on a device some of whose mounts there were not marked (a
network filesystem is never marked: a stale one would hang the lookup; overlayfs may report another
device for a file than for its mount). Where the group cannot be made (not root, no CAP_SYS_ADMIN, no
fanotify), the namespace cannot be made, or the queue overflowed, the writes are unknown and the look
falls back: a plain user's setup can only have changed a file it may write (or whose directory it may
write), so the others are not its; root's are reported by time, as before.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import struct
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_NOTIF = 0x1, 0x2, 0x0
FAN_CLOSE_WRITE = 0x8
FAN_Q_OVERFLOW = 0x4000
_META = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid

# The helper, run as `python -I -S -c HELPER FD STATUS_FD CMD PLACE...`: no site, no bootseer import
# (a few ms); any failure before the exec still runs the command. It marks the mounts that hold the
# places the capture looks in, or lie below one (network filesystems never: a stale one would hang
# the lookup), and reports "1 maj:min …", the devices all of whose such mounts it marked, or "0".
HELPER = r"""
import ctypes, os, sys
fan, status, cmd, places = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], [os.fsencode(p) for p in sys.argv[4:]]
out = b"0"
def near(point):
    top = point.rstrip(b"/") + b"/"
    return any(p == point or p.startswith(top) or point.startswith(p.rstrip(b"/") + b"/") for p in places)
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    if libc.unshare(0x00020000) == 0:
        marked, missed = set(), set()
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                pre, _, post = line.partition(b" - ")
                fields = pre.split()
                dev, point = fields[2], fields[4]
                for esc, raw in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n"), (b"\\134", b"\\")):
                    point = point.replace(esc, raw)
                if not near(point):
                    continue
                fstype = post.split()[0] if post else b""
                if fstype in NETWORK or libc.fanotify_mark(fan, 0x11, 0x8, -100, point) != 0:
                    missed.add(dev)
                else:
                    marked.add(dev)
        out = b" ".join([b"1", *sorted(marked - missed)])
except BaseException:
    out = b"0"
try:
    os.write(status, out)
finally:
    for fd in (status, fan):  # the setup never holds the group (its events' files are opened as root)
        try:
            os.close(fd)
        except OSError:
            pass
    os.execv("/bin/sh", ["/bin/sh", "-c", cmd])
"""
NETWORK = (
    b"nfs nfs4 cifs smb3 smbfs ncpfs 9p afs ceph glusterfs lustre gpfs beegfs fuse.sshfs fuse.s3fs fuse.gcsfuse "
    b"fuse.rclone fuse.juicefs fuse.glusterfs fuse.ceph autofs"
).split()
_HELPER_CODE = HELPER.replace("NETWORK", repr(tuple(NETWORK)))


def look_places() -> list[str]:
    """Where setups usually write outside the roots: where the capture looks (`capture.outside_places`)
    and the mounts the helper marks. `sysconfig` is imported in the caller's process."""
    import sysconfig

    home = os.path.expanduser("~")
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    places = [base["purelib"], base["platlib"], base["scripts"], "/usr/local", "/opt", "/etc", home]
    return [os.path.normpath(p) for p in dict.fromkeys(places)]


@dataclass(frozen=True)
class Written:
    """What a setup's processes wrote: (device, inode) of each file, on the devices whose mounts were
    all watched (`devices`); a file on another device is the setup's or not by time, as before."""

    inodes: frozenset[tuple[int, int]]
    devices: frozenset[int]


def _libc() -> object:
    import ctypes

    lib = ctypes.CDLL(None, use_errno=True)
    lib.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    lib.fanotify_init.restype = ctypes.c_int
    return lib


class SetupWrites:
    """The fanotify group for one setup: `argv` wraps each command, `result()` is what its processes wrote.

    Drained by a thread while the setup runs (the kernel's bounded queue: an overflow makes it unknown)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written: set[tuple[int, int]] = set()
        self.known = True  # nothing was lost
        self.devices: set[int] | None = None  # watched by every command so far
        self.places = look_places()
        self._status: list[int] = []
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # ends the drain's wait at once when the setup is over
        self._thread = threading.Thread(target=self._drain, name="bootseer-setup-writes", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls) -> SetupWrites | None:
        """A group, or None where fanotify mount marks cannot be had (not root, no CAP_SYS_ADMIN)."""
        if os.geteuid() != 0 or not sys.platform.startswith("linux") or not sys.executable:
            return None
        try:
            fd = _libc().fanotify_init(  # type: ignore[attr-defined]
                FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC
            )
        except (OSError, AttributeError):
            return None
        return cls(fd) if fd >= 0 else None

    def argv(self, cmd: str) -> tuple[list[str], tuple[int, ...]]:
        """The command line that runs `cmd` through the helper, and the descriptors it must inherit."""
        r, w = os.pipe()
        self._status.append(r)
        return [sys.executable, "-I", "-S", "-c", _HELPER_CODE, str(self.fd), str(w), cmd, *self.places], (self.fd, w)

    def command_ended(self, passed: tuple[int, ...]) -> None:
        """After a command: close the status pipe's write end this process kept."""
        with contextlib.suppress(OSError):
            os.close(passed[-1])

    def _drain(self) -> None:
        poll = select.poll()
        poll.register(self.fd, select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            try:
                if poll.poll(1000):
                    self._read()
            except OSError:
                self.known = False
                return

    def _read(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not buf:
                return
            pos = 0
            while pos + _META.size <= len(buf):
                length, _v, _r, _m, mask, efd, _pid = _META.unpack_from(buf, pos)
                if length < _META.size:
                    break
                pos += length
                if mask & FAN_Q_OVERFLOW:
                    self.known = False
                if efd >= 0:
                    with contextlib.suppress(OSError):
                        st = os.fstat(efd)
                        self.written.add((st.st_dev, st.st_ino))
                    os.close(efd)

    def result(self) -> Written | None:
        """Stop and close; what the setup's processes wrote, or None (unknown: the queue overflowed, or
        no command ran tracked)."""
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)
        with contextlib.suppress(OSError):
            self._read()
        os.close(self.fd)
        for r in self._status:
            self._command_devices(r)
            os.close(r)
        if not self.known or not self.devices:
            return None
        return Written(frozenset(self.written), frozenset(self.devices))

    def _command_devices(self, r: int) -> None:
        """The devices one command's helper watched ("1 maj:min …"); those every command watched stay."""
        data = b""
        with contextlib.suppress(OSError):
            while piece := os.read(r, 1 << 16):
                data += piece
        words = data.split()
        devs: set[int] = set()
        if words[:1] == [b"1"]:
            for w in words[1:]:
                with contextlib.suppress(ValueError):
                    major, minor = w.split(b":")
                    devs.add(os.makedev(int(major), int(minor)))
        self.devices = devs if self.devices is None else self.devices & devs


def attribute(paths: Iterable[str], written: Written | None) -> list[str]:
    """Of the paths the time look found, those the setup may have changed (module doc)."""
    out = []
    for p in paths:
        try:
            st = os.lstat(p)
        except OSError:
            continue  # gone since: nothing to report
        if written is not None and stat.S_ISREG(st.st_mode) and st.st_dev in written.devices:
            if (st.st_dev, st.st_ino) in written.inodes:
                out.append(p)
        elif os.geteuid() != 0:
            if _may_write(p) or _may_write(os.path.dirname(p)):
                out.append(p)
        else:
            out.append(p)
    return out


def _may_write(path: str) -> bool:
    """Whether this process (its effective ids and capabilities, as the setup it ran) may write `path`."""
    try:
        return os.access(path, os.W_OK, effective_ids=True, follow_symlinks=False)
    except (NotImplementedError, OSError):
        return True  # not known: as before, by time
