"""The checkpoint's agent tasks: "ckpt-umount" holds the read-only mount while the launcher runs and
unmounts it when it ends; "ckpt-writeback" takes down the writable view and pushes what the job wrote.

The checkpoint stage (stage.py) mounts with the exec process as the FUSE server's owner, and hands
the agent an `UnmountTask`: the server unmounts itself when that pid ends, and the agent does the
same on its way out, so the mount never outlives the job even if one of the two dies. The task
names its mount by device number too: whatever else is mounted at that path later (another run's
mount at a configured mount point, after ours ended) is never this agent's to unmount.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ..errors import BootseerError
from ..events import record as record_event

if TYPE_CHECKING:
    from ..agent import Agent


@dataclass(frozen=True)
class UnmountTask:
    mountpoint: str
    pid: int = 0  # the FUSE server's (0: unknown): stopped after the unmount
    dev: str = ""  # the mount's major:minor in mountinfo ("": whatever bootseer mount is there)
    rundir: bool = False  # the mount point is this run's own (`ckpt-<run id>.ro`): removed once unmounted


def unmount_task(task: UnmountTask, agent: Agent) -> None:
    """Agent task: hold the mount while the launcher runs, unmount it (only it) when it ends; then
    remove the run's own empty mount point and its owner file (rundirs.remove_ours)."""
    from .mount import mount_info, umount
    from .rundirs import remove_ours

    mp = task.mountpoint

    def still_ours() -> bool:
        info = mount_info(mp)
        return info is not None and (not task.dev or info["dev"] == task.dev)

    while not agent.wait(5.0):
        if not still_ours():
            break  # unmounted already (by its server, or by hand); what is there now is not ours
    else:
        try:
            if umount(mp, dev=task.dev):
                agent.log(f"unmounted {mp}")
        except BootseerError as e:
            agent.log(f"could not unmount {mp}: {e}")
        if task.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(task.pid, signal.SIGTERM)
    if task.rundir and mount_info(mp) is None:
        remove_ours(mp)  # empty once unmounted; a directory holding anything stays


@dataclass(frozen=True)
class WritebackTask:
    """Push what the job wrote into its checkpoint directory as a new tag (writeback.py), after it ends."""

    finish: ClassVar[bool] = True  # the agent waits for the push after the launcher ends

    root: str  # the write-back directory: journal (and, for an overlay, upper and work)
    mountpoint: str = ""  # the overlay's ("" in pull mode)
    dev: str = ""  # its major:minor: only this view is unmounted
    rundir: str = ""  # this run's own `<runtime>/ckpt-<run id>`: removed once its contents are in the store
    kept_fd: int = -1  # the shared lock on the kept copy stacked under the view (kept.py): released once
    # the view is down, so that the push may retire that copy for the one it keeps


def writeback_task(task: WritebackTask, agent: Agent) -> None:
    """Hold the journal's lock while the launcher runs; then unmount the view and push, with progress
    in agent.log and a "ckpt-writeback" event (bytes, seconds). A failure keeps the journal and the
    job's files: the next start of this checkpoint pushes them."""
    from .mountinfo import mount_info
    from .overlay import umount_overlay
    from .writeback import discard_done, finish, locked

    root = Path(task.root)
    with locked(root, wait=True):
        while not agent.wait(5.0):
            pass
        if task.mountpoint:
            try:
                umount_overlay(task.mountpoint, dev=task.dev)
            except BootseerError as e:
                agent.log(f"ckpt-writeback: {e}; pushing from the upper directory anyway")
        if task.kept_fd >= 0 and not (task.mountpoint and mount_info(task.mountpoint)):
            with contextlib.suppress(OSError):
                os.close(task.kept_fd)  # inherited from exec under this number (launch.py)
        t0 = time.time()
        try:
            m = finish(agent.store, agent.settings.checkpoint, root, agent.log, _progress(agent))
        except Exception as e:  # keep-alive: the journal stays for the next start; the agent goes on
            agent.log(f"ckpt-writeback: not pushed ({e}); the next start of this checkpoint pushes it")
            record_event(agent.run, "ckpt-writeback", t0, time.time(), "failed", reason=str(e))
            return
    took = time.time() - t0  # the push: until the tag is in the store and the journal gone
    discard_done()  # the staging copy the push renamed aside (and any an earlier start's push left)
    if task.rundir:
        _remove_rundir(task.rundir, agent)
    if m is None:
        agent.log("ckpt-writeback: the job wrote nothing into its checkpoint directory")
        record_event(agent.run, "ckpt-writeback", t0, time.time(), "unchanged")
        return
    agent.log(f"ckpt-writeback: pushed {m.name}:{m.tag} ({m.total_size} bytes) in {took:.1f} s; latest names it")
    record_event(agent.run, "ckpt-writeback", t0, t0 + took, "pushed", bytes=m.total_size, detail=f"{m.name}:{m.tag}")


def _remove_rundir(path: str, agent: Agent) -> None:
    """The run's own checkpoint directory, its owner file and pull marker, now that what it holds is in
    the store: a pulled copy is a whole checkpoint, and for a plain user without /run/user it lies on
    the disk of the cache root until a next start would sweep it. Anything the write-back did not
    push (rundirs.remove_ours checks the directory is empty or exactly the tag just pushed) stays."""
    from .rundirs import remove_ours

    if remove_ours(path):
        agent.log(f"ckpt-writeback: removed {path} (its contents are in the store)")
    elif os.path.lexists(path):
        agent.log(f"ckpt-writeback: kept {path}: it holds files the write-back did not push")


def _progress(agent: Agent) -> Callable[[str, int], Callable[[int], None]]:
    """A push `progress(phase, total)` that logs each phase at every tenth of its bytes."""

    def start(phase: str, total: int) -> Callable[[int], None]:
        done = [0, 0]  # bytes, tenths logged

        def advance(n: int) -> None:
            done[0] += n
            tenth = done[0] * 10 // max(1, total)
            if tenth > done[1]:
                done[1] = tenth
                agent.log(f"ckpt-writeback: {phase} {min(100, tenth * 10)}% of {total} bytes")

        return advance

    return start
