"""What delayed a job's start: tagged findings, the verdict chosen among them, the slow tail's nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..capabilities import advice, stages
from ..units import fmt_seconds
from .job import STAGE_LABELS, JobReport, NodeRow, StageStats
from .starts import FAILED_OUTCOMES, FIRST_STEP_STAGE, LAUNCHER_STAGES, TOTAL_STAGE, count

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
        found.append(_launcher_finding(r, s) if s.stage in LAUNCHER_STAGES else _stage_finding(r, s))
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
    """The launcher's own time to ready() or to its first optimizer step: outside bootseer's stages, but
    often the largest part (imports, torch.compile, data loading); the compile stage caches one of them."""
    what = "imports, rendezvous, first step"
    if s.stage == FIRST_STEP_STAGE:
        what = "imports, compile, data loading, rendezvous, the step itself"
    ran = {st.stage for st in r.stages}
    absent = [c.advice.absent for c in stages() if c.advice.absent and c.name not in ran]
    hint = "; ".join(["profile the training script's start", *absent])
    return Finding(
        "launcher",
        s.p50_s,
        f"the launcher's own startup ({what}) takes {fmt_seconds(s.p50_s)} p50 of the job's "
        f"{fmt_seconds(r.startup_s)}: that is outside bootseer's stages; {hint}",
        stage=s.stage,
    )


def p2p_fits(r: JobReport, s: StageStats) -> bool:
    """Whether [p2p] could speed this stage up: more than one node reads the same bytes from a remote
    store, and none came from peers yet (P2P is off). One node, or a local store, has no one to share with."""
    return r.nodes > 1 and r.store_remote and s.bytes_from_peers == 0


def _stage_finding(r: JobReport, s: StageStats) -> Finding:
    """A stage slow on every node (its median), with the advice for why: failures, misses, or plain speed."""
    if s.failed:
        why = f" ({s.reasons[0]})" if s.reasons else ""
        words = f"it failed or fell back on {s.failed} of {count(s.nodes, 'node')}{why}: fix that first"
    elif s.misses:
        words = advice(s.stage).miss or f"{s.misses} cache misses"
    else:
        said = advice(s.stage)
        slow = said.slow_p2p if said.slow_p2p and p2p_fits(r, s) else said.slow
        words = slow or "look at what this stage does on every node"
    return Finding("stage", s.p50_s, f"{s.stage} takes {fmt_seconds(s.p50_s)} p50 on every node: {words}", s.stage)


def _straggler_finding(r: JobReport, s: StageStats) -> Finding | None:
    """The node where this stage took longest, when bringing it to the median would start the job earlier."""
    if s.straggler_cost_s <= 0 or r.nodes <= 1:
        return None
    if s.straggler_cache == "miss" and s.hits:
        why = f"{s.stage} missed the cache there while {s.hits} hit elsewhere: " + (
            advice(s.stage).miss or "see why its cache key differs (`bootseer keys` on that node)"
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
    inside = [n for n, st in by_name.items() if n not in (TOTAL_STAGE, *LAUNCHER_STAGES) and not st.behind]
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
