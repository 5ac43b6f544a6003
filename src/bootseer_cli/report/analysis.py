"""From stage events to the figures of a report: per-stage percentiles, stragglers, GPU time, verdict, trends.

Definitions (the tests recompute each of them from the raw events):

- A node's *start* is one `(node, run)`: one `bootseer exec` on one node. A job report shows the
  latest start of each node unless asked for another. The job's own starts (restarts) are found by
  clustering the runs by start time: a new one begins after `START_GAP_S` seconds in which no node
  started, or when a node starts a second time; `--start K` shows the K-th.
- A node's *start time* is the start of its `bootseer` event (the first thing exec records; the
  earliest event when that is missing). It is *ready* at the latest end of its `ready` events (one
  per local rank; `bootseer_cli.ready()`, the explicit signal), else at the latest end of its
  `first_step` events (the first optimizer step of each local rank, detected without a code change:
  `firststep`), else, for a program that is no torch trainer, when exec handed over to the launcher
  (the end of the `bootseer` event).
- The job starts when its slowest node is ready: *startup* = max(ready) − min(start).
- *GPU time wasted* = nodes × GPUs per node × startup: every allocated GPU idles from the job's
  first start to the slowest node's ready.
- Percentiles are linear interpolations between order statistics (numpy's default, and
  `statistics.quantiles(method="inclusive")`).
- A stage's *straggler* is the node where it took longest; what it *cost the job* is how much
  earlier the job would have started had that node's stage taken the stage's median instead.
- *Hits/misses* come from the `cache` column ("hit…"/"miss…"), else from the outcome
  (hit/restored vs miss/built). *Bytes saved* are the bytes delivered on hits that did not come
  from the store (node cache or peers); a hot-block replay's local reads are not counted.
- The *verdict* is the `Finding` whose fix would save the most: a stage slow on every node, a
  stage's straggler, the slow tail as a whole, or bootseer's own overhead. Findings are tagged
  records (`kind`, `stage`, `node`, `seconds`), so the verdict picks among them by tag, never by
  matching the sentences written for people.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from ..capabilities import stages
from ..units import fmt_seconds
from .findings import verdict
from .job import AttemptSummary, JobReport, node_rows, stage_stats
from .starts import NodeStart, cache_class, gpu_count, node_starts, percentile, select


def analyze_job(
    events: list[dict[str, Any]],
    job: str,
    *,
    gpus_flag: int | None = None,
    gpus_configured: int | None = None,
    attempt: int | None = None,
    store_uri: str | None = None,
) -> JobReport:
    """The report of one job from its events (`store_uri`: where they were read, for the advice)."""
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
        first_step_detected=sum(1 for s in starts if s.ready_at is None and s.first_step_at is not None),
        gpus_per_node=gpus.per_node,
        gpus_source=gpus.source,
        gpu_hours_wasted=len(starts) * gpus.per_node * startup / 3600.0,
        stages=stats,
        rows=node_rows(starts, t0, done_all),
        verdict="",
        store_remote=is_remote(store_uri),
    )
    report.env_mounted, report.env_mount_how, report.env_mount_p50_s = env_mounts(starts)
    report.verdict = verdict(report)
    return report


def env_mounts(starts: list[NodeStart]) -> tuple[int, str, float]:
    """(nodes whose env was mounted, how they mounted it, the median mount seconds) from the env
    stage's events (envmount/stage.py puts `mode`, `how` and `mount_s` in their extra)."""
    from .starts import event_extra

    hows: list[str] = []
    seconds: list[float] = []
    for s in starts:
        for e in s.events:
            x = event_extra(e) if e.get("stage") == "env" else {}
            if x.get("mode") == "mount":
                hows.append(str(x.get("how") or "?"))
                seconds.append(float(x["mount_s"]) if isinstance(x.get("mount_s"), int | float) else 0.0)
                break
    how = ", ".join(sorted(set(hows)))
    return len(hows), how, percentile(seconds, 50) if seconds else 0.0


def is_remote(uri: str | None) -> bool:
    """A store other nodes reach over the network (s3://, gs://, hdfs://…); a local path or file:// is not."""
    return bool(uri) and "://" in str(uri) and not str(uri).startswith("file://")


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
    """(hits, misses, bytes saved) over the events of one start: saved = bytes a hit did not read from the
    store. A hot-block replay's bytes are not counted: it reads the image's own files from local disk,
    which nothing would have fetched from the store (the table's `StageEntry.local_hits`)."""
    local = {c.name for c in stages() if c.stage and c.stage.local_hits}
    hits = misses = saved = 0
    for s in group:
        for e in s.events:
            cls = cache_class(e)
            hits += cls == "hit"
            misses += cls == "miss"
            if cls == "hit" and e.get("stage") not in local:
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
