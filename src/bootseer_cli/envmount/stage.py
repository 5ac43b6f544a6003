"""The env stage's mount path (`[env] mode = "mount"`), and the "env-umount" agent task that holds it.

On a node whose roots lack the env, with a ref that names an image (image.py): fetch the image whole
into the node cache through delivery.py, verified by digest like every blob (filling it lazily by
ranges, hot ranges first, is the next step of issue 48), mount it read-only once per node (lowers.py:
it stays for the next start, whose imports then find their pages decompressed), and over each root a
writable overlay whose upper directory is this run's (runs.py). The overlays live as long as the
launcher: the agent's "env-umount" task takes them down when it ends; a run killed with its agent
leaves a record the next start's sweep undoes.

When mounting is not possible here, `try_mount` says why in one line and the caller extracts:
- the ref names no image (published by extract mode, or the builder had no mksquashfs);
- no agent (`[exec] agent = false`): nothing would take the mounts down when the job ends;
- this node can mount neither with the kernel nor with FUSE (mounts.py `method_here`);
- a root already holds files (a mount point or not), or is a link: an overlay there would hide them
  from the job (and from any other job using them) for as long as it runs, so the env is extracted
  next to them, as without mount mode (an empty mount point takes the overlay);
- a mount fails (what failed is undone first).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError, StageFatal

if TYPE_CHECKING:
    from ..agent import Agent
    from ..delivery import Fetched
    from ..stage import StageContext, StageResult
    from ..store.core import Store
    from .runs import RunMounts


def _blocked_root(roots: list[str]) -> str:
    """Why some root cannot take an overlay ("" when each is absent or an empty directory)."""
    from .image import OWN_PREFIX
    from .mounts import mount_info
    from .runs import live_mount

    for r in roots:
        if os.path.islink(r) or os.path.realpath(r) != r:
            return f"{r} is a link or lies below one"  # mount(8) would follow it elsewhere
        if not os.path.lexists(r):
            continue
        if not os.path.isdir(r):
            return f"{r} is not a directory"
        info = mount_info(r)
        if info is not None and live_mount(r, info["dev"]):
            continue  # another live run's env here: this run's overlay stacks over it, its own
        # An empty mount point (a container's volume, a node's bind mount of its own venv directory)
        # hides nothing either: the overlay stacks over it, and the mount below is as it was afterwards.
        with os.scandir(r) as it:  # bootseer's own per-tree files (the tree lock's file) hide nothing of the job's
            first = next((e for e in it if not e.name.startswith(OWN_PREFIX)), None)
        if first is not None:
            where = "is a mount point that holds" if info is not None else "already holds"
            return f"{r} {where} files the image would hide ({first.name}, ...)"
    return ""


def why_not(ctx: StageContext, ref: dict[str, Any], roots: list[str]) -> str:
    """Why this start cannot mount the ref's image ("" when it can try)."""
    from .image import image_stack
    from .mounts import method_here

    if image_stack(ref) is None:
        return "the snapshot has no squashfs image (published in extract mode)"
    if not ctx.settings.exec.agent:
        return "mount mode needs the agent ([exec] agent) to take the mounts down"
    how, why = method_here()
    return why if not how else _blocked_root(roots)


def try_mount(
    ctx: StageContext, store: Store, key: str, roots: list[str], ref: dict[str, Any]
) -> tuple[StageResult | None, str]:
    """(the stage's result, "") with the env mounted at the roots, or (None, why not) to extract instead."""
    from .image import image_stack
    from .lowers import lowers_root
    from .runs import RunMounts, sweep

    stack = image_stack(ref) or []  # top first: a layer's image over its parent's, down to a whole one
    # the mounts of killed runs go before this one looks at the roots; the image lowers it uses stay
    sweep(keep=ctx.run.run, log=ctx.info, lowers=[str(lowers_root() / d) for d, _ in stack])
    why = why_not(ctx, ref, roots)
    if why:
        return None, why
    t0 = time.time()
    fetched: list[Fetched] = []
    for digest, size in stack:
        try:
            fetched.append(_local_image(ctx, store, digest, size))
        except StageFatal:
            raise
        except Exception as e:  # the store, the swarm, the cache: extraction may still work (its own blob)
            return None, f"image {digest[:12]} not fetched: {e}"
    t1 = time.time()
    rm = RunMounts.create(ctx.run.run, os.getpid())  # exec keeps this pid for the launcher
    try:
        how = _mount_all(rm, [(str(f.path), d) for f, (d, _) in zip(fetched, stack, strict=True)], roots)
    except (BootseerError, OSError) as e:
        rm.teardown()
        return None, f"mount failed: {e}"
    ctx.add_agent_task(MountTask(root=str(rm.root)))
    return _mounted_result(fetched, stack, how, t1 - t0, time.time() - t1), ""


def _identity(path: Path) -> str:
    st = os.lstat(path)
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_ctime_ns}"


def _local_image(ctx: StageContext, store: Store, digest: str, size: int) -> Fetched:
    """The image in the node cache, its digest verified once: on the download (or a first hash of a
    cached copy), then remembered by the file's identity (device, inode, size, ctime: any write,
    rename or replacement changes one), so a later start does not read 200 MB again before it mounts.
    Per-range verification comes with the lazy fill (issue 48 item 2)."""
    from .. import delivery
    from ..delivery import Fetched
    from .runs import mount_root

    record = mount_root().parent / "env-mount-verified" / digest
    path = ctx.cache.path(digest)
    try:
        trusted = record.read_text() == _identity(path)
    except OSError:
        trusted = False
    if trusted and ctx.cache.peek(digest) is not None:  # its recency refreshed (a new ctime: recorded)
        fetched = Fetched(path, "cache")
    else:
        fetched = delivery.fetch_verified(ctx.settings.p2p, store, ctx.cache, digest, size or None)
    from ..paths import make_private_dir

    tmp = make_private_dir(record.parent) / f".{digest}.{os.getpid()}"
    tmp.write_text(_identity(Path(fetched.path)))
    os.replace(tmp, record)
    return fetched


def _mount_all(rm: RunMounts, images: list[tuple[str, str]], roots: list[str]) -> str:
    """Each image (path, digest; top first) at its shared lower (lowers.py: mounted once per node, kept
    for the next start's warm pages), an overlay over each root; returns how ("kernel squashfs + kernel
    overlay"). A layer's image lacks a root it changed nothing in: that root's overlay stacks the images
    that hold it."""
    from .lowers import shared_lower
    from .mounts import mount_overlay

    lowers, lower_how = [], set()
    for image, digest in images:
        lower, dev, how = shared_lower(image, digest)
        rm.mounts.append({"path": lower, "dev": dev, "shared": "1"})
        rm.save()
        lowers.append(lower)
        lower_how.add(how)
    over = set()
    for i, root in enumerate(roots):
        layers = []
        for lower in lowers:
            at = lower + root
            if not os.path.lexists(at) and lower is not lowers[-1]:
                continue  # a layer that changed nothing under this root
            if os.path.realpath(at) != os.path.realpath(lower) + root or not os.path.isdir(at):
                raise BootseerError(f"the image holds no plain directory at {root}")  # no link leads out
            layers.append(at)
        os.makedirs(root, mode=0o755, exist_ok=True)
        dev, how = mount_overlay(layers, rm.dir("upper", str(i)), rm.dir("work", str(i)), root)
        rm.add(root, dev)
        over.add(how)
    n = f"{len(images)} images: " if len(images) > 1 else ""
    return f"{n}{'/'.join(sorted(lower_how))} squashfs + {'/'.join(sorted(over))} overlay"


def _mounted_result(
    fetched: list[Fetched], stack: list[tuple[str, int]], how: str, fetch_s: float, mount_s: float
) -> StageResult:
    from ..stage import StageResult
    from ..units import fmt_bytes

    from_store = sum(f.bytes_from_store for f in fetched)
    from_peers = sum(f.bytes_from_peers for f in fetched)
    srcs = sorted({"node cache" if f.source == "cache" else f.source for f in fetched})
    size = sum(n for _, n in stack)
    names = " over ".join(d[:12] for d, _ in stack)
    return StageResult(
        outcome="restored",
        summary=f"mounted image {names} ({fmt_bytes(size)}, from {'/'.join(srcs)}; {how}) in {mount_s:.2f} s",
        cache="hit",
        bytes=from_store + from_peers,
        bytes_from_store=from_store,
        bytes_from_peers=from_peers,
        reason="; ".join(f.note for f in fetched if f.note),
        extra={
            "mode": "mount",
            "how": how,
            "images": len(stack),
            "fetch_s": round(fetch_s, 3),
            "mount_s": round(mount_s, 3),
        },
    )


@dataclass(frozen=True)
class MountTask:
    """The "env-umount" agent task: this run's mount directory (runs.py), taken down when the launcher ends."""

    root: str


def umount_task(task: MountTask, agent: Agent) -> None:
    """Hold the env mounts while the launcher runs; unmount them (only this run's) when it ends."""
    from .runs import RunMounts

    while not agent.wait(5.0):
        pass
    try:
        rm = RunMounts.load(Path(task.root))
    except (OSError, ValueError) as e:
        agent.log(f"env-umount: no mount record at {task.root} ({e})")
        return
    if not rm.teardown(agent.log):
        agent.log("env-umount: some mounts stayed; the next start takes them down")
