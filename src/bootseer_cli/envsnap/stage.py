"""The env stage of `bootseer exec`: stamp → restore → single-flight setup+capture → local setup.

Order of preference (DESIGN.md section 2, step 4):
1. the tree already carries this env (a stamp whose sentinel files are untouched): nothing to do;
2. the store has a snapshot for the env key: fetch, verify, restore;
3. otherwise one node takes the lease, runs the setup, captures and publishes; the others poll the
   ref for up to `[env] wait_s`, then restore what it published, or run the setup themselves. With
   the agent (`[exec] agent`, the default) the builder captures and stamps before exec and the agent
   uploads while the job starts, renewing the lease until the ref is written (agent_tasks.py);
4. on any failure of bootseer's own (store down, bad blob, a snapshot that cannot be read, planned
   or extracted, whatever exception it raises): warn, run the setup, go on. Only the user's setup
   failing stops the start, with the setup's exit status.

When the env key itself cannot be computed (a `-r` file that cannot be read), the setup runs as it
would without bootseer, so it fails with its own message and the start with its status. Everything
from the stamp check to the new stamp happens under the node-local tree lock (lock.py), after an
interrupted restore of this tree was put back (journal.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError, StageFatal
from ..stage import StageContext, StageResult
from ..units import count, fmt_bytes

if TYPE_CHECKING:
    from ..store.core import Lease, Store
    from .capture import Captured
    from .layers import Over
    from .lease import LeaseKeeper
    from .manifest import Manifest
    from .restore import Restored
    from .setup import SetupRun
    from .setupwrites import Written
    from .tree import EnvTree

POLL_S = 1.0
# Tries at the build lease when the store refuses the attempt (an error, not another holder), POLL_S
# apart, before the setup runs here unpublished: a store down for good costs this node 2 s more.
LEASE_TRIES = 3


def _lease_ttl(ctx: StageContext) -> float:
    """`[env] lease_ttl_s`: how long after a builder dies the next node builds (at least 1 s)."""
    return max(1.0, ctx.settings.env.lease_ttl_s)


def _restored_result(r: Restored, note: str = "") -> StageResult:
    summary = f"restored {count(r.files, 'file')} ({fmt_bytes(r.raw_bytes)} unpacked) from {r.source}"
    if r.layers:
        summary += f" (layer {r.layers}, {r.present} link(s) already in the tree)"
    summary += f", {note}" if note else ""
    return StageResult(
        outcome="restored",
        summary=summary,
        cache="hit",
        bytes=max(r.bytes_read, r.bytes_from_store + r.bytes_from_peers),  # a node cache hit's bytes count too
        bytes_from_store=r.bytes_from_store,
        bytes_from_peers=r.bytes_from_peers,
        reason=r.fetch_note,
        extra={
            "files": r.files,
            "fetch_s": round(r.seconds_fetch, 3),
            "extract_s": round(r.seconds_extract, 3),
            "layers": r.layers,
        },
    )


def run_stage(ctx: StageContext) -> StageResult:
    from .tree import EnvTree

    tree = EnvTree(ctx.settings.env.resolve_roots())  # one value from here on: its carried document read once
    try:
        key = ctx.keys.env.digest
    except StageFatal:
        raise
    except Exception as e:  # the key's inputs (a `-r` file …) cannot be read: the setup decides
        return _setup_as_without_bootseer(ctx, tree, e)
    with tree.locked(ctx.info, ctx.warn):
        return _locked_stage(ctx, tree, key)


def _setup_as_without_bootseer(ctx: StageContext, tree: EnvTree, e: Exception) -> StageResult:
    """No env key: no snapshot can be found or made. Run the setup exactly as without bootseer (on the
    tree as it is), so a setup that cannot work fails the start with its own message and status."""
    from .setup import run_setup
    from .stamp import remove_stamp

    ctx.warn(f"env: no env key ({e}); running the setup as without bootseer")
    remove_stamp(tree)  # the tree is about to change: whatever it carried is no longer known
    t0 = time.time()
    run_setup(ctx.settings.env, ctx.info)
    return StageResult("setup", summary=f"setup {time.time() - t0:.1f} s (no env key)", cache="miss", reason=str(e))


def _locked_stage(ctx: StageContext, tree: EnvTree, key: str) -> StageResult:
    """Stamp → restore → single flight, holding the tree lock."""
    from .catalog import REF_KIND
    from .stamp import stamp_state

    ok, why = stamp_state(tree, key)
    if ok:
        return StageResult(outcome="present", summary="env present (stamp)", cache="hit")
    if why.startswith("stale"):
        ctx.warn(f"env: {why}; restoring again")
    try:
        store = ctx.store
        ref = store.read_ref(REF_KIND, key)
    except Exception as e:  # the store (or its client library) failed in any way: set up locally
        ctx.warn(f"env: store unreachable ({e}); running the setup locally")
        return _local_setup(ctx, tree, key, reason="store unreachable")
    note, failed = "", ""
    if ref is not None:
        result = _try_restore(ctx, store, key, tree, ref)
        if result is not None:
            return result
        note, failed = "restore failed", str(ref.get("blob", ""))
    ran = {"setup": False}
    try:
        return _single_flight(ctx, store, key, tree, note, ran, failed)
    except StageFatal:
        raise
    # Broad on purpose: whatever bootseer's own machinery throws half way (store, cache, archive),
    # the job must still get its env, so the setup runs here instead of the start failing.
    except Exception as e:
        if ran["setup"]:
            ctx.warn(f"env: setup done, but the snapshot step failed: {e}")
            return StageResult("setup", summary="setup ran (snapshot step failed)", cache="miss", reason=str(e))
        ctx.warn(f"env: {e}; running the setup locally")
        return _local_setup(ctx, tree, key, reason="store failed")


def _try_restore(ctx: StageContext, store: Store, key: str, tree: EnvTree, ref: dict[str, Any]) -> StageResult | None:
    from ..gc import touch_used
    from .catalog import REF_KIND
    from .restore import restore

    note = ""
    if ctx.settings.env.mode == "mount":  # the image mounted at the roots (envmount/), else extracted, saying why
        from ..envmount.stage import try_mount

        mounted, why = try_mount(ctx, store, key, tree.roots, ref)
        if mounted is not None:
            touch_used(store, REF_KIND, key, ref)
            return mounted
        note = f"not mounted: {why}"
    try:
        r = restore(ctx.settings.p2p, store, ctx.cache, key, tree, ref=ref)
    except StageFatal:
        raise
    except Exception as e:  # restore() normalises to BootseerError; anything else is still not the user's
        blob = str(ref.get("blob", "")) if isinstance(ref, dict) else "?"
        ctx.warn(f"env: could not restore snapshot {blob[:12]}: {e}; running the setup instead")
        return None
    if r is None:
        return None
    touch_used(store, REF_KIND, key, ref)  # at most once a day: `bootseer gc` keeps what jobs use
    return _restored_result(r, note)


def _replaced(ref: dict[str, Any], failed: str) -> bool:
    """Whether `ref` names a snapshot other than the one this start just failed to restore (`failed`):
    the same one again is not retried (a second download of a broken blob, a second warning) but
    waited on, as no ref yet, until a builder publishes its replacement."""
    return not (failed and ref.get("blob") == failed)


def _single_flight(
    ctx: StageContext, store: Store, key: str, tree: EnvTree, note: str, ran: dict[str, bool], failed: str = ""
) -> StageResult:
    """Take the lease and build, or wait for the holder's snapshot (then restore it, or set up here)."""
    from .catalog import REF_KIND
    from .lease import lease_key

    wait_s = ctx.settings.env.wait_s
    deadline = time.monotonic() + wait_s
    announced = False
    refused = 0
    while True:
        try:
            lease = store.try_lease(lease_key(key), _lease_ttl(ctx))
        except BootseerError as e:
            # A store that fails one request under load is not a store that is down: giving up at once
            # ran a setup nobody publishes while the others waited (issue 46). A few tries, then as before.
            refused += 1
            if refused < LEASE_TRIES and time.monotonic() + POLL_S < deadline:
                ctx.info(f"env: the build lease could not be taken ({e}); trying again")
                time.sleep(POLL_S)
                continue
            ctx.warn(f"env: cannot take the build lease ({e}); running the setup locally")
            return _local_setup(ctx, tree, key, reason="lease failed")
        if lease is not None:
            return _build(ctx, store, key, tree, lease, note, ran, failed)
        if not announced:
            ctx.info(f"env: another node is building env {key[:12]}; waiting up to {wait_s:.0f} s for its snapshot")
            announced = True
        if time.monotonic() >= deadline:
            ctx.warn(f"env: no snapshot published within [env] wait_s = {wait_s:.0f} s; running the setup here")
            return _local_setup(ctx, tree, key, reason="wait timed out")
        time.sleep(min(POLL_S, max(0.05, deadline - time.monotonic())))
        try:
            ref = store.read_ref(REF_KIND, key)
        except Exception:  # a read that failed is a poll that saw nothing yet
            ref = None
        if ref is not None and _replaced(ref, failed):
            result = _try_restore(ctx, store, key, tree, ref)
            if result is not None:
                result.summary += " (waited for the builder)"
                return result
            return _local_setup(ctx, tree, key, reason="restore failed")


def _build(
    ctx: StageContext,
    store: Store,
    key: str,
    tree: EnvTree,
    lease: Lease,
    note: str,
    ran: dict[str, bool],
    failed: str = "",
) -> StageResult:
    """Holder of the lease: setup, capture, publish (or hand the upload and the lease to the agent).
    A failed capture/publish only warns."""
    from .catalog import REF_KIND
    from .lease import LeaseKeeper
    from .setup import fresh_setup

    with LeaseKeeper(lease, _lease_ttl(ctx)) as keeper:
        # The lease may have been taken just after another node published: check once more.
        ref = store.read_ref(REF_KIND, key)
        if ref is not None and _replaced(ref, failed):
            result = _try_restore(ctx, store, key, tree, ref)
            if result is not None:
                return result
        built = _setup_over(ctx, store, tree, ran) if ctx.settings.env.layers else None
        run, over = built if built is not None else (None, None)
        if run is None:
            run = fresh_setup(
                ctx.settings.env,
                ctx.settings.store,
                tree,
                ctx.info,
                on_start=lambda: ran.update(setup=True),
                warn=ctx.warn,
            )
        b = Built(key, tree, run.baseline, run.started, run.seconds, note, over, run.writes)
        if ctx.settings.exec.agent:
            return _capture_and_hand_over(ctx, keeper, b)
        return _capture_and_publish(ctx, store, b)


def _setup_over(ctx: StageContext, store: Store, tree: EnvTree, ran: dict[str, bool]) -> tuple[SetupRun, Over] | None:
    """The setup over the nearest published snapshot (layers.py), or None: set up from the image."""
    from .layers import setup_over

    return setup_over(
        ctx.settings, store, ctx.cache, ctx.keys, tree, ctx.info, ctx.warn, on_start=lambda: ran.update(setup=True)
    )


@dataclass(frozen=True)
class Built:
    """What the lease holder's setup left for the capture: the baseline, the timing, the parent (a layer)."""

    key: str
    tree: EnvTree
    baseline: Manifest
    started: float
    setup_s: float
    note: str
    over: Over | None
    writes: Written | None = None  # what the setup's processes wrote (setupwrites.py)

    @property
    def roots(self) -> list[str]:
        return self.tree.roots

    def stamp(self, ctx: StageContext, cap: Captured, keys: list[str] | None = None) -> None:
        """Stamp the tree with the capture (merged over the parent's paths for a layer)."""
        from .stamp import write_stamp

        merged = self.over.merged([*cap.entries, *cap.unchanged], cap.deletion_paths) if self.over is not None else None
        write_stamp(self.tree, keys or [self.key], cap.digest, cap.entries, cap.deletion_paths, carried=merged)

    def ref_extra(self, ctx: StageContext) -> dict[str, Any]:
        from .layers import ref_fields

        try:
            return ref_fields(ctx.settings, ctx.keys, self.roots, self.over)
        except Exception as e:  # the inputs could not be read: a snapshot no later build compares with
            ctx.warn(f"env: setup inputs not recorded ({e})")
            return {}

    def what(self, setup_s: float) -> str:
        """`setup 12.0 s` or `setup over 3f2a… (layer 2) 3.1 s` for the summary line."""
        if self.over is None:
            return f"setup {setup_s:.1f} s"
        return f"setup over {self.over.choice.key[:12]} (layer {self.over.depth}) {setup_s:.1f} s"


def _capture(ctx: StageContext, b: Built) -> Captured | StageResult:
    """The capture after the lease holder's setup; when it fails, the tree stamped and the result."""
    from .capture import capture
    from .rewrites import local_chain

    try:
        parents = local_chain(b.over.chain, ctx.cache, ctx.store) if b.over is not None else []
        return capture(
            ctx.settings.store,
            b.roots,
            b.baseline,
            b.key,
            ctx.cache,
            ctx.warn,
            since=b.started - 1,
            info=ctx.info,
            parents=parents,
            setup_writes=b.writes,
        )
    except StageFatal:
        raise
    except BootseerError as e:
        ctx.warn(f"env: setup done, but not captured: {e}")
        _stamp_after_setup(ctx, b.tree, b.key, b.baseline, b.over)
        summary = f"{b.what(b.setup_s)} (not captured)"
        return StageResult("setup", summary=summary, cache="miss", reason=str(e))


def _capture_and_hand_over(ctx: StageContext, keeper: LeaseKeeper, b: Built) -> StageResult:
    """Capture, stamp, and leave the upload to the agent ("env-publish"), which takes the lease on.

    The capture is moved out of the evictable cache until the agent has uploaded it. The keeper goes
    on renewing until just before the agent starts (`before_agent`), so the lease never lapses between
    the two holders; the other nodes keep waiting on it until the agent writes the ref and releases it."""
    from . import publish as snap

    key, roots, note, setup_s = b.key, b.roots, b.note, b.setup_s
    snap.sweep_pending(ctx.cache, _lease_ttl(ctx))
    cap = _capture(ctx, b)
    if isinstance(cap, StageResult):
        return cap
    cap = snap.pin_pending(ctx.cache, cap)
    b.stamp(ctx, cap, _keys_now(ctx, key))
    from dataclasses import replace

    from ..envmount.image import missing_builder
    from .agent_tasks import PublishTask

    # Mount mode: the image of a capture that is the whole tree is packed from the pending blob by the
    # agent, behind the launcher, before it writes the ref (the job never waits for mksquashfs). An image
    # that reads the tree (a setup that only added to it, a layer over a parent without an image) is
    # packed here, before the job can change the tree; a layer's own image is small, and packed here
    # too. Without mksquashfs the warning is the start's own (`_image_extra`), not the agent log's.
    image_later = ctx.settings.env.mode == "mount" and cap.whole and not missing_builder()
    lease = keeper.lease
    task = PublishTask(
        env_key=key,
        roots=list(roots),
        upload=snap.Upload.of(cap).as_task(),
        lease_key=lease.key,
        lease_owner=lease.owner,
        lease_expires=lease.expires,
        lease_ttl_s=keeper.ttl_s,
        ref_extra={**b.ref_extra(ctx), **({} if image_later else _image_extra(ctx, b, cap))},
        image_from_blob=image_later,
    )

    def stop_renewing() -> None:
        keeper.stop_renewing()
        # agent.json is written after this hook: the agent gets the lease as it was last renewed
        i = next(i for i, t in enumerate(ctx.agent_tasks) if t is task)
        ctx.agent_tasks[i] = replace(task, lease_expires=lease.expires)

    keeper.hand_over()
    ctx.before_agent.append(stop_renewing)
    ctx.add_agent_task(task)
    _squash_when_due(ctx, b, cap, agent=True)
    summary = f"{b.what(setup_s)}, captured {count(cap.files, 'file')} ({fmt_bytes(cap.size)} compressed)"
    summary += "; the agent uploads it"
    return StageResult(
        outcome="built",
        summary=summary + (f", {note}" if note else ""),
        cache="miss",
        bytes=cap.size,
        reason=note,
        extra={"files": cap.files, "setup_s": round(setup_s, 3), "upload": "agent"},
    )


def _capture_and_publish(ctx: StageContext, store: Store, b: Built) -> StageResult:
    """After the lease holder's setup: capture and publish, stamping the tree whatever happens."""
    from .publish import publish

    key, roots, note, setup_s = b.key, b.roots, b.note, b.setup_s
    cap = _capture(ctx, b)
    if isinstance(cap, StageResult):
        return cap
    try:
        extra = {**b.ref_extra(ctx), **_image_extra(ctx, b, cap)}
        publish(ctx.settings.p2p, store, ctx.cache, cap, key, roots, extra=extra)
    except BootseerError as e:
        ctx.warn(f"env: setup done and captured, but not published: {e}")
        cap.blob.unlink(missing_ok=True)
        b.stamp(ctx, cap)
        return StageResult("setup", summary=f"{b.what(setup_s)} (not published)", cache="miss", reason=str(e))
    b.stamp(ctx, cap, _keys_now(ctx, key))
    _squash_when_due(ctx, b, cap, agent=False)
    summary = f"{b.what(setup_s)}, published {count(cap.files, 'file')} ({fmt_bytes(cap.size)} compressed)"
    return StageResult(
        outcome="built",
        summary=summary + (f", {note}" if note else ""),
        cache="miss",
        bytes=cap.size,
        reason=note,
        extra={"files": cap.files, "setup_s": round(setup_s, 3)},
    )


def _image_extra(ctx: StageContext, b: Built, cap: Captured) -> dict[str, Any]:
    """`[env] mode = "mount"`: the ref's `fs_image` field, the image built now from the set-up roots
    (envmount/image.py; packed from the capture's blob when that is the whole tree; a layer over a
    parent with an image gets an image of its own changes, stacked over the parent's); {} in extract
    mode or when it cannot be built (warned: the snapshot is extracted)."""
    if ctx.settings.env.mode != "mount":
        return {}
    from ..envmount.image import image_for_publish
    from .setup import excluded_paths

    layer = None
    if b.over is not None and not cap.whole:  # a layer's own image over the parent's, when it has one
        from ..envmount.image import LayerSource, below_of

        below = below_of(b.over.choice.ref)
        if below is not None:
            layer = LayerSource(cap.blob, list(cap.deletion_paths), below)
    whole = cap.blob if cap.whole else None
    return image_for_publish(b.roots, excluded_paths(ctx.settings.store), ctx.cache, ctx.warn, whole, layer)


def _keys_now(ctx: StageContext, key: str) -> list[str]:
    """The env key, plus the key as computed now: when the setup installs into the base prefix, the
    image fingerprint (and so the key) changes with it, and a restart of this node must still match."""
    from ..identity import keys_for

    try:
        # computed afresh: the cached ctx.keys holds the key from before the setup
        return [key, keys_for(ctx.settings).env.digest]
    except (BootseerError, OSError):
        return [key]


def _stamp_after_setup(
    ctx: StageContext, tree: EnvTree, key: str, baseline: Manifest, over: Over | None = None
) -> None:
    """Stamp a tree set up without a snapshot (what changed since the baseline is the env, over the
    parent's paths when the setup ran over a parent)."""
    from .manifest import diff, scan
    from .setup import excluded_paths
    from .stamp import entries_of, write_stamp

    after = scan(tree.roots, excluded_paths(ctx.settings.store))
    d = diff(baseline, after)
    entries = entries_of(after, d.changed, baseline)
    merged = over.merged(entries, d.deleted) if over is not None else None
    write_stamp(tree, [key], None, entries, d.deleted, carried=merged)


def _squash_when_due(ctx: StageContext, b: Built, cap: Captured, agent: bool) -> None:
    """A layer at `[env] max_layers`: squash the chain into one full snapshot under the same key, by
    the agent after the upload ("env-squash"), or here after the publish when there is no agent."""
    if b.over is None or b.over.depth < ctx.settings.env.max_layers:
        return
    from .squash import SquashTask, squash

    task = SquashTask(env_key=b.key, roots=list(b.roots), layer=cap.digest, ref_extra=b.ref_extra(ctx))
    if agent:
        ctx.add_agent_task(task)
        return
    try:
        squash(ctx.settings, ctx.store, ctx.cache, task, ctx.info, held=True)
    except (BootseerError, OSError) as e:
        ctx.warn(f"env: chain of {b.key[:12]} not squashed: {e}")


def _local_setup(ctx: StageContext, tree: EnvTree, key: str, reason: str) -> StageResult:
    """The slow path without the store: run the setup here and stamp the tree."""
    from .setup import fresh_setup

    run = fresh_setup(ctx.settings.env, ctx.settings.store, tree, ctx.info, warn=ctx.warn)
    _stamp_after_setup(ctx, tree, key, run.baseline)
    return StageResult(
        outcome="setup", summary=f"setup {time.time() - run.started:.1f} s ({reason})", cache="miss", reason=reason
    )
