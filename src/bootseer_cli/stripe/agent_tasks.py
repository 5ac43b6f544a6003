"""The "ckpt-umount" agent task: hold the checkpoint mount while the launcher runs, unmount it when it ends.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..agent import Agent


@dataclass(frozen=True)
class UnmountTask:
    mountpoint: str
    pid: int = 0  # the FUSE server's (0: unknown): stopped after the unmount
    dev: str = ""  # the mount's major:minor in mountinfo ("": whatever bootseer mount is there)


def unmount_task(task: UnmountTask, agent: Agent) -> None:
    """Agent task: hold the mount while the launcher runs, unmount it (only it) when it ends."""
    from .mount import mount_info, umount

    mp = task.mountpoint

    def still_ours() -> bool:
        info = mount_info(mp)
        return info is not None and (not task.dev or info["dev"] == task.dev)

    while not agent.wait(5.0):
        if not still_ours():
            return  # unmounted already (by its server, or by hand); what is there now is not ours
    try:
        if umount(mp, dev=task.dev):
            agent.log(f"unmounted {mp}")
    except BootseerError as e:
        agent.log(f"could not unmount {mp}: {e}")
    if task.pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(task.pid, signal.SIGTERM)
