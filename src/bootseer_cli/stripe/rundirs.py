"""Per-run checkpoint directories under the runtime dir: `ckpt-<run id>`, and their cleanup.

Each start of `bootseer exec` mounts (or pulls) its checkpoint at its own `ckpt-<run id>`, so two
jobs of one user on one node never share a mount point. Beside it, `ckpt-<run id>.owner` names the
process that uses it (the launcher's pid and start time: a reused pid is not mistaken for it). The
next start removes, a bounded number at a time, the directories of runs that are over: a mount is
unmounted only when its FUSE server is gone (a writable overlay, `overlay.py`, once its owner has
ended); a directory only when its owner has ended and it is empty, or is exactly what bootseer
pulled or pushed (its marker says so), with that marker. The run's agent removes its own pulled
copy or mount point the same way as soon as its write-back is in the store (agent_tasks.py), so a
pulled copy does not wait on the node for the user's next start (a plain user's runtime directory
may be on disk). A directory holding anything else (files the job wrote) is kept and said in one
line: bootseer never deletes what a job wrote. The read-only layer under a run's overlay is
`ckpt-<run id>.ro`, swept the same way. A live mount is never touched, whoever's it is.
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
LOWER_SUFFIX = ".ro"
SWEEP_LIMIT = 32  # directories looked at per start: a start never spends long on old runs


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), "" if none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def owner_stamp(pid: int) -> str:
    """ "pid start-time": names one process, never a later one that reuses its pid."""
    return f"{pid} {_start_time(pid)}"


def write_owner(mountpoint: Path, pid: int) -> None:
    """Record that `pid` (the launcher-to-be) uses `mountpoint` (a new file; never through a link)."""
    path = f"{mountpoint}{OWNER_SUFFIX}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(owner_stamp(pid) + "\n")


def _owner_alive(mountpoint: str) -> bool:
    try:
        with open(f"{mountpoint}{OWNER_SUFFIX}") as f:
            pid_s, _, start = f.read().strip().partition(" ")
        pid = int(pid_s)
    except (OSError, ValueError):
        return False
    return bool(start) and _start_time(pid) == start


def sweep(base: Path, keep: str, info: Callable[[str], None], warn: Callable[[str], None] | None = None) -> int:
    """Remove the per-run directories of ended runs under `base` (not `keep`, nor its `.ro`); returns
    how many. Directories holding what a job wrote are kept, and said once through `warn`."""
    removed = 0
    stale = False  # a mount whose server died was taken down: worth a line (an ended run's empty
    # directory, every start's leftover of the one before, is not: exec prints one summary line)
    kept: list[str] = []
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith(PREFIX) and not n.endswith(OWNER_SUFFIX))
    except OSError:
        return 0
    for name in names[:SWEEP_LIMIT]:
        p = os.path.join(base, name)
        if p in (keep, keep + LOWER_SUFFIX):
            continue
        was_mounted = _take_down(p)
        if was_mounted is None:
            continue  # a live mount (or not a checkpoint's): its job's, never ours to take
        stale = stale or was_mounted
        if not was_mounted and _owner_alive(p):
            continue  # a pull (or a mount about to be made) of a run that is still going
        if remove_ours(p):
            removed += 1
        elif os.path.isdir(p):
            kept.append(p)
    _drop_orphan_markers(base)
    if removed and stale:
        info(f"checkpoint: removed {removed} mount point(s) of ended runs under {base}")
    if kept:
        (warn or info)(
            f"checkpoint: kept {len(kept)} director(ies) of ended runs holding files bootseer did not put there "
            f"(never removed): {', '.join(kept[:3])}{' ...' if len(kept) > 3 else ''}"
        )
    return removed


def _take_down(p: str) -> bool | None:
    """Unmount an ended run's mount at `p`: True when one was taken down, False when none was there,
    None when one stays (live, not ours, or it would not go)."""
    from .mount import is_ours, mount_info, server_gone, umount
    from .overlay import is_overlay, umount_overlay

    info_m = mount_info(p)
    if info_m is None:
        return False
    if is_overlay(info_m):
        if _owner_alive(p):
            return None
        with contextlib.suppress(BootseerError):
            umount_overlay(p, dev=info_m["dev"])
    elif is_ours(info_m) and server_gone(p):
        with contextlib.suppress(BootseerError):
            umount(p)
    else:
        return None
    return None if mount_info(p) is not None else True


def remove_ours(p: str) -> bool:
    """Remove `p` (and its owner file and pull marker) when it is empty or exactly bootseer's own pull;
    False (nothing removed) when it holds anything else. The sweep calls it for ended runs, and the
    agent for its own run once the write-back has put the directory's contents in the store."""
    from .pull import is_current_tree, marker_path

    marker = marker_path(Path(p))
    try:
        st = os.lstat(p)
        if not stat.S_ISDIR(st.st_mode):
            return False  # not a directory of ours: left alone
        if any(os.scandir(p)):
            if not is_current_tree(Path(p)):
                return False  # the job's files (or a directory bootseer never pulled into)
            shutil.rmtree(p)  # fd-based on Linux: never follows a link inside it
        else:
            os.rmdir(p)
    except OSError:
        return False
    for leftover in (f"{p}{OWNER_SUFFIX}", str(marker)):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    return True


def _drop_orphan_markers(base: Path) -> None:
    """Pull markers (`.ckpt-<run>.bootseer-ckpt.json`) whose directory is gone (older bootseers left them)."""
    with contextlib.suppress(OSError):
        for n in os.listdir(base):
            if n.startswith("." + PREFIX) and n.endswith(".bootseer-ckpt.json"):
                d = os.path.join(base, n[1 : -len(".bootseer-ckpt.json")])
                if not os.path.lexists(d):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(base, n))
