"""Stage events to node starts: one `(node, run)` per exec on a node, its stages merged into spans,
numbered with the job-wide start (restart) it belongs to. The definitions are in `analysis`."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

TOTAL_STAGE = "bootseer"
READY_STAGE = "ready"
FIRST_STEP_STAGE = "first_step"  # the first optimizer step, detected in the launcher's processes (firststep)
LAUNCHER_STAGES = (READY_STAGE, FIRST_STEP_STAGE)  # after exec's hand-over: the launcher's own startup
HIT_OUTCOMES = ("hit", "restored")
MISS_OUTCOMES = ("miss", "built")
FAILED_OUTCOMES = ("failed", "fallback")
START_GAP_S = 60.0  # nodes of one start are launched together; a restart comes after a longer quiet time


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (q in 0..100)."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def count(n: int, word: str) -> str:
    """`1 node`, `3 nodes`: a count with its noun, singular for one."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def cache_class(event: dict[str, Any]) -> str | None:
    """'hit', 'miss' or None (the event says nothing about a cache)."""
    cache = str(event.get("cache") or "").lower()
    if cache:
        if cache.startswith("hit"):
            return "hit"
        if cache.startswith("miss"):
            return "miss"
        return None
    outcome = str(event.get("outcome") or "").lower()
    if outcome in HIT_OUTCOMES:
        return "hit"
    if outcome in MISS_OUTCOMES:
        return "miss"
    return None


def event_extra(event: dict[str, Any]) -> dict[str, Any]:
    """An event's `extra` (a JSON object written by the stage), {} when it has none or a bad one."""
    try:
        value = json.loads(event.get("extra") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class Span:
    """One stage on one node (several events of one stage in one run are merged)."""

    stage: str
    start: float
    end: float
    outcome: str
    cache: str = ""
    bytes: int = 0
    bytes_from_store: int = 0
    bytes_from_peers: int = 0
    reason: str = ""
    count: int = 1

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class NodeStart:
    """One `(node, run)`: one exec on one node."""

    node: str
    run: str
    rank: int
    attempt: int
    start: float
    exec_at: float | None
    ready_at: float | None  # the latest ready() of the node's ranks: the explicit signal
    first_step_at: float | None  # the latest first optimizer step of its ranks (no code change)
    spans: dict[str, Span]
    events: list[dict[str, Any]] = field(repr=False)
    gpus: int | None = None
    gpus_from: str = ""
    local_ranks: int = 0

    @property
    def done(self) -> float:
        """When the node was ready: ready() where the program says it, else its first optimizer step, else
        exec's hand-over (a program that is no torch trainer), else its last event."""
        if self.ready_at is not None:
            return self.ready_at
        if self.first_step_at is not None:
            return self.first_step_at
        if self.exec_at is not None:
            return self.exec_at
        return max((s.end for s in self.spans.values()), default=self.start)

    @property
    def startup(self) -> float:
        return max(0.0, self.done - self.start)


def _merge(spans: dict[str, Span], event: dict[str, Any]) -> None:
    stage = str(event["stage"])
    start, end = float(event["start"] or 0.0), float(event["end"] or 0.0)
    cur = spans.get(stage)
    if cur is None:
        spans[stage] = Span(
            stage=stage,
            start=start,
            end=max(start, end),
            outcome=str(event.get("outcome") or ""),
            cache=str(event.get("cache") or ""),
            bytes=int(event.get("bytes") or 0),
            bytes_from_store=int(event.get("bytes_from_store") or 0),
            bytes_from_peers=int(event.get("bytes_from_peers") or 0),
            reason=str(event.get("reason") or ""),
        )
        return
    cur.start = min(cur.start, start)
    cur.end = max(cur.end, end)
    cur.bytes += int(event.get("bytes") or 0)
    cur.bytes_from_store += int(event.get("bytes_from_store") or 0)
    cur.bytes_from_peers += int(event.get("bytes_from_peers") or 0)
    cur.count += 1
    if str(event.get("outcome") or "") in FAILED_OUTCOMES:
        cur.outcome = str(event["outcome"])
        cur.reason = cur.reason or str(event.get("reason") or "")


def node_starts(events: list[dict[str, Any]]) -> list[NodeStart]:
    """Every (node, run) in `events` (one job), each numbered with the job-wide start it belongs to."""
    by_run: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("stage") and e.get("node"):
            by_run[(str(e["node"]), str(e.get("run") or ""))].append(e)
    starts: list[NodeStart] = []
    for (node, run), evs in by_run.items():
        spans: dict[str, Span] = {}
        for e in sorted(evs, key=lambda e: float(e["start"] or 0.0)):
            _merge(spans, e)
        total = spans.get(TOTAL_STAGE)
        ready, first_step = spans.get(READY_STAGE), spans.get(FIRST_STEP_STAGE)
        start = total.start if total else min(s.start for s in spans.values())
        gpus, gpus_from = None, ""
        rank = int(evs[0].get("rank") or 0)
        local_ranks: set[str] = set()
        for e in evs:
            x = event_extra(e)
            if e["stage"] == TOTAL_STAGE and isinstance(x.get("gpus"), int) and x["gpus"] > 0:
                gpus, gpus_from = int(x["gpus"]), str(x.get("gpus_from") or "launcher")
            if e["stage"] == TOTAL_STAGE and isinstance(x.get("node_rank"), int) and not rank:
                rank = int(x["node_rank"])  # only the launcher's command line said it
            if e["stage"] in LAUNCHER_STAGES:
                local_ranks.add(str(x.get("local_rank", "0")))
        starts.append(
            NodeStart(
                node=node,
                run=run,
                rank=rank,
                attempt=0,
                start=start,
                exec_at=total.end if total else None,
                ready_at=ready.end if ready else None,
                first_step_at=first_step.end if first_step else None,
                spans=spans,
                events=evs,
                gpus=gpus,
                gpus_from=gpus_from,
                local_ranks=len(local_ranks),
            )
        )
    _number_job_starts(starts)
    return sorted(starts, key=lambda s: (s.attempt, s.rank, s.node))


def _number_job_starts(starts: list[NodeStart]) -> None:
    """Number the job's starts: runs are taken in start order and a new job-wide start begins after
    `START_GAP_S` with no node starting, or when a node starts a second time (a restart)."""
    attempt, last = 0, -math.inf
    seen: set[str] = set()
    for s in sorted(starts, key=lambda s: (s.start, s.node, s.run)):
        if attempt == 0 or s.start - last > START_GAP_S or s.node in seen:
            attempt, seen = attempt + 1, set()
        seen.add(s.node)
        last = s.start
        s.attempt = attempt


def select(starts: list[NodeStart], attempt: int | None = None) -> list[NodeStart]:
    """The latest start of each node, or the nodes of the job's `attempt`-th start."""
    chosen: dict[str, NodeStart] = {}
    for s in starts:
        if attempt is not None:
            if s.attempt == attempt:
                chosen[s.node] = s
        elif s.node not in chosen or s.attempt > chosen[s.node].attempt:
            chosen[s.node] = s
    return sorted(chosen.values(), key=lambda s: (s.rank, s.node))


@dataclass
class GpuCount:
    per_node: int
    source: str


def gpu_count(starts: list[NodeStart], flag: int | None, configured: int | None, default: int = 8) -> GpuCount:
    """GPUs per node: the flag, else [report] gpus_per_node when set, else what the launcher said, else 8."""
    if flag:
        return GpuCount(flag, "--gpus-per-node")
    if configured:
        return GpuCount(configured, "[report] gpus_per_node")
    seen = [(s.gpus, s.gpus_from) for s in starts if s.gpus]
    if seen:
        counts: dict[int, int] = defaultdict(int)
        for g, _ in seen:
            counts[g] += 1
        best = max(counts, key=lambda g: (counts[g], g))
        return GpuCount(best, f"launcher ({next(src for g, src in seen if g == best)})")
    ranks = max((s.local_ranks for s in starts), default=0)
    if ranks > 1:
        return GpuCount(ranks, "ranks signalling ready per node")
    return GpuCount(default, "default")
