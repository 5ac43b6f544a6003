"""Per-run checkpoint directories under the runtime dir: `ckpt-<run id>`, and their cleanup.

Each start of `bootseer exec` mounts (or pulls) its checkpoint at its own `ckpt-<run id>`, so two
jobs of one user on one node never share a mount point. Beside it, `ckpt-<run id>.owner` names the
process that uses it (the launcher's pid and start time: a reused pid is not mistaken for it). The
next start removes, a bounded number at a time, the directories of runs that are over: a mount is
unmounted only when its FUSE server is gone; an unmounted directory (an old mount point, or a pull)
only when its owner has ended. A live mount is never touched, whoever's it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from ..errors import BootseerError

PREFIX = "ckpt-"
OWNER_SUFFIX = ".owner"
SWEEP_LIMIT = 32  # directories looked at per start: a start never spends long on old runs


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), "" if none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def write_owner(mountpoint: Path, pid: int) -> None:
    """Record that `pid` (the launcher-to-be) uses `mountpoint` (a new file; never through a link)."""
    path = f"{mountpoint}{OWNER_SUFFIX}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{pid} {_start_time(pid)}\n")


def _owner_alive(mountpoint: str) -> bool:
    try:
        with open(f"{mountpoint}{OWNER_SUFFIX}") as f:
            pid_s, _, start = f.read().strip().partition(" ")
        pid = int(pid_s)
    except (OSError, ValueError):
        return False
    return bool(start) and _start_time(pid) == start


def sweep(base: Path, keep: str, info: Callable[[str], None]) -> int:
    """Remove the per-run directories of ended runs under `base` (not `keep`); returns how many."""
    from .mount import is_ours, mount_info, server_gone, umount

    removed = 0
    stale = False  # a mount whose server died was taken down: worth a line (an ended run's empty
    # directory, every start's leftover of the one before, is not: exec prints one summary line)
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith(PREFIX) and not n.endswith(OWNER_SUFFIX))
    except OSError:
        return 0
    for name in names[:SWEEP_LIMIT]:
        p = os.path.join(base, name)
        if p == keep:
            continue
        info_m = mount_info(p)
        if info_m is not None:
            if not (is_ours(info_m) and server_gone(p)):
                continue  # a live mount (or not a checkpoint's): its job's, never ours to take
            with contextlib.suppress(BootseerError):
                umount(p)
            if mount_info(p) is not None:
                continue
            stale = True
        elif _owner_alive(p):
            continue  # a pull (or a mount about to be made) of a run that is still going
        try:
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(p)  # fd-based on Linux: never follows a link inside it
            else:
                os.unlink(p)
        except OSError:
            continue
        with contextlib.suppress(OSError):
            os.unlink(f"{p}{OWNER_SUFFIX}")
        removed += 1
    if removed and stale:
        info(f"checkpoint: removed {removed} mount point(s) of ended runs under {base}")
    return removed
