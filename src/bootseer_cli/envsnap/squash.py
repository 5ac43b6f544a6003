"""Squashing a chain of layers into one full snapshot ("env-squash"), once it reaches `[env] max_layers`.

The builder's tree holds exactly what the chain restores: the paths file (stamp.py) lists every path
the chain put there, merged link by link, and the image files it deleted. The squash writes those
paths, read from the tree, into one blob, provided every one is still as the chain wrote it (a file a
job changed since aborts the squash: a later build tries again), and publishes it under the same env
key, with depth 0, replacing the layer's ref. Later starts restore one blob; a child built on the
layer before it was replaced keeps its own chain (chain.py), and gc keeps those links for it.

The agent runs it after the launcher started (the task waits for the layer's ref first, so the full
snapshot is written after it, never under it); without an agent the builder runs it after its publish.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..agent import Agent
    from ..settings import Settings
    from ..store.cache import BlobCache
    from ..store.core import Store
    from .capture import Captured

POLL_S = 1.0


@dataclass(frozen=True)
class SquashTask:
    """The "env-squash" task: replace the layer `layer` of env `env_key` by a full snapshot of the tree."""

    finish: ClassVar[bool] = True  # runs to its end after the launcher ended (it is bounded by its checks)

    env_key: str
    roots: list[str]
    layer: str  # the layer's blob digest: the tree must still carry it
    ref_extra: dict[str, Any] = field(default_factory=dict)


def _full_capture(
    settings: Settings, cache: BlobCache, task: SquashTask, say: Callable[[str], None], held: bool
) -> Captured:
    """The blob of every path the chain put in the tree, under the tree lock (`held`: the caller's,
    the env stage's), checked as written."""
    from .capture import Captured
    from .lock import tree_lock
    from .manifest import scan
    from .segments import write_blob
    from .setup import excluded_paths
    from .stamp import _as_written, stamp_state
    from .tree import EnvTree

    roots = task.roots
    tree = EnvTree(roots)
    with contextlib.nullcontext() if held else tree_lock(roots, say, say):
        ok, why = stamp_state(tree, task.env_key)
        doc = tree.carried()
        if not ok or doc is None or doc.get("blob") != task.layer:
            raise BootseerError(f"the tree no longer carries layer {task.layer[:12]} ({why or 'another blob'})")
        rows = doc["entries"]
        changed = [r for r in rows if r[1] != "d" and not _as_written(r)]
        if changed:
            raise BootseerError(f"{len(changed)} path(s) changed since the layer was written (e.g. {changed[0][0]})")
        after = scan(roots, excluded_paths(settings.store))
        paths = sorted({r[0] for r in rows})
        missing = [p for p in paths if p not in after]
        if missing:
            raise BootseerError(f"{len(missing)} path(s) of the chain are gone (e.g. {missing[0]})")
        tmp_dir = cache.root / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        tmp = tmp_dir / f"squash-{uuid.uuid4().hex[:12]}.tar.zst"
        deletions = [str(d) for d in doc.get("deletions") or []]
        meta = {
            "roots": roots,
            "deletions": deletions,
            "env_key": task.env_key,
            "created": time.time(),
            "creator": socket.gethostname(),
        }
        written, entries = write_blob(tmp, after, paths, meta, False)
    return Captured(
        tmp, written.digest, written.size, written.files, written.raw_bytes, len(deletions), entries, deletions
    )


def squash(
    settings: Settings,
    store: Store,
    cache: BlobCache,
    task: SquashTask,
    say: Callable[[str], None],
    held: bool = False,
) -> str:
    """Capture the chain's result as one blob and publish it under the env key (depth 0). Its digest.

    `held`: the caller holds the tree lock already (the env stage without an agent)."""
    from .publish import publish
    from .stamp import write_stamp
    from .tree import EnvTree

    cap = _full_capture(settings, cache, task, say, held)
    extra = {k: v for k, v in task.ref_extra.items() if k not in ("parent", "chain", "depth")}
    # the layer's digest only as a prefix, for people: a full digest would keep the layer's blob live for gc
    extra.update(depth=0, squashed=task.layer[:16])
    extra.update(_kept_image(store, task.env_key))
    try:
        publish(settings.p2p, store, cache, cap, task.env_key, task.roots, extra=extra)
    finally:
        cap.blob.unlink(missing_ok=True)
    from .lock import tree_lock

    with contextlib.nullcontext() if held else tree_lock(task.roots, say, say):
        tree = EnvTree(task.roots)
        doc = tree.carried()
        if doc is not None and doc.get("blob") == task.layer:  # the stamp now names the full blob (same tree)
            write_stamp(tree, [task.env_key], cap.digest, cap.entries, cap.deletion_paths)
    say(f"env: squashed the chain of {task.env_key[:12]} into one snapshot {cap.digest[:12]}")
    return cap.digest


def _kept_image(store: Store, env_key: str) -> dict[str, Any]:
    """The layer's `fs_image` (envmount/image.py: a whole tree's image, or the layer's own with the
    images below it), kept by the squashed ref so `[env] mode = "mount"` nodes go on mounting the
    same tree; {} when it has none."""
    from ..envmount.image import FIELD
    from .catalog import REF_KIND

    try:
        ref = store.read_ref(REF_KIND, env_key) or {}
    except (BootseerError, OSError):  # the squash goes on without it: those nodes then extract
        return {}
    return {FIELD: ref[FIELD]} if isinstance(ref.get(FIELD), dict) else {}


def squash_task(task: SquashTask, agent: Agent) -> None:
    """Wait (bounded by `[env] wait_s`) for the layer's ref, then squash; a failure is only logged."""
    from ..store.cache import cache_for
    from .catalog import REF_KIND

    settings = agent.settings
    deadline = time.monotonic() + settings.env.wait_s
    while True:
        try:
            ref = agent.store.read_ref(REF_KIND, task.env_key)
        except (BootseerError, OSError):
            ref = None
        if ref is not None and ref.get("blob") == task.layer:
            break
        if ref is not None and ref.get("depth") == 0:
            return  # another node squashed it already
        if time.monotonic() >= deadline or _gone(task):
            agent.log(f"env-squash: layer {task.layer[:12]} never published; not squashed")
            return
        time.sleep(POLL_S)
    try:
        squash(settings, agent.store, cache_for(settings.store), task, agent.log)
    except (BootseerError, OSError) as e:
        agent.log(f"env-squash: env {task.env_key[:12]} not squashed: {e}")


def _gone(task: SquashTask) -> bool:
    """Whether the tree no longer carries the layer (nothing left to squash from)."""
    from .tree import EnvTree

    doc = EnvTree(task.roots).carried() if all(os.path.isdir(r) for r in task.roots) else None
    return doc is None or doc.get("blob") != task.layer
