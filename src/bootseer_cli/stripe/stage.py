"""The checkpoint stage of `bootseer exec`: mount (or pull) `[checkpoint] name:tag` before the launcher starts.

Mount mode starts the FUSE server detached, with the exec process (which becomes the launcher) as its
owner: the server unmounts itself when that pid ends, and the agent's `ckpt-umount` task (agent_tasks.py)
does the same on its way out, so the mount never outlives the job even if one of the two dies. If the mount
cannot be made (no FUSE here), the stage warns and pulls instead; if the store is unreachable the
launch code warns and the job starts without a checkpoint. Either way the launcher finds the
directory in `$BOOTSEER_CKPT_DIR`.

The directory is writable (a trainer resumes from `out_dir/ckpt.pt` and saves the next one there): in
mount mode an overlay (overlay.py) whose lower layer is the read-only stripe mount, at
`<runtime>/ckpt-<run id>.ro` (with, on the node whose run saved the tag, that save's own local copy
stacked over it, or alone where it is all of the tag: kept.py), and whose upper layer is on local disk;
in pull mode the pulled directory itself. Either way a journal is written first and the agent's
"ckpt-writeback" task pushes what the job wrote as a new tag after the launcher ends (writeback.py); a
write-back an earlier run's agent left unfinished is pushed here, before `latest` is resolved. Where no
overlay can be made (no fuse-overlayfs for a plain user, an upper directory the kernel refuses) the
stage pulls instead.
Nothing the job wrote is removed: a pulled directory holding the job's files is kept (and said).

Where: unless `[checkpoint] mountpoint` is configured, each run gets its own `<runtime>/ckpt-<run id>`
(rundirs.py), so two jobs of one user on one node each see their own checkpoint, and the directories
of ended runs are cleaned at the next start. A configured mount point is used as it is, but a live
mount there (another run's) is an error for this start, never unmounted.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from ..stage import StageContext, StageResult
from .agent_tasks import UnmountTask, WritebackTask

if TYPE_CHECKING:
    from .kept import Held
    from .layout import Manifest


def run_stage(ctx: StageContext) -> StageResult:
    """Mount `[checkpoint] name:tag` (or pull it when the mode says so or the mount fails).

    Errors (no such checkpoint, an unreachable store, a failed pull) propagate: `launch.run_stages`
    warns and starts the job without a checkpoint.
    """
    from .catalog import NoCheckpoint, Targets, Unverified, load_manifest

    ck = ctx.settings.checkpoint
    assert ck.name, "the stage table runs this stage only when [checkpoint] name is set"
    _finish_pending(ctx, ck.name)
    try:
        m = load_manifest(ctx.store, ck.name, ck.tag)
    except NoCheckpoint as e:  # the first start of a job, before its first push: nothing to mount
        # A job that never pushed has no tags: the expected first run, which still gets a writable
        # directory whose contents are pushed as the first tag; a tag asked for by name that is not
        # there is a warning, and the job starts without a checkpoint directory.
        if ck.tag == "latest" and "no tags" in str(e):
            return _first_start(ctx, ck.name)
        ctx.warn(f"checkpoint: {e}; starting without one")
        summary = f"{ck.name}:{ck.tag} unverified" if isinstance(e, Unverified) else f"no {ck.name}:{ck.tag} yet"
        return StageResult("none", summary=summary, cache="miss", reason=str(e))
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
    sweep(base, str(mp), ctx.info, ctx.warn)
    write_owner(mp, os.getpid())  # before the directory exists: a concurrent sweep leaves it alone
    return prepare_mountpoint(mp)


def _mount(ctx: StageContext, m: Manifest, mp: str, extra: dict[str, Any]) -> StageResult | None:
    """The writable view: the detached read-only mount (owned by this pid, the launcher's after execvp)
    under an overlay at `mp`; None: no mount here, pull (a pulled directory is writable too).

    On the node whose run saved `m` whole (kept.py `WHOLE`), the view is that save alone under the
    overlay: no stripe mount, no server, nothing read from the store."""
    from .overlay import overlay_missing

    missing = overlay_missing()
    if missing:
        ctx.warn(f"checkpoint: FUSE unavailable ({missing}); pulling {m.name}:{m.tag} to {mp} instead of mounting")
        extra["fallback"] = missing
        return None
    held = _kept_copy(ctx, m)
    try:
        result = _mount_view(ctx, m, mp, extra, held)
    except BaseException:
        _release(ctx, held)
        raise
    if result is None:
        _release(ctx, held)
    return result


def _mount_view(
    ctx: StageContext, m: Manifest, mp: str, extra: dict[str, Any], held: Held | None
) -> StageResult | None:
    from .mount import mount_detached, mount_info, umount
    from .overlay import mount_overlay, write_dirs

    whole = held is not None and held.whole
    missing = fuse_missing() if not whole or os.geteuid() != 0 else ""  # a plain user's overlay is FUSE too
    if missing:  # say so in one line rather than wait for a mount that cannot appear
        ctx.warn(f"checkpoint: FUSE unavailable ({missing}); pulling {m.name}:{m.tag} to {mp} instead of mounting")
        extra["fallback"] = missing
        return None
    lower = ""
    if not whole:
        lower = _lower_mountpoint(ctx)
        try:
            pid = mount_detached(
                m,
                lower,
                ctx.store.uri_with_credentials(),  # into the server's 0600 spec file, never its argv
                targets=list(ctx.settings.checkpoint.targets),
                owner_pid=os.getpid(),  # exec keeps this pid for the launcher
                log_path=ctx.run.run_dir / "ckpt-mount.log",
                allow_other=ctx.settings.checkpoint.allow_other,
                above=mp,  # taken down with the mount when the launcher ends, even where no agent runs
            )
        except BootseerError as e:
            ctx.warn(f"cannot mount checkpoint {m.name}:{m.tag} at {lower} ({e}); pulling it instead")
            return None
    lower_dev = (mount_info(lower) or {}).get("dev", "") if lower else ""
    try:
        dirs = write_dirs(ctx.run.run)
        if lower:
            dev = mount_overlay(lower, dirs, mp, above=(str(held.upper),) if held else ())
        else:
            assert held is not None
            dev = mount_overlay(str(held.upper), dirs, mp)
    except (BootseerError, OSError) as e:
        if lower:
            with contextlib.suppress(BootseerError):
                umount(lower, dev=lower_dev)
        ctx.warn(f"checkpoint: no writable view at {mp} ({e}); pulling {m.name}:{m.tag} instead")
        return None
    kept_fd = held.fd if held else -1
    _hand_over(ctx, m, "overlay", dirs.root, str(dirs.upper), mountpoint=mp, dev=dev, kept_fd=kept_fd)
    if lower:
        ctx.add_agent_task(UnmountTask(mountpoint=lower, pid=pid, dev=lower_dev, rundir=True))
    ctx.exports["BOOTSEER_CKPT_DIR"] = mp
    # no line of its own: exec prints one summary line (the job finds the path in $BOOTSEER_CKPT_DIR,
    # `bootseer report` in the event)
    if whole:
        summary = f"mounted {m.name}:{m.tag}, all of it from local disk (this node's own save)"
    else:
        summary = f"mounted {m.name}:{m.tag}" + (", its newest save from local disk" if held else "")
    facts = {"mountpoint": mp, "local_copy": held is not None, "stripe_mount": bool(lower)}
    return StageResult("mounted", summary=summary, extra={**extra, **facts})


def _kept_copy(ctx: StageContext, m: Manifest) -> Held | None:
    """This node's own copy of what the run that pushed `m` saved (kept.py), holding its shared lock,
    whose fd goes to the agent (it releases it once the view is down); None: none usable."""
    from .kept import hold_for

    if not ctx.settings.checkpoint.keep_local or not ctx.settings.exec.agent:
        return None
    held = hold_for(m)
    if held is not None:
        ctx.agent_fds.append(held.fd)
    return held


def _release(ctx: StageContext, held: Held | None) -> None:
    """A copy not under a view after all: not held."""
    if held is not None and held.fd in ctx.agent_fds:
        ctx.agent_fds.remove(held.fd)
        os.close(held.fd)


def _lower_mountpoint(ctx: StageContext) -> str:
    """The read-only stripe mount under the overlay: `<runtime>/ckpt-<run id>.ro`, this run's own."""
    from ..paths import make_private_dir, runtime_dir
    from .mount import prepare_mountpoint
    from .rundirs import LOWER_SUFFIX, write_owner

    lower = make_private_dir(runtime_dir()) / f"ckpt-{ctx.run.run}{LOWER_SUFFIX}"
    write_owner(lower, os.getpid())
    return prepare_mountpoint(lower)


def _first_start(ctx: StageContext, name: str) -> StageResult:
    """No tag of `name` yet: the job gets an empty writable directory where the checkpoint would be
    mounted, and what it saves there is pushed behind it as the first tag (`latest` then names it).
    A directory there already holding files (a configured mount point) is handed over as it is and
    not pushed: bootseer pushes only what it knows the job wrote."""
    from .overlay import write_dirs

    mp = _mountpoint(ctx)
    extra: dict[str, Any] = {"checkpoint": f"{name}:latest", "mode": "new", "mountpoint": mp}
    ctx.exports["BOOTSEER_CKPT_DIR"] = mp
    if any(Path(mp).iterdir()):
        ctx.warn(f"checkpoint: no tags of {name} yet, and {mp} holds files; kept as it is, not pushed")
        return StageResult("kept", summary=f"kept {mp}", reason="it holds files already", extra=extra)
    _hand_over(ctx, None, "new", write_dirs(ctx.run.run, overlay=False).root, mp, name=name)
    summary = f"{name}: none yet, writable dir, pushed behind the job"
    return StageResult("new", summary=summary, cache="miss", reason=f"no tags of {name} yet", extra=extra)


def _hand_over(
    ctx: StageContext,
    m: Manifest | None,
    kind: str,
    root: Path,
    path: str,
    mountpoint: str = "",
    dev: str = "",
    name: str = "",
    kept_fd: int = -1,
) -> None:
    """Write the write-back journal, and give the agent the task that pushes what the job writes
    (`m` None: a first start, no parent tag). A pulled copy or an overlay's mount point, when it is
    this run's own `<runtime>/ckpt-<run id>` (no `mountpoint` configured), is the agent's to remove
    after the push; a configured one is the user's and stays, and so does a first start's directory
    (the job's own first save, left where the job put it)."""
    from ..paths import default_mountpoint
    from .push import default_tag
    from .rundirs import owner_stamp
    from .writeback import Journal, begin

    owner = owner_stamp(os.getpid())
    parent = (m.name, m.tag) if m is not None else (name, "")
    begin(root, Journal(kind, *parent, default_tag(), path, owner=owner, mountpoint=mountpoint))
    own = ctx.settings.checkpoint.mountpoint == default_mountpoint() and kind != "new"
    rundir = (mountpoint or path) if own else ""
    ctx.add_agent_task(WritebackTask(root=str(root), mountpoint=mountpoint, dev=dev, rundir=rundir, kept_fd=kept_fd))


def _finish_pending(ctx: StageContext, name: str) -> None:
    """Push what an earlier run of this checkpoint wrote and its agent did not push (it died)."""
    from ..ckpt import phase_bars
    from .writeback import finish_pending, pending

    if not pending(name):
        return
    with phase_bars(f"{name} (an earlier run's write-back)", enabled=False if ctx.quiet else None) as progress:
        finish_pending(ctx.store, ctx.settings.checkpoint, name, ctx.info, progress)


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
    """Pull to the mountpoint; with [p2p] on, whole stripes through the node cache and the swarm.

    A directory there holding files bootseer did not put there (the job's, not pushed yet) is kept as it
    is, said in one line, and handed to the job: never replaced."""
    from ..progress import byte_bar
    from .catalog import Targets
    from .overlay import write_dirs
    from .pull import pull

    ck, p2p = ctx.settings.checkpoint, ctx.settings.p2p
    dest = Path(mp)
    if not pull_is_safe(dest, m):
        return _keep(ctx, m, dest, extra)
    with byte_bar(m.total_size, f"pull {m.name}:{m.tag}", enabled=False if ctx.quiet else None) as advance:
        r = pull(
            m,
            Targets(ctx.store, list(ck.targets)),
            dest,
            replace=True,
            p2p=p2p,
            cache=ctx.cache,
            whole_stripes=p2p.enabled,
            advance=advance,
        )
    _hand_over(ctx, m, "pull", write_dirs(ctx.run.run, overlay=False).root, str(r.dest))
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


def pull_is_safe(dest: Path, m: Manifest) -> bool:
    """Pulling into `dest` removes nothing but bootseer's own: it is missing, empty, or exactly a pull."""
    from .pull import job_files

    return not dest.is_dir() or not any(dest.iterdir()) or not job_files(dest)


def _keep(ctx: StageContext, m: Manifest, dest: Path, extra: dict[str, Any]) -> StageResult:
    """`dest` holds files bootseer did not put there: kept, said, and given to the job (pushed after it
    when they are a pull's changes; a directory bootseer never pulled into is not pushed)."""
    from .overlay import write_dirs
    from .pull import job_files, pulled_from

    mine = job_files(dest)
    ctx.warn(
        f"checkpoint: {dest} holds {len(mine)} file(s) bootseer did not put there ({mine[0]}, ...); "
        f"kept as it is, not replaced by {m.name}:{m.tag}"
    )
    if pulled_from(dest) == m.name:  # a pull of this checkpoint that the job changed: pushed after it
        _hand_over(ctx, m, "pull", write_dirs(ctx.run.run, overlay=False).root, str(dest))
    ctx.exports["BOOTSEER_CKPT_DIR"] = str(dest)
    return StageResult("kept", summary=f"kept {dest}", reason="it holds files the job wrote", extra=extra)
