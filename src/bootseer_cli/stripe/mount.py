"""Mount and unmount a striped checkpoint; the serving process and its lifetime.

`mount_detached` starts `python -m bootseer_cli.stripe.mount SPEC` in its own session and returns when
the mount is visible in /proc/self/mountinfo (or with the server's own error when it died first).
The server runs libfuse in the foreground of that process: forking a daemon after pyarrow's threads
exist is unsafe, and libfuse's daemon mode would also chdir to /, which is why every path handed to
it is absolute.

A mount must not outlive its owner: given `owner_pid` (the launcher, under `bootseer exec`), the server
watches that pid and unmounts itself when it ends, even if the agent that also owns the teardown
died. `umount` cleans a stale mount too (a server that was killed leaves "Transport endpoint is not
connected"): a normal unmount first, then a lazy one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import BootseerError
from ..redact import redact_text
from .layout import Manifest
from .mountinfo import fusermount as _fusermount
from .mountinfo import mount_info

FSTYPE = "fuse.bootseer-ckpt"
READ_AHEAD_KB = 16384
# libfuse's worker threads; honoured from libfuse 3.14.1 (3.12-3.14.0's fuse_main drops the option: 10)
MAX_THREADS = 64


def is_ours(info: dict[str, str] | None) -> bool:
    return bool(info) and info["fstype"] == FSTYPE  # type: ignore[index]


def raise_read_ahead(mountpoint: str, kb: int = READ_AHEAD_KB, timeout: float = 10.0) -> bool:
    """Raise the bdi read-ahead of the mount at `mountpoint` (kernel default: 128 KiB).

    The kernel applies the FUSE_INIT reply (which caps read-ahead) asynchronously, possibly after the
    mount is visible, so the value is written until it has read back unchanged a few times.
    """
    deadline = time.time() + timeout
    stable = 0
    while time.time() < deadline and stable < 3:
        info = mount_info(mountpoint)
        if info is not None and info["fstype"] == FSTYPE:
            knob = Path(f"/sys/class/bdi/{info['dev']}/read_ahead_kb")
            try:
                if knob.read_text().strip() == str(kb):
                    stable += 1
                else:
                    stable = 0
                    knob.write_text(str(kb))
            except OSError as e:
                print(f"bootseer: cannot raise read_ahead_kb of {mountpoint}: {e}", file=sys.stderr, flush=True)
                return False
        time.sleep(0.05)
    return stable >= 3


def umount(mountpoint: str | Path, lazy_ok: bool = True, dev: str = "") -> bool:
    """Unmount a bootseer checkpoint mount (also a stale one); False when nothing was mounted there.

    `dev`: only the mount with that device number (mountinfo's major:minor), i.e. one run's own
    mount; whatever else is mounted there now (another run's, after ours ended) is left alone."""
    mp = os.path.abspath(mountpoint)
    info = mount_info(mp)
    if info is None or (dev and info["dev"] != dev):
        return False
    if not info["fstype"].startswith("fuse"):
        raise BootseerError(f"{mp} is a {info['fstype']} mount, not a bootseer checkpoint mount")
    attempts = [[_fusermount(), "-u", mp]]
    if lazy_ok:
        attempts += [[_fusermount(), "-uz", mp], ["umount", "-l", mp]]
    last = ""
    for argv in attempts:
        with contextlib.suppress(OSError):
            r = subprocess.run(argv, capture_output=True, text=True)
            last = (r.stderr or r.stdout).strip()
        for _ in range(50):
            if mount_info(mp) is None:
                return True
            time.sleep(0.02)
    raise BootseerError(f"cannot unmount {mp}: {last}")


class MountpointError(BootseerError):
    """A mount point refused for safety (a symlink, another user's entry): neither mount nor pull there."""


def resolve_mountpoint(mountpoint: str | Path) -> str:
    """The one path used to mount, look up in mountinfo and unmount: the parent resolved (symlinks in
    it followed once, e.g. /var/run → /run) and the last component as written, never followed."""
    mp = os.path.abspath(mountpoint)
    parent, name = os.path.split(mp)
    if not name:
        raise MountpointError(f"mount point {mp}: not a directory that can be mounted over")
    return os.path.join(os.path.realpath(parent), name)


def _mkdir_private(path: str) -> None:
    """Create missing directories up to `path`, each 0700 with os.mkdir (which never follows a link
    at the last component), then check each one we made with lstat."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass  # made concurrently: the lstat checks below still apply
        except OSError as e:
            raise BootseerError(f"mount point {path}: cannot create {d}: {e.strerror}") from None
        _check_owned(d, "directory")


def _check_owned(path: str, what: str) -> os.stat_result:
    """lstat `path`: a real directory (not a symlink) owned by this user, else MountpointError."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        raise MountpointError(f"{what} {path} is a symbolic link (to {target}); refusing to mount over its target")
    if not stat.S_ISDIR(st.st_mode):
        raise MountpointError(f"{what} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise MountpointError(f"{what} {path} is owned by uid {st.st_uid}, not by this user; refusing it")
    return st


def _check_parent(parent: str) -> None:
    """Nobody else may replace the mount point between our checks and the mount: the parent is ours
    or root's, and when others can write to it, it has the sticky bit (then only we can rename ours)."""
    st = os.stat(parent)
    if st.st_uid not in (0, os.geteuid()):
        raise MountpointError(f"mount point parent {parent} is owned by uid {st.st_uid}; refusing it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise MountpointError(f"mount point parent {parent} is writable by others and not sticky; refusing it")


def safe_mountpoint(mountpoint: str | Path) -> str:
    """The resolved mount point (see `resolve_mountpoint`), an existing directory owned by this user.

    Missing directories are created 0700 without following links; a symlink, or an entry owned by
    another user, is refused (`MountpointError`), so a local user cannot point root's mount at /etc.
    """
    mp = resolve_mountpoint(mountpoint)
    _mkdir_private(os.path.dirname(mp))
    _check_parent(os.path.dirname(mp))
    try:
        os.mkdir(mp, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise BootseerError(f"mount point {mp}: {e.strerror}") from None
    try:
        _check_owned(mp, "mount point")
    except OSError as e:  # e.g. ENOTCONN: a dead mount of someone else's over it
        raise BootseerError(f"mount point {mp}: {e.strerror}") from None
    return mp


def server_gone(mountpoint: str) -> bool:
    """The FUSE server of the mount at `mountpoint` has died (the kernel answers ENOTCONN or ECONNABORTED).

    Only such a mount is ever unmounted by another start: a live one belongs to a running job (of
    this user or another), and taking it away would leave that job reading someone else's files."""
    try:
        os.stat(mountpoint)
    except OSError as e:
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def prepare_mountpoint(mountpoint: str | Path) -> str:
    """A safe (`safe_mountpoint`), unmounted directory; a bootseer mount there whose server is gone
    is cleaned first, a live one is refused (`MountpointError`): never stolen from its job."""
    from .overlay import is_overlay

    mp = resolve_mountpoint(mountpoint)
    info = mount_info(mp)
    if info is not None:
        if is_overlay(info):  # a run's writable view: an ended run's is taken down by the stage first
            raise MountpointError(f"{mp} is the live checkpoint mount of another run (writable view); not taking it")
        if not is_ours(info):
            raise BootseerError(f"{mp} is already a mount point ({info['fstype']} {info['source']})")
        if not server_gone(mp):
            raise MountpointError(f"{mp} is the live checkpoint mount of another run ({info['source']}); not taking it")
        umount(mp)
    return safe_mountpoint(mp)


def check_mountable(mountpoint: str, hide_files: bool = False) -> None:
    """What `ckpt mount` refuses before any work: a path that already holds a mount (a second one would
    stack on it, the first hidden but still served), and a non-empty directory, whose files a mount
    would hide without a word (unless `hide_files`, the verb's --force)."""
    info = mount_info(mountpoint)
    if info is not None and not (is_ours(info) and server_gone(mountpoint)):
        what = f"the checkpoint mount {info['source']}" if is_ours(info) else f"a {info['fstype']} mount"
        raise MountpointError(
            f"{mountpoint} already holds {what}; not mounting over it (`bootseer ckpt umount {mountpoint}` first)"
        )
    if info is not None or hide_files:
        return
    try:
        with os.scandir(mountpoint) as it:
            n = sum(1 for _ in it)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return  # created, or refused with its reason, by the mount itself
    if n:
        raise MountpointError(
            f"{mountpoint} is not empty ({n} {'entry' if n == 1 else 'entries'}): the mount would hide them; "
            "mount on an empty or new directory, or add --force to hide them until unmounted"
        )


def _watch_owner(pid: int, mountpoint: str, dev: str = "", above: str = "") -> None:
    """Unmount when `pid` ends (pidfd where available, else polling); only this server's own mount, and
    first the writable view at `above` over it (overlay.py), which would otherwise keep it, and itself,
    mounted where no agent runs (`BOOTSEER_EXEC_AGENT=0`, or an agent that died)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])
        os.close(fd)
    else:  # pragma: no cover - kernels without pidfd
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    print(f"bootseer: owner pid {pid} ended; unmounting {mountpoint}", file=sys.stderr, flush=True)
    if above:
        from .overlay import umount_overlay

        with contextlib.suppress(BootseerError):
            umount_overlay(above)
    with contextlib.suppress(BootseerError):
        umount(mountpoint, dev=dev)


def _mounted_dev(mountpoint: str, timeout: float = 10.0) -> str:
    """The device number of the bootseer mount at `mountpoint` once visible ("" if none appears)."""
    deadline = time.time() + timeout
    while True:
        info = mount_info(mountpoint)
        if is_ours(info):
            return info["dev"]  # type: ignore[index]
        if time.time() > deadline:
            return ""
        time.sleep(0.02)


def serve(spec: dict[str, Any]) -> int:
    """Serve the mount in this process until it is unmounted (foreground)."""
    from .libfuse import load_mfusepy

    mfusepy = load_mfusepy()

    from ..store.core import open_store
    from .catalog import Targets
    from .fusefs import MAX_READ, CheckpointFS
    from .reader import ReaderOptions, open_reader

    m = Manifest.from_doc(spec["manifest"])
    mp = prepare_mountpoint(spec["mountpoint"])
    store = open_store(spec.get("store_uri"))
    reader = open_reader(m, Targets(store, spec.get("targets") or []), ReaderOptions(**spec.get("options", {})))
    kb = int(spec.get("read_ahead_kb") or READ_AHEAD_KB)
    owner = spec.get("owner_pid")

    def on_init() -> None:
        fs.was_mounted = True
        threading.Thread(target=raise_read_ahead, args=(mp, kb), daemon=True).start()
        if owner:
            above = str(spec.get("above") or "")
            watch = lambda: _watch_owner(int(owner), mp, _mounted_dev(mp), above)  # noqa: E731
            threading.Thread(target=watch, daemon=True).start()

    fs = CheckpointFS(m, reader, on_init=on_init)
    options: dict[str, Any] = {
        "foreground": True,
        "ro": True,
        "fsname": f"bootseer:{m.name}:{m.tag}",
        "subtype": "bootseer-ckpt",
        "max_read": MAX_READ,
        "max_threads": MAX_THREADS,
        # Given explicitly, because libfuse 3.12-3.14.0 (Debian 12's 3.14.0 among them) defaults it to
        # UINT_MAX and then logs "Ignoring invalid max threads value 4294967295" on every mount. Equal
        # to max_threads, an idle worker is never torn down, which is what that default meant.
        "max_idle_threads": MAX_THREADS,
        "kernel_cache": True,
        "default_permissions": True,
    }
    if spec.get("allow_other"):
        # [checkpoint] allow_other: other local users (a launcher running as another user in a
        # multi-user container) may read the mount; off by default, so only its owner (and root) can
        options["allow_other"] = True
    try:
        mfusepy.FUSE(fs, mp, **options)
    except RuntimeError as e:
        # libfuse's multithreaded loop reports an error when the kernel side goes away under it
        # (fusermount -u from outside); that is the normal end of a mount, not a failure.
        if mount_info(mp) is not None or not fs.was_mounted:
            raise BootseerError(f"FUSE mount of {m.name}:{m.tag} at {mp} failed (libfuse error {e})") from None
    finally:
        reader.close()
    return 0


def mount_detached(
    manifest: Manifest,
    mountpoint: str | Path,
    store_uri: str | None,
    targets: list[str] | None = None,
    options: dict[str, Any] | None = None,
    owner_pid: int | None = None,
    log_path: Path | None = None,
    timeout: float = 30.0,
    allow_other: bool = False,
    above: str = "",
) -> int:
    """Start the server in its own session; returns its pid once the mount is visible. `above`: where
    the writable view over this mount will be, taken down with it when `owner_pid` ends."""
    mp = prepare_mountpoint(mountpoint)
    spec = {
        "manifest": manifest.to_doc(),
        "mountpoint": mp,
        "store_uri": store_uri,
        "targets": targets or [],
        "options": options or {},
        "owner_pid": owner_pid,
        "allow_other": allow_other,
        "above": above,
    }
    fd, spec_path = tempfile.mkstemp(prefix="bootseer-mount-", suffix=".json")
    with os.fdopen(fd, "w") as f:  # mode 0600: target URIs may carry credentials
        json.dump(spec, f)
    if log_path is None:
        from ..paths import cache_root

        log_path = cache_root() / "mounts" / f"{Path(mp).name or 'root'}-{int(time.time())}-{os.getpid()}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bootseer_cli.stripe.mount", spec_path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )
    deadline = time.time() + timeout
    while time.time() < deadline:
        if is_ours(mount_info(mp)):
            return proc.pid
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    tail = _give_up(proc, mp, spec_path, log_path)
    raise BootseerError(f"mount of {manifest.name}:{manifest.tag} at {mp} failed: {tail or 'no mount appeared'}")


def _give_up(proc: subprocess.Popen[bytes], mp: str, spec_path: str, log_path: Path) -> str:
    """Stop a server whose mount did not appear in time (and what it may have mounted since), remove its
    spec; returns the last line it logged: why, for the error."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        with contextlib.suppress(BootseerError):
            umount(mp)
    with contextlib.suppress(OSError):
        os.unlink(spec_path)
    with contextlib.suppress(OSError):
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""
    return ""


def _main(spec_path: str) -> int:
    from ..errors import BootseerError as _BE

    try:
        with open(spec_path) as f:
            spec = json.load(f)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(spec_path)
    try:
        return serve(spec)
    except _BE as e:
        print(f"bootseer: error: {redact_text(str(e))}", file=sys.stderr, flush=True)
        return e.exit_code


if __name__ == "__main__":  # pragma: no cover - the detached server
    sys.exit(_main(sys.argv[1]))
