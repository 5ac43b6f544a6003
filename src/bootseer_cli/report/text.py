"""A report as text and JSON, and the rows of its tables, built once for the terminal and the page."""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from ..units import fmt_bytes, fmt_seconds, fmt_time
from .analysis import StartRow, TrendReport
from .findings import slowest, why_slow
from .job import JobReport, StageStats
from .starts import count

# Characters that must not reach a terminal as they are: C0 controls but the newline (ESC starts
# sequences that clear the screen, retitle the window or rewrite what was printed before; BEL rings),
# DEL, C1 controls (0x9b is a one-byte CSI) and the bidi overrides and isolates (text shown in another
# order than it reads). Node names, reasons, job ids and details come from the store, written by any job.
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """`text` with every control character written out (`\\x1b`), so a report from the store cannot drive
    the terminal it is printed on; the newlines of the report's own lines stay."""
    return _UNSAFE.sub(
        lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", text
    )


# ---- rows: built once, drawn as text and as HTML ----------------------------------------------


class StageCells(NamedTuple):
    """One stage's row of the stage table, each figure formatted once for both renderers.

    The cells are plain text: the text table joins the straggler and its cost in one column, the page
    escapes them and gives each its own column.
    """

    label: str
    nodes: str
    p50: str
    p90: str
    max: str
    hits: str
    misses: str
    failed: str
    from_store: str
    from_peers: str
    straggler: str
    cost: str


def stage_cells(s: StageStats) -> StageCells:
    """The row of stage `s` in the stage table."""
    return StageCells(
        label=s.label,
        nodes=str(s.nodes),
        p50=fmt_seconds(s.p50_s),
        p90=fmt_seconds(s.p90_s),
        max=fmt_seconds(s.max_s),
        hits=str(s.hits),
        misses=str(s.misses),
        failed=str(s.failed),
        from_store=fmt_bytes(s.bytes_from_store),
        from_peers=fmt_bytes(s.bytes_from_peers),
        straggler=s.straggler,
        cost=fmt_seconds(s.straggler_cost_s),
    )


class StartCells(NamedTuple):
    """One start's row of the trend table (plain text, see `StageCells`)."""

    started: str
    job: str
    attempt: str
    nodes: str
    startup: str
    hits: str
    misses: str
    from_store: str
    from_peers: str
    saved: str
    gpu_hours: str


def start_cells(s: StartRow) -> StartCells:
    """The row of start `s` in the trend table."""
    return StartCells(
        started=fmt_time(s.started),
        job=s.job,
        attempt=str(s.attempt),
        nodes=str(s.nodes),
        startup=fmt_seconds(s.startup_s),
        hits=str(s.hits),
        misses=str(s.misses),
        from_store=fmt_bytes(s.bytes_from_store),
        from_peers=fmt_bytes(s.bytes_from_peers),
        saved=fmt_bytes(s.bytes_saved),
        gpu_hours=f"{s.gpu_hours_wasted:.2f}",
    )


# ---- text ------------------------------------------------------------------------------------


def straggler_node(r: JobReport) -> str:
    """The node to mark as the straggler: none in a one-node job (nothing to be slower than)."""
    return r.slowest_node if r.nodes > 1 else ""


def counts_gpus(r: JobReport) -> bool:
    """GPU time is shown only when something said the job has GPUs (not the assumed default of a CPU job)."""
    return r.gpus_source != "default"


def first_start_words(r: JobReport) -> str:
    """The job's first start (the first row of the starts table), and the shown start's when it is another."""
    first = min((a.started for a in r.attempts), default=r.started)
    words = f"first start {fmt_time(first)}"
    return words if abs(r.started - first) < 0.5 else f"{words} · shown start began {fmt_time(r.started)}"


def _table(header: list[str], rows: list[list[str]], left: int = 1, last_left: bool = False) -> list[str]:
    rows = [[terminal_safe(c) for c in r] for r in rows]  # escaped before measuring: the columns stay aligned
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    n = len(header)

    def line(r: list[str]) -> str:
        cells = [
            c.ljust(w) if i < left or (last_left and i == n - 1) else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def job_text(r: JobReport) -> str:
    which = f"start {r.attempt}" if r.attempt else "latest start of each node"
    lines = [f"job {r.job} · {r.nodes} node(s) · {which} · {len(r.attempts)} start(s) in all · {first_start_words(r)}"]
    if straggler_node(r):
        lines.append(
            f"startup {fmt_seconds(r.startup_s)} to the slowest node's ready ({r.slowest_node}); median node ready at "
            f"{fmt_seconds(r.median_ready_s)}, so it waited {fmt_seconds(r.straggler_wait_s)} for the slowest"
        )
    else:
        lines.append(f"startup {fmt_seconds(r.startup_s)} to the node's ready ({r.slowest_node})")
    if counts_gpus(r):
        lines.append(
            f"GPU time wasted {r.gpu_hours_wasted:.2f} GPU-hours ({count(r.nodes, 'node')} × {r.gpus_per_node} GPUs "
            f"[{r.gpus_source}] × {fmt_seconds(r.startup_s)})"
        )
    if r.first_step_detected:
        lines.append(
            f"note: {r.first_step_detected} node(s) ready at their first optimizer step (detected; the program "
            "never called bootseer_cli.ready())"
        )
    if r.ready_called + r.first_step_detected < r.nodes:
        lines.append(
            f"note: {r.nodes - r.ready_called - r.first_step_detected} node(s) neither called bootseer_cli.ready() "
            "nor made an optimizer step; for those, ready = when exec handed over to the launcher"
        )
    if r.env_mounted:
        lines.append(
            f"note: env mounted, not extracted, on {r.env_mounted} of {count(r.nodes, 'node')} ({r.env_mount_how}); "
            f"mount p50 {fmt_seconds(r.env_mount_p50_s)}"
        )
    rows = [[*c[:10], f"{c.straggler} (+{c.cost})"] for c in map(stage_cells, r.stages)]
    header = ["stage", "nodes", "p50", "p90", "max", "hits", "miss", "fail", "from store", "from peers"]
    lines += ["", *_table([*header, "straggler (cost to job)"], rows, left=1, last_left=True)]
    tail = slowest(r, 5) if r.nodes > 1 and r.straggler_wait_s >= max(1.0, 0.05 * r.startup_s) else []
    if tail:
        lines += ["", "slowest nodes (ready at, and the stage each lost the most in):"]
        lines += [f"  {fmt_seconds(row.ready):>8}  {why_slow(r, row)}" for row in tail]
    if len(r.attempts) > 1:
        lines += ["", "starts in this job:"]
        for a in r.attempts:
            lines.append(f"  start {a.attempt}: {a.nodes} node(s), {fmt_seconds(a.startup_s)} ({fmt_time(a.started)})")
    lines += ["", r.verdict]
    return terminal_safe("\n".join(lines))


def trend_text(t: TrendReport) -> str:
    days = t.since_s / 86400
    hit = f"{t.hit_rate:.0%} hit rate" if t.hit_rate is not None else "no cache events"
    lines = [
        f"last {days:g} day(s): {t.jobs} job(s), {t.starts} start(s), {t.node_starts} node start(s)",
        f"startup per start: mean {fmt_seconds(t.mean_startup_s)}, median {fmt_seconds(t.median_startup_s)}; "
        f"trend: {t.trend}",
        f"cache: {t.hits} hits, {t.misses} misses ({hit}); {fmt_bytes(t.bytes_saved)} saved (hits not read from the "
        f"store); {fmt_bytes(t.bytes_from_store)} from the store, {fmt_bytes(t.bytes_from_peers)} from peers",
        f"GPU time wasted in startup: {t.gpu_hours_wasted:.2f} GPU-hours",
        "",
    ]
    rows = [[*c[:5], f"{c.hits}/{c.misses}", *c[7:]] for c in map(start_cells, t.rows)]
    header = ["started", "job", "start", "nodes", "startup", "hit/miss", "from store", "from peers", "saved", "GPU-h"]
    lines += _table(header, rows, left=2)
    return terminal_safe("\n".join(lines))


def to_json(report: JobReport | TrendReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)
