"""The image stage of `bootseer exec`: replay the hot-block record, or arrange for the agent to take one.

With a record for `image_key`: check it against the files (stale ones are skipped), replay it with
a bounded pool for at most `[image] foreground_s`, and hand whatever is left to the agent, which
reads it behind the program. A record that is mostly stale is taken again instead.

Without one (and `record` is not "never"): make sure this process can see the truth with `mincore`
(root, or owner of the files), evict the roots' pages, and give the agent a "hot-record" task; it
scans when the start is over (`[image] ready`) and publishes. Everything that goes wrong here is a
warning: the job starts anyway, only slower.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, StoreError
from ..stage import StageContext, StageResult
from ..units import fmt_bytes
from .pagecache import evict
from .ready import parse_mode
from .roots import prepare_recording, resolve_roots

if TYPE_CHECKING:
    from .record import Record
    from .replay import Extent, ReplayResult

# A record whose fresh part is less than half of its bytes describes another image: take it again.
STALE_RERECORD = 0.5
REMAINING_FILE = "hot-remaining.json"


def run_stage(ctx: StageContext) -> StageResult:
    """Replay the record of this image when there is a usable one, else arrange for a new one."""
    from ..gc import touch_used
    from .record import load

    image = ctx.settings.image
    mode = image.record
    ready = parse_mode(image.ready)
    image_key = ctx.keys.image.digest
    roots = resolve_roots(image)
    why_record = "no record"
    try:
        found = load(ctx.settings.p2p, ctx.store, ctx.cache, image_key)
    except IntegrityError as e:  # a corrupt record is replaced by a new one
        ctx.warn(f"image: the hot-block record is unusable ({e}); taking a new one")
        found, why_record = None, "record unusable"
    except (StoreError, OSError) as e:  # unreachable store: start without replay (and without a record to publish)
        ctx.warn(f"image: cannot read the hot-block record ({e}); starting without replay")
        return StageResult(outcome="fallback", summary="no replay (store)", cache="miss", reason=str(e))
    if found is not None and mode != "always":
        rec, doc = found
        touch_used(ctx.store, "hot", image_key, doc)  # at most once a day: `bootseer gc` keeps what jobs use
        result = _replay(ctx, rec, doc)
        if result is not None:
            return result
        why_record = "record mostly stale"
    elif mode == "always":
        why_record = '[image] record = "always"'
    if mode == "never":
        return StageResult(outcome="skipped", summary="no record", cache="miss", reason="no record; record = never")
    return _arrange_recording(ctx, image_key, roots, ready, why_record)


def _replay(ctx: StageContext, rec: Record, doc: dict[str, Any]) -> StageResult | None:
    """Replay in the foreground up to the deadline; None when the record is too stale to use."""
    from .replay import plan, run

    image = ctx.settings.image
    t0 = time.monotonic()
    work, staleness = plan(rec)
    if staleness.stale_share > STALE_RERECORD and image.record != "never":
        ctx.warn(
            f"image: the hot-block record is mostly stale ({len(staleness.stale_files)} of {len(rec.files)} files "
            f"changed, {staleness.stale_share:.0%} of its bytes); taking a new one"
        )
        return None
    res = run(work, threads=image.prefetch_threads, mbps=image.prefetch_mbps, deadline=t0 + image.foreground_s)
    res.staleness = staleness
    parts = [f"replayed {fmt_bytes(res.bytes_read)}"]
    if res.remaining:
        parts.append(_hand_on_remaining(ctx, res.remaining))
    if staleness.stale_files:
        parts.append(f"{len(staleness.stale_files)} stale file(s) skipped")
    return _replayed_result(res, doc, ", ".join(parts))


def _hand_on_remaining(ctx: StageContext, remaining: list[Extent]) -> str:
    """Give what the deadline cut short to the agent (a "hot-prefetch" task); returns the summary part."""
    left = fmt_bytes(sum(n for _, _, n in remaining))
    if not ctx.settings.exec.agent:
        return f"{left} left unread (no agent)"
    path = ctx.run.run_dir / REMAINING_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(remaining))
    os.replace(tmp, path)
    image = ctx.settings.image
    ctx.add_agent_task("hot-prefetch", file=str(path), threads=image.prefetch_threads, mbps=image.prefetch_mbps)
    return f"{left} to the agent"


def _replayed_result(res: ReplayResult, doc: dict[str, Any], summary: str) -> StageResult:
    """The stage's result for a replay: bytes read, where the record came from, what was stale or left."""
    return StageResult(
        outcome="hit",
        summary=summary,
        cache="hit",
        bytes=res.bytes_read,
        bytes_from_store=int(doc.get("_bytes_from_store", 0)),
        extra={
            "stale_files": len(res.staleness.stale_files),
            "stale_bytes": res.staleness.stale_bytes,
            "remaining_bytes": sum(n for _, _, n in res.remaining),
            "record": doc.get("blob", ""),
        },
    )


def _arrange_recording(
    ctx: StageContext, image_key: str, roots: list[str], ready: str | float, why: str
) -> StageResult:
    """Evict the roots and give the agent a "hot-record" task, when there is an agent and mincore tells the truth."""
    if not ctx.settings.exec.agent:
        ctx.warn("image: recording hot blocks needs the agent ([exec] agent = true); not recording")
        return StageResult(outcome="skipped", summary="not recorded (no agent)", cache="miss", reason="no agent")
    files, refused = prepare_recording(roots)
    if refused:
        ctx.warn(f"image: {refused}")
        return StageResult(outcome="skipped", summary="not recorded (privilege)", cache="miss", reason=refused)
    evict(files)
    ctx.add_agent_task("hot-record", image_key=image_key, roots=roots, ready=ready, started=time.time())
    return StageResult(
        outcome="miss",
        summary=f"recording this start ({why})",
        cache="miss",
        reason=why,
        extra={"files": len(files), "roots": roots},
    )
