"""The checkpoint stage of `bootseer exec`: mount (or pull) `[checkpoint] name:tag` before the launcher starts.

Mount mode starts the FUSE server detached, with the exec process (which becomes the launcher) as its
owner: the server unmounts itself when that pid ends, and the agent's `ckpt-umount` task (agent_tasks.py)
does the same on its way out, so the mount never outlives the job even if one of the two dies. If the mount
cannot be made (no FUSE here), the stage warns and pulls instead; if the store is unreachable the
launch code warns and the job starts without a checkpoint. Either way the launcher finds the
directory in `$BOOTSEER_CKPT_DIR`.

Where: unless `[checkpoint] mountpoint` is configured, each run gets its own `<runtime>/ckpt-<run id>`
(rundirs.py), so two jobs of one user on one node each see their own checkpoint, and the directories
of ended runs are cleaned at the next start. A configured mount point is used as it is, but a live
mount there (another run's) is an error for this start, never unmounted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from ..stage import StageContext, StageResult
from .agent_tasks import UnmountTask

if TYPE_CHECKING:
    from .layout import Manifest


def run_stage(ctx: StageContext) -> StageResult:
    """Mount `[checkpoint] name:tag` (or pull it when the mode says so or the mount fails).

    Errors (no such checkpoint, an unreachable store, a failed pull) propagate: `launch.run_stages`
    warns and starts the job without a checkpoint.
    """
    from .catalog import NoCheckpoint, Targets, load_manifest

    ck = ctx.settings.checkpoint
    assert ck.name, "the stage table runs this stage only when [checkpoint] name is set"
    try:
        m = load_manifest(ctx.store, ck.name, ck.tag)
    except NoCheckpoint as e:  # the first start of a job, before its first push: nothing to mount
        # A job that never pushed has no tags: the expected first run, said (info), not warned about;
        # a tag asked for that is not there, while others are, is still a warning.
        (ctx.info if "no tags" in str(e) else ctx.warn)(f"checkpoint: {e}; starting without one")
        return StageResult("none", summary=f"no {ck.name}:{ck.tag} yet", cache="miss", reason=str(e))
    Targets(ctx.store, list(ck.targets)).check(m)  # the manifest's targets are not trusted
    # Resolved once, and this one path is used to mount, look up and unmount (or to pull into); a
    # symlink or another user's directory there, or another run's live mount, is refused
    # (MountpointError): no mount, no pull.
    mp = _mountpoint(ctx)
    extra: dict[str, Any] = {"checkpoint": f"{m.name}:{m.tag}", "mode": ck.mode}
    if ck.mode == "mount":
        result = _mount(ctx, m, mp, extra)
        if result is not None:
            return result
    return _pull(ctx, m, mp, extra)


def _mountpoint(ctx: StageContext) -> str:
    """This run's mount point: the configured one, or `<runtime>/ckpt-<run id>` (made without following
    a link someone else planted, after the directories of ended runs are cleaned)."""
    from ..paths import UnsafePath, default_mountpoint, make_private_dir, runtime_dir
    from .mount import MountpointError, prepare_mountpoint
    from .rundirs import sweep, write_owner

    ck = ctx.settings.checkpoint
    if ck.mountpoint != default_mountpoint():
        return prepare_mountpoint(ck.mountpoint)
    try:
        base = make_private_dir(runtime_dir())
    except OSError as e:  # UnsafePath, or e.g. a read-only /run
        why = str(e) if isinstance(e, UnsafePath) else f"{runtime_dir()}: {e.strerror}"
        raise MountpointError(f"runtime directory refused: {why}") from None
    mp = base / f"ckpt-{ctx.run.run}"
    sweep(base, str(mp), ctx.info)
    write_owner(mp, os.getpid())  # before the directory exists: a concurrent sweep leaves it alone
    return prepare_mountpoint(mp)


def _mount(ctx: StageContext, m: Manifest, mp: str, extra: dict[str, Any]) -> StageResult | None:
    """The detached mount, owned by this pid (the launcher's after execvp); None: no mount here, pull."""
    from .mount import mount_detached, mount_info

    missing = fuse_missing()
    if missing:  # say so in one line rather than wait for a mount that cannot appear
        ctx.warn(f"checkpoint: FUSE unavailable ({missing}); pulling {m.name}:{m.tag} to {mp} instead of mounting")
        extra["fallback"] = missing
        return None
    try:
        pid = mount_detached(
            m,
            mp,
            ctx.store.uri_with_credentials(),  # into the server's 0600 spec file, never its argv
            targets=list(ctx.settings.checkpoint.targets),
            owner_pid=os.getpid(),  # exec keeps this pid for the launcher
            log_path=ctx.run.run_dir / "ckpt-mount.log",
            allow_other=ctx.settings.checkpoint.allow_other,
        )
    except BootseerError as e:
        ctx.warn(f"cannot mount checkpoint {m.name}:{m.tag} at {mp} ({e}); pulling it instead")
        return None
    info = mount_info(mp)
    ctx.add_agent_task(UnmountTask(mountpoint=mp, pid=pid, dev=info["dev"] if info else ""))
    ctx.exports["BOOTSEER_CKPT_DIR"] = mp
    # no line of its own: exec prints one summary line (the job finds the path in $BOOTSEER_CKPT_DIR,
    # `bootseer report` in the event)
    return StageResult("mounted", summary=f"mounted {m.name}:{m.tag}", extra={**extra, "mountpoint": mp})


def fuse_missing(device: str = "/dev/fuse", euid: int | None = None) -> str:
    """What this node lacks for a FUSE mount ("" when nothing): the device, or (not root) fusermount3."""
    import shutil
    import stat

    try:
        if not stat.S_ISCHR(os.stat(device).st_mode):
            return f"{device} is not a device"
    except OSError:
        return f"{device} is missing"
    if not os.access(device, os.R_OK | os.W_OK):
        return f"{device} is not readable and writable by this user"
    root = (os.geteuid() if euid is None else euid) == 0  # root mounts without the setuid helper
    if not root and shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    return ""


def _pull(ctx: StageContext, m: Manifest, mp: str, extra: dict[str, Any]) -> StageResult:
    """Pull to the mountpoint; with [p2p] on, whole stripes through the node cache and the swarm."""
    from ..progress import byte_bar
    from .catalog import Targets
    from .pull import pull

    ck, p2p = ctx.settings.checkpoint, ctx.settings.p2p
    with byte_bar(m.total_size, f"pull {m.name}:{m.tag}", enabled=False if ctx.quiet else None) as advance:
        r = pull(
            m,
            Targets(ctx.store, list(ck.targets)),
            Path(mp),
            replace=True,
            p2p=p2p,
            cache=ctx.cache,
            whole_stripes=p2p.enabled,
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
