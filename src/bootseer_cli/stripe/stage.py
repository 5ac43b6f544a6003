"""The checkpoint stage of `bootseer exec`: mount (or pull) `[checkpoint] name:tag` before the launcher starts.

Mount mode starts the FUSE server detached, with the exec process (which becomes the launcher) as its
owner: the server unmounts itself when that pid ends, and the agent's `ckpt-umount` task does the
same on its way out, so the mount never outlives the job even if one of the two dies. If the mount
cannot be made (no FUSE here), the stage warns and pulls instead; if the store is unreachable the
launch code warns and the job starts without a checkpoint. Either way the launcher finds the
directory in `$BOOTSEER_CKPT_DIR`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from ..errors import BootseerError
from ..launch import LaunchContext, StageResult


def run_stage(ctx: LaunchContext) -> StageResult:
    from .catalog import Targets, load_manifest

    cfg = ctx.cfg
    name = cfg.get("checkpoint", "name")
    tag = cfg.get("checkpoint", "tag") or "latest"
    mode = cfg.get("checkpoint", "mode")
    mp = str(cfg.resolve_path(cfg.get("checkpoint", "mountpoint")))
    configured = list(cfg.get("checkpoint", "targets") or [])
    store = ctx.store
    m = load_manifest(store, name, tag)
    extra: dict[str, Any] = {"checkpoint": f"{m.name}:{m.tag}", "mode": mode}
    if mode == "mount":
        from .mount import mount_detached

        try:
            pid = mount_detached(
                m,
                mp,
                store.uri,
                targets=configured,
                owner_pid=os.getpid(),  # exec keeps this pid for the launcher
                log_path=ctx.run.run_dir / "ckpt-mount.log",
            )
        except BootseerError as e:
            ctx.warn(f"cannot mount checkpoint {m.name}:{m.tag} at {mp} ({e}); pulling it instead")
        else:
            ctx.add_agent_task("ckpt-umount", mountpoint=mp, pid=pid)
            ctx.exports["BOOTSEER_CKPT_DIR"] = mp
            ctx.info(f"checkpoint {m.name}:{m.tag} mounted at {mp}")
            return StageResult("mounted", summary=f"mounted {m.name}:{m.tag}", extra=extra)
    from ..progress import byte_bar
    from .pull import pull

    with byte_bar(m.total_size, f"pull {m.name}:{m.tag}", enabled=False if ctx.quiet else None) as advance:
        r = pull(
            m,
            Targets(store, configured),
            Path(mp),
            replace=True,
            cfg=cfg,
            whole_stripes=bool(cfg.get("p2p", "enabled")),
            advance=advance,
        )
    ctx.exports["BOOTSEER_CKPT_DIR"] = str(r.dest)
    extra["mode"] = "pull"
    if r.skipped:
        return StageResult("cached", summary=f"{m.name}:{m.tag} already pulled", cache="hit", extra=extra)
    return StageResult(
        "pulled",
        summary=f"pulled {m.name}:{m.tag}",
        cache="miss",
        bytes=r.bytes,
        bytes_from_store=r.bytes_from_store,
        bytes_from_peers=r.bytes_from_peers,
        extra=extra,
    )


def agent_unmount(task: dict[str, Any], agent: Any) -> None:
    """Agent task: hold the mount while the launcher runs, unmount when it ends."""
    from .mount import mount_info, umount

    mp = task["mountpoint"]
    while not agent.wait(5.0):
        if mount_info(mp) is None:
            return  # unmounted already (by its server, or by hand)
    try:
        if umount(mp):
            agent.log(f"unmounted {mp}")
    except BootseerError as e:
        agent.log(f"could not unmount {mp}: {e}")
    pid = int(task.get("pid") or 0)
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
