"""The report of one job: per-stage figures (percentiles, hits, straggler and its cost) and the
records the renderers draw (`JobReport`, its node rows and their segments)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from ..capabilities import labels, stage_names
from .starts import (
    FAILED_OUTCOMES,
    FIRST_STEP_STAGE,
    LAUNCHER_STAGES,
    READY_STAGE,
    TOTAL_STAGE,
    NodeStart,
    Span,
    cache_class,
    percentile,
)

STAGE_LABELS = {
    **labels(),
    TOTAL_STAGE: "bootseer (exec total)",
    READY_STAGE: "launcher → ready()",
    FIRST_STEP_STAGE: "launcher → first step",
}


@dataclass
class StageStats:
    stage: str
    label: str
    nodes: int
    p50_s: float
    p90_s: float
    max_s: float
    mean_s: float
    hits: int
    misses: int
    failed: int
    bytes: int
    bytes_from_store: int
    bytes_from_peers: int
    straggler: str
    straggler_cost_s: float
    straggler_cache: str  # "hit", "miss", "failed" or "": what the stage did on the straggler
    reasons: list[str]
    behind: bool = False  # ran behind the launcher (an agent task), so it did not delay the start


def stage_order(names: set[str]) -> list[str]:
    order = stage_names()
    known = [s for s in order if s in names]
    others = sorted(names - set(order) - {TOTAL_STAGE, *LAUNCHER_STAGES})
    tail = [s for s in (TOTAL_STAGE, FIRST_STEP_STAGE, READY_STAGE) if s in names]
    return known + others + tail


def _cost_if_shortened(starts: list[NodeStart], node: str, by: float) -> float:
    """How much earlier the job would be ready if `node` had been ready `by` seconds sooner."""
    if by <= 0:
        return 0.0
    done_all = max(s.done for s in starts)
    others = max((s.done for s in starts if s.node != node), default=-math.inf)
    mine = next(s.done for s in starts if s.node == node)
    return max(0.0, done_all - max(others, mine - by))


def stage_stats(starts: list[NodeStart]) -> list[StageStats]:
    names = {name for s in starts for name in s.spans}
    out = []
    for name in stage_order(names):
        rows = [(s, s.spans[name]) for s in starts if name in s.spans]
        durations = [span.duration for _, span in rows]
        p50 = percentile(durations, 50)
        slow_start, slow_span = max(rows, key=lambda r: (r[1].duration, r[0].node))
        hits = misses = failed = 0
        reasons: dict[str, int] = defaultdict(int)
        for s, _ in rows:
            for e in s.events:
                if e["stage"] != name:
                    continue
                cls = cache_class(e)
                hits += cls == "hit"
                misses += cls == "miss"
                if str(e.get("outcome") or "") in FAILED_OUTCOMES:
                    failed += 1
                    reasons[str(e.get("reason") or "?")] += 1
        behind = name not in (*LAUNCHER_STAGES, TOTAL_STAGE) and _mostly_after_exec(rows)
        out.append(
            StageStats(
                stage=name,
                label=STAGE_LABELS.get(name, name) + (" (behind the launcher)" if behind else ""),
                nodes=len(rows),
                p50_s=p50,
                p90_s=percentile(durations, 90),
                max_s=max(durations),
                mean_s=sum(durations) / len(durations),
                hits=hits,
                misses=misses,
                failed=failed,
                bytes=sum(span.bytes for _, span in rows),
                bytes_from_store=sum(span.bytes_from_store for _, span in rows),
                bytes_from_peers=sum(span.bytes_from_peers for _, span in rows),
                straggler=slow_start.node,
                straggler_cost_s=_cost_if_shortened(starts, slow_start.node, slow_span.duration - p50),
                straggler_cache="failed"
                if slow_span.outcome in FAILED_OUTCOMES
                else cache_class({"cache": slow_span.cache, "outcome": slow_span.outcome}) or "",
                reasons=[r for r, _ in sorted(reasons.items(), key=lambda kv: -kv[1])][:3],
                behind=behind,
            )
        )
    return out


def _mostly_after_exec(rows: list[tuple[NodeStart, Span]]) -> bool:
    """True when, on most nodes, the stage ended after exec handed over to the launcher."""
    after = sum(1 for s, span in rows if s.exec_at is not None and span.end > s.exec_at + 0.01)
    return after * 2 > len(rows)


@dataclass
class Segment:
    stage: str
    start: float  # seconds after the job's first start
    end: float
    outcome: str
    cache: str = ""  # "hit", "miss" or ""


@dataclass
class NodeRow:
    node: str
    rank: int
    run: str
    attempt: int
    start: float
    ready: float  # seconds after the job's first start
    startup_s: float
    wait_s: float  # how long this node then waited for the slowest one
    segments: list[Segment]
    ready_called: bool
    first_step: bool = False  # ready came from the detected first optimizer step (no ready() call)


@dataclass
class AttemptSummary:
    attempt: int
    nodes: int
    started: float
    startup_s: float


@dataclass
class JobReport:
    job: str
    nodes: int
    attempt: int | None  # None: the latest start of each node
    attempts: list[AttemptSummary]
    started: float
    startup_s: float
    slowest_node: str
    median_ready_s: float
    straggler_wait_s: float
    ready_called: int  # nodes whose script called bootseer_cli.ready()
    gpus_per_node: int
    gpus_source: str
    gpu_hours_wasted: float
    stages: list[StageStats]
    rows: list[NodeRow]
    verdict: str
    first_step_detected: int = 0  # nodes ready at their first optimizer step (no ready() call)
    # The store the events (and so the job's snapshots) came from is remote (not file://): only then
    # can peers take load off it, so only then does the advice name [p2p].
    store_remote: bool = False
    # `[env] mode = "mount"` (issue 48): the nodes whose env stage mounted the image rather than extract
    # it, how, and the median of their mount time (the fetch of an image not yet local is apart)
    env_mounted: int = 0
    env_mount_how: str = ""
    env_mount_p50_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def node_rows(starts: list[NodeStart], t0: float, done_all: float) -> list[NodeRow]:
    rows = []
    for s in starts:
        segs = [
            Segment(
                stage=name,
                start=span.start - t0,
                end=span.end - t0,
                outcome=span.outcome,
                cache=cache_class({"cache": span.cache, "outcome": span.outcome}) or "",
            )
            for name, span in s.spans.items()
        ]
        rows.append(
            NodeRow(
                node=s.node,
                rank=s.rank,
                run=s.run,
                attempt=s.attempt,
                start=s.start - t0,
                ready=s.done - t0,
                startup_s=s.startup,
                wait_s=done_all - s.done,
                segments=segs,
                ready_called=s.ready_at is not None,
                first_step=s.ready_at is None and s.first_step_at is not None,
            )
        )
    return rows
