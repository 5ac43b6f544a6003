"""From stage events to the figures of a report: per-stage percentiles, stragglers, GPU time, verdict, trends.

Definitions (the tests recompute each of them from the raw events):

- A node's *start* is one `(node, run)`: one `bootseer exec` on one node. A job report shows the
  latest start of each node unless asked for another. The job's own starts (restarts) are found by
  clustering the runs by start time: a new one begins after `START_GAP_S` seconds in which no node
  started, or when a node starts a second time; `--start K` shows the K-th.
- A node's *start time* is the start of its `bootseer` event (the first thing exec records; the
  earliest event when that is missing). It is *ready* at the latest end of its `ready` events (one
  per local rank; `bootseer_cli.ready()`), or, when the script never calls it, when exec handed over
  to the launcher (the end of the `bootseer` event).
- The job starts when its slowest node is ready: *startup* = max(ready) − min(start).
- *GPU time wasted* = nodes × GPUs per node × startup: every allocated GPU idles from the job's
  first start to the slowest node's ready.
- Percentiles are linear interpolations between order statistics (numpy's default, and
  `statistics.quantiles(method="inclusive")`).
- A stage's *straggler* is the node where it took longest; what it *cost the job* is how much
  earlier the job would have started had that node's stage taken the stage's median instead.
- *Hits/misses* come from the `cache` column ("hit…"/"miss…"), else from the outcome
  (hit/restored vs miss/built). *Bytes saved* are the bytes delivered on hits that did not come
  from the store (node cache or peers).
- The *verdict* is the `Finding` whose fix would save the most: a stage slow on every node, a
  stage's straggler, the slow tail as a whole, or bootseer's own overhead. Findings are tagged
  records (`kind`, `stage`, `node`, `seconds`), so the verdict picks among them by tag, never by
  matching the sentences written for people.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..units import fmt_seconds

EXEC_STAGES = ("image", "env", "checkpoint", "compile")
TOTAL_STAGE = "bootseer"
READY_STAGE = "ready"
STAGE_LABELS = {
    "image": "image",
    "env": "env",
    "checkpoint": "checkpoint",
    TOTAL_STAGE: "bootseer (exec total)",
    READY_STAGE: "launcher → ready()",
}
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


def _extra(event: dict[str, Any]) -> dict[str, Any]:
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
    ready_at: float | None
    spans: dict[str, Span]
    events: list[dict[str, Any]] = field(repr=False)
    gpus: int | None = None
    gpus_from: str = ""
    local_ranks: int = 0

    @property
    def done(self) -> float:
        if self.ready_at is not None:
            return self.ready_at
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
        ready = spans.get(READY_STAGE)
        start = total.start if total else min(s.start for s in spans.values())
        gpus, gpus_from = None, ""
        rank = int(evs[0].get("rank") or 0)
        local_ranks: set[str] = set()
        for e in evs:
            x = _extra(e)
            if e["stage"] == TOTAL_STAGE and isinstance(x.get("gpus"), int) and x["gpus"] > 0:
                gpus, gpus_from = int(x["gpus"]), str(x.get("gpus_from") or "launcher")
            if e["stage"] == TOTAL_STAGE and isinstance(x.get("node_rank"), int) and not rank:
                rank = int(x["node_rank"])  # only the launcher's command line said it
            if e["stage"] == READY_STAGE:
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
    attempt, last, seen = 0, -math.inf, set()
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


@dataclass
class GpuCount:
    per_node: int
    source: str


def stage_order(names: set[str]) -> list[str]:
    known = [s for s in EXEC_STAGES if s in names]
    others = sorted(names - set(EXEC_STAGES) - {TOTAL_STAGE, READY_STAGE})
    tail = [s for s in (TOTAL_STAGE, READY_STAGE) if s in names]
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
        behind = name not in (READY_STAGE, TOTAL_STAGE) and _mostly_after_exec(rows)
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
        return GpuCount(ranks, "ready() calls per node")
    return GpuCount(default, "default")


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _rows(starts: list[NodeStart], t0: float, done_all: float) -> list[NodeRow]:
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
            )
        )
    return rows


def analyze_job(
    events: list[dict[str, Any]],
    job: str,
    *,
    gpus_flag: int | None = None,
    gpus_configured: int | None = None,
    attempt: int | None = None,
) -> JobReport:
    """The report of one job from its events."""
    from ..errors import BootseerError

    every = node_starts(events)
    if not every:
        raise BootseerError(f"job {job!r} has no stage events")
    starts = select(every, attempt)
    if not starts:
        last = max(s.attempt for s in every)
        raise BootseerError(f"job {job!r} has no start {attempt} (starts 1..{last})")
    t0 = min(s.start for s in starts)
    done_all = max(s.done for s in starts)
    slowest = max(starts, key=lambda s: (s.done, s.node))
    startup = done_all - t0
    median_ready = percentile([s.done - t0 for s in starts], 50)
    gpus = gpu_count(starts, gpus_flag, gpus_configured)
    stats = stage_stats(starts)
    attempts = []
    for a in sorted({s.attempt for s in every}):
        group = [s for s in every if s.attempt == a]
        first = min(s.start for s in group)
        attempts.append(AttemptSummary(a, len(group), first, max(s.done for s in group) - first))
    report = JobReport(
        job=job,
        nodes=len(starts),
        attempt=attempt,
        attempts=attempts,
        started=t0,
        startup_s=startup,
        slowest_node=slowest.node,
        median_ready_s=median_ready,
        straggler_wait_s=startup - median_ready,
        ready_called=sum(1 for s in starts if s.ready_at is not None),
        gpus_per_node=gpus.per_node,
        gpus_source=gpus.source,
        gpu_hours_wasted=len(starts) * gpus.per_node * startup / 3600.0,
        stages=stats,
        rows=_rows(starts, t0, done_all),
        verdict="",
    )
    report.verdict = verdict(report)
    return report


_ADVICE_MISS = {
    "image": "no hot-block record for this image yet (one is recorded on a first start; call "
    "bootseer_cli.ready() after the first step so it ends at the right moment)",
    "env": "the environment snapshot missed: run `bootseer prewarm` in CI (or `bootseer snapshot` after a "
    "manual setup) so every start restores it",
    "checkpoint": "the checkpoint was not in the striped layout or the node cache: push it with `bootseer ckpt push`",
}
_ADVICE_SLOW = {
    "image": "the hot-block replay is slow: raise [image] prefetch_threads, or look at the image's lazy loading",
    "env": "the snapshot restore is slow: enable [p2p] so nodes fetch it from each other instead of the store",
    "checkpoint": "the checkpoint read is slow: spread it over more stripes/targets ([checkpoint] stripes, targets) "
    "or enable [p2p]",
}


FindingKind = Literal["launcher", "stage", "straggler", "stragglers", "overhead"]


@dataclass(frozen=True)
class Finding:
    """One thing that delayed the job's start, and how much earlier the job would start without it.

    `kind` tags what the finding is about, so the verdict chooses among findings by tag and never by
    reading back its own sentences; `text` is only for people.
    """

    kind: FindingKind
    seconds: float  # what fixing it would save (the verdict's ranking)
    text: str
    stage: str = ""
    node: str = ""


FAST_S = 1.0  # a startup below this is "already fast": nothing to fix, nothing marked in red


def already_fast(r: JobReport) -> bool:
    return r.startup_s < FAST_S


def verdict(r: JobReport) -> str:
    """One line: the single change that would bring the job's start forward the most."""
    if already_fast(r):
        return f"Startup is already fast ({fmt_seconds(r.startup_s)} to the slowest node's ready): nothing to fix."
    found = findings(r)
    if not found:
        return f"{fmt_seconds(r.startup_s)} to the slowest node's ready; no stage events explain it."
    best = max(found, key=lambda f: f.seconds)  # the first of equals, in the order below
    return f"Fix first: {best.text}."


def findings(r: JobReport) -> list[Finding]:
    """Every candidate for the verdict, in a fixed order: per stage (the stage itself, then its
    straggler), then the slow tail as a whole, then bootseer's own overhead."""
    found: list[Finding] = []
    for s in r.stages:
        if s.stage == TOTAL_STAGE or s.behind:
            continue
        found.append(_launcher_finding(r, s) if s.stage == READY_STAGE else _stage_finding(s))
        straggler = _straggler_finding(r, s)
        if straggler is not None:
            found.append(straggler)
    single = max((f.seconds for f in found if f.kind == "straggler"), default=0.0)
    tail = _tail_finding(r, single)
    if tail is not None:
        found.append(tail)
    overhead = _overhead_finding(r)
    if overhead is not None:
        found.append(overhead)
    return found


def _launcher_finding(r: JobReport, s: StageStats) -> Finding:
    """The launcher's own time to ready(): outside bootseer, but often the largest part."""
    return Finding(
        "launcher",
        s.p50_s,
        f"the launcher's own startup (imports, rendezvous, first step) takes {fmt_seconds(s.p50_s)} p50 of the "
        f"job's {fmt_seconds(r.startup_s)}: that is outside bootseer's stages; profile the training script's start",
        stage=s.stage,
    )


def _stage_finding(s: StageStats) -> Finding:
    """A stage slow on every node (its median), with the advice for why: failures, misses, or plain speed."""
    if s.failed:
        why = f" ({s.reasons[0]})" if s.reasons else ""
        advice = f"it failed or fell back on {s.failed} of {s.nodes} nodes{why}: fix that first"
    elif s.misses:
        advice = _ADVICE_MISS.get(s.stage, f"{s.misses} cache misses")
    else:
        advice = _ADVICE_SLOW.get(s.stage, "look at what this stage does on every node")
    return Finding("stage", s.p50_s, f"{s.stage} takes {fmt_seconds(s.p50_s)} p50 on every node: {advice}", s.stage)


def _straggler_finding(r: JobReport, s: StageStats) -> Finding | None:
    """The node where this stage took longest, when bringing it to the median would start the job earlier."""
    if s.straggler_cost_s <= 0 or r.nodes <= 1:
        return None
    if s.straggler_cache == "miss" and s.hits:
        why = f"{s.stage} missed the cache there while {s.hits} hit elsewhere: " + _ADVICE_MISS.get(
            s.stage, "see why its cache key differs (`bootseer keys` on that node)"
        )
    elif s.straggler_cache == "failed":
        why = f"{s.stage} failed there and fell back to the slow path: see that node's warnings"
    else:
        why = "check that node's disk, network and load"
    return Finding(
        "straggler",
        s.straggler_cost_s,
        f"{s.straggler} is the straggler in {s.label} ({fmt_seconds(s.max_s)} vs {fmt_seconds(s.p50_s)} p50), "
        f"which cost the job {fmt_seconds(s.straggler_cost_s)}: {why}",
        stage=s.stage,
        node=s.straggler,
    )


def _tail_finding(r: JobReport, single: float) -> Finding | None:
    """The slow tail as a whole, when no single stage's straggler (saving `single`) explains the wait."""
    if not (r.nodes > 2 and r.straggler_wait_s > 1.0 and r.straggler_wait_s > 1.25 * single):
        return None
    slow = ", ".join(why_slow(r, row) for row in slowest(r))
    return Finding(
        "stragglers",
        r.straggler_wait_s,
        f"stragglers: the median node was ready at {fmt_seconds(r.median_ready_s)} but the job started at "
        f"{fmt_seconds(r.startup_s)}; the slowest: {slow}",
    )


def _overhead_finding(r: JobReport) -> Finding | None:
    """Exec's time outside its stages (the total's median minus the stages' medians), when over a second."""
    by_name = {s.stage: s for s in r.stages}
    total = by_name.get(TOTAL_STAGE)
    if total is None:
        return None
    inside = [n for n, st in by_name.items() if n not in (TOTAL_STAGE, READY_STAGE) and not st.behind]
    own = total.p50_s - sum(by_name[n].p50_s for n in inside)
    if own <= 1.0:
        return None
    return Finding(
        "overhead",
        own,
        f"bootseer's own overhead outside the stages is {fmt_seconds(own)} p50: look at the keys and the store",
        stage=TOTAL_STAGE,
    )


def slowest(r: JobReport, limit: int = 3) -> list[NodeRow]:
    """The nodes in the slow tail: ready later than halfway from the median node to the slowest one."""
    cut = r.median_ready_s + r.straggler_wait_s / 2
    return sorted((row for row in r.rows if row.ready > cut), key=lambda row: -row.ready)[:limit]


def why_slow(r: JobReport, row: NodeRow) -> str:
    """'node-7 (checkpoint 30.0 s vs 5.0 s p50)': the stage where this node lost the most against the median."""
    p50 = {s.stage: s.p50_s for s in r.stages}
    worst, excess, took, note = "", 0.0, 0.0, ""
    for seg in row.segments:
        if seg.stage == TOTAL_STAGE or seg.stage not in p50:
            continue
        d = seg.end - seg.start
        if d - p50[seg.stage] > excess:
            worst, excess, took = seg.stage, d - p50[seg.stage], d
            note = " failed" if seg.outcome in FAILED_OUTCOMES else " miss" if seg.cache == "miss" else ""
    if not worst:
        return row.node
    return f"{row.node} ({STAGE_LABELS.get(worst, worst)}{note} {fmt_seconds(took)} vs {fmt_seconds(p50[worst])} p50)"


# ---- across jobs ---------------------------------------------------------------------------


@dataclass
class StartRow:
    """One start of one job (the k-th cluster of its nodes' runs)."""

    job: str
    attempt: int
    started: float
    nodes: int
    startup_s: float
    hits: int
    misses: int
    bytes_from_store: int
    bytes_from_peers: int
    bytes_saved: int
    gpu_hours_wasted: float


@dataclass
class TrendReport:
    since_s: float
    jobs: int
    starts: int
    node_starts: int
    mean_startup_s: float
    median_startup_s: float
    hit_rate: float | None
    hits: int
    misses: int
    bytes_from_store: int
    bytes_from_peers: int
    bytes_saved: int
    gpu_hours_wasted: float
    first_half_mean_s: float
    second_half_mean_s: float
    trend: str
    rows: list[StartRow]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def analyze_trend(
    events: list[dict[str, Any]], since_s: float, gpus_flag: int | None = None, gpus_configured: int | None = None
) -> TrendReport:
    """Startup per start across the jobs in `events`, oldest first, and whether it is getting better."""
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_job[str(e.get("job") or "")].append(e)
    rows: list[StartRow] = []
    node_count = 0
    for job, evs in by_job.items():
        every = node_starts(evs)
        node_count += len(every)
        rows += _start_rows(job, every, gpus_flag, gpus_configured)
    rows.sort(key=lambda r: (r.started, r.job, r.attempt))
    durations = [r.startup_s for r in rows]
    half = len(rows) // 2
    first = sum(durations[:half]) / half if half else 0.0
    second = sum(durations[half:]) / (len(rows) - half) if rows else 0.0
    hits = sum(r.hits for r in rows)
    misses = sum(r.misses for r in rows)
    return TrendReport(
        since_s=since_s,
        jobs=len(by_job),
        starts=len(rows),
        node_starts=node_count,
        mean_startup_s=sum(durations) / len(durations) if durations else 0.0,
        median_startup_s=percentile(durations, 50),
        hit_rate=hits / (hits + misses) if hits + misses else None,
        hits=hits,
        misses=misses,
        bytes_from_store=sum(r.bytes_from_store for r in rows),
        bytes_from_peers=sum(r.bytes_from_peers for r in rows),
        bytes_saved=sum(r.bytes_saved for r in rows),
        gpu_hours_wasted=sum(r.gpu_hours_wasted for r in rows),
        first_half_mean_s=first,
        second_half_mean_s=second,
        trend=_trend_word(first, second, len(rows)),
        rows=rows,
    )


def _start_rows(job: str, every: list[NodeStart], gpus_flag: int | None, gpus_configured: int | None) -> list[StartRow]:
    """One row per job-wide start of `job`, each with its own GPU count (a restart may use fewer)."""
    rows = []
    for a in sorted({s.attempt for s in every}):
        group = [s for s in every if s.attempt == a]
        first = min(s.start for s in group)
        startup = max(s.done for s in group) - first
        gpus = gpu_count(group, gpus_flag, gpus_configured).per_node
        hits, misses, saved = _cache_tally(group)
        rows.append(
            StartRow(
                job=job,
                attempt=a,
                started=first,
                nodes=len(group),
                startup_s=startup,
                hits=hits,
                misses=misses,
                bytes_from_store=sum(sp.bytes_from_store for s in group for sp in s.spans.values()),
                bytes_from_peers=sum(sp.bytes_from_peers for s in group for sp in s.spans.values()),
                bytes_saved=saved,
                gpu_hours_wasted=len(group) * gpus * startup / 3600.0,
            )
        )
    return rows


def _cache_tally(group: list[NodeStart]) -> tuple[int, int, int]:
    """(hits, misses, bytes saved) over the events of one start: saved = bytes a hit did not read from the store."""
    hits = misses = saved = 0
    for s in group:
        for e in s.events:
            cls = cache_class(e)
            hits += cls == "hit"
            misses += cls == "miss"
            if cls == "hit":
                saved += max(0, int(e.get("bytes") or 0) - int(e.get("bytes_from_store") or 0))
    return hits, misses, saved


def _trend_word(first: float, second: float, n: int) -> str:
    if n < 2 or first <= 0:
        return "not enough starts for a trend"
    change = (second - first) / first
    if abs(change) < 0.1:
        return f"steady ({fmt_seconds(first)} → {fmt_seconds(second)} per start)"
    word = "better" if change < 0 else "worse"
    return f"{word}: {fmt_seconds(first)} → {fmt_seconds(second)} per start ({change:+.0%}), older half vs newer half"
