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
from typing import Any

from ..errors import IntegrityError
from ..launch import LaunchContext, StageResult
from .pagecache import FileInfo, evict, untrusted_files, walk_files
from .ready import parse_mode
from .roots import resolve_roots

# A record whose fresh part is less than half of its bytes describes another image: take it again.
STALE_RERECORD = 0.5
REMAINING_FILE = "hot-remaining.json"


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 10e6 else f"{n / 1e6:.1f} MB"


def refusal(files: list[FileInfo], untrusted: list[FileInfo]) -> str:
    """The one-line reason an unprivileged record is refused (what mincore would do, and the fixes)."""
    return (
        f"not recording hot blocks as uid {os.geteuid()}: for files one neither owns nor may write, the kernel's "
        f"mincore reports every page resident ({len(untrusted)} of {len(files)} files under the roots, e.g. "
        f"{untrusted[0].path}); run as root, or set [image] roots to directories this user owns"
    )


def prepare_recording(roots: list[str]) -> tuple[list[FileInfo], str | None]:
    """Walk the roots and check the privilege; returns (files, refusal or None)."""
    files = list(walk_files(roots))
    bad = untrusted_files(files)
    return files, (refusal(files, bad) if bad else None)


def run_stage(ctx: LaunchContext) -> StageResult:
    from .record import load

    cfg = ctx.cfg
    mode = cfg.get("image", "record")
    ready = parse_mode(cfg.get("image", "ready"))
    image_key = ctx.keys.image.digest
    roots = resolve_roots(cfg)
    why_record = "no record"
    try:
        found = load(cfg, ctx.store, image_key)
    except IntegrityError as e:  # a corrupt record is replaced by a new one
        ctx.warn(f"image: the hot-block record is unusable ({e}); taking a new one")
        found, why_record = None, "record unusable"
    except Exception as e:  # unreachable store: start without replay (and without a record to publish)
        ctx.warn(f"image: cannot read the hot-block record ({e}); starting without replay")
        return StageResult(outcome="fallback", summary="no replay (store)", cache="miss", reason=str(e))
    if found is not None and mode != "always":
        rec, doc = found
        result = _replay(ctx, rec, doc)
        if result is not None:
            return result
        why_record = "record mostly stale"
    elif mode == "always":
        why_record = '[image] record = "always"'
    if mode == "never":
        return StageResult(outcome="skipped", summary="no record", cache="miss", reason="no record; record = never")
    return _arrange_recording(ctx, image_key, roots, ready, why_record)


def _replay(ctx: LaunchContext, rec: Any, doc: dict[str, Any]) -> StageResult | None:
    """Replay in the foreground up to the deadline; None when the record is too stale to use."""
    from .replay import plan, run

    cfg = ctx.cfg
    t0 = time.monotonic()
    work, staleness = plan(rec)
    if staleness.stale_share > STALE_RERECORD and cfg.get("image", "record") != "never":
        ctx.warn(
            f"image: the hot-block record is mostly stale ({len(staleness.stale_files)} of {len(rec.files)} files "
            f"changed, {staleness.stale_share:.0%} of its bytes); taking a new one"
        )
        return None
    threads = int(cfg.get("image", "prefetch_threads"))
    mbps = float(cfg.get("image", "prefetch_mbps"))
    res = run(work, threads=threads, mbps=mbps, deadline=t0 + float(cfg.get("image", "foreground_s")))
    res.staleness = staleness
    parts = [f"replayed {_mb(res.bytes_read)}"]
    if res.remaining:
        if cfg.get("exec", "agent"):
            path = ctx.run.run_dir / REMAINING_FILE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(res.remaining))
            os.replace(tmp, path)
            ctx.add_agent_task("hot-prefetch", file=str(path), threads=threads, mbps=mbps)
            parts.append(f"{_mb(sum(n for _, _, n in res.remaining))} to the agent")
        else:
            parts.append(f"{_mb(sum(n for _, _, n in res.remaining))} left unread (no agent)")
    if staleness.stale_files:
        parts.append(f"{len(staleness.stale_files)} stale file(s) skipped")
    return StageResult(
        outcome="hit",
        summary=", ".join(parts),
        cache="hit",
        bytes=res.bytes_read,
        bytes_from_store=int(doc.get("_bytes_from_store", 0)),
        extra={
            "stale_files": len(staleness.stale_files),
            "stale_bytes": staleness.stale_bytes,
            "remaining_bytes": sum(n for _, _, n in res.remaining),
            "record": doc.get("blob", ""),
        },
    )


def _arrange_recording(
    ctx: LaunchContext, image_key: str, roots: list[str], ready: str | float, why: str
) -> StageResult:
    if not ctx.cfg.get("exec", "agent"):
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
