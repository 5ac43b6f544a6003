"""Drawing a report: a text table for the terminal, JSON, an SVG timeline and a self-contained HTML page.

The timeline has one row per node (a coloured bar per stage, the launcher's time to ready() after
it, the straggler marked, a line where the job starts). Past `MAX_NODE_ROWS` nodes one row per node
no longer reads, so nodes are sorted by when they were ready and drawn as groups (a solid bar from
the group's median stage start to median end, a pale band from its 10th to 90th percentile), with
the straggler kept as a row of its own. Every string from the events is escaped: events come from
the store and are not trusted.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Callable
from typing import NamedTuple

from ..units import fmt_bytes, fmt_seconds, fmt_time
from .analysis import (
    READY_STAGE,
    TOTAL_STAGE,
    JobReport,
    NodeRow,
    StageStats,
    StartRow,
    TrendReport,
    already_fast,
    percentile,
    slowest,
    why_slow,
)

MAX_NODE_ROWS = 64
GROUP_ROWS = 32
SLOWEST_ROWS = 10
COLORS = {
    "image": "#4e79a7",
    "env": "#f28e2b",
    "checkpoint": "#59a14f",
    READY_STAGE: "#76b7b2",
    TOTAL_STAGE: "#dcdce4",
}
OTHER_COLORS = ("#b07aa1", "#9c755f", "#ff9da7", "#edc948", "#bab0ac")
STRAGGLER = "#d62728"
STAGE_HEADER = ["stage", "nodes", "p50", "p90", "max", "hits", "misses", "failed", "from store", "from peers"]
STAGE_HEADER += ["straggler", "cost to job"]
TREND_HEADER = ["started", "job", "start", "nodes", "startup", "hits", "misses", "from store", "from peers"]
TREND_HEADER += ["saved", "GPU-h"]


def color(stage: str, others: list[str]) -> str:
    if stage in COLORS:
        return COLORS[stage]
    return OTHER_COLORS[others.index(stage) % len(OTHER_COLORS)] if stage in others else OTHER_COLORS[0]


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


def _table(header: list[str], rows: list[list[str]], left: int = 1, last_left: bool = False) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    n = len(header)

    def line(r: list[str]) -> str:
        cells = [
            c.ljust(w) if i < left or (last_left and i == n - 1) else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def _first_start_words(r: JobReport) -> str:
    """The job's first start (the first row of the starts table), and the shown start's when it is another."""
    first = min((a.started for a in r.attempts), default=r.started)
    words = f"first start {fmt_time(first)}"
    return words if abs(r.started - first) < 0.5 else f"{words} · shown start began {fmt_time(r.started)}"


def job_text(r: JobReport) -> str:
    which = f"start {r.attempt}" if r.attempt else "latest start of each node"
    lines = [f"job {r.job} · {r.nodes} node(s) · {which} · {len(r.attempts)} start(s) in all · {_first_start_words(r)}"]
    if _straggler(r):
        lines.append(
            f"startup {fmt_seconds(r.startup_s)} to the slowest node's ready ({r.slowest_node}); median node ready at "
            f"{fmt_seconds(r.median_ready_s)}, so it waited {fmt_seconds(r.straggler_wait_s)} for the slowest"
        )
    else:
        lines.append(f"startup {fmt_seconds(r.startup_s)} to the node's ready ({r.slowest_node})")
    if _counts_gpus(r):
        lines.append(
            f"GPU time wasted {r.gpu_hours_wasted:.2f} GPU-hours ({r.nodes} nodes × {r.gpus_per_node} GPUs "
            f"[{r.gpus_source}] × {fmt_seconds(r.startup_s)})"
        )
    if r.ready_called < r.nodes:
        lines.append(
            f"note: {r.nodes - r.ready_called} node(s) never called bootseer_cli.ready(); for those, ready = "
            "when exec handed over to the launcher"
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
    return "\n".join(lines)


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
    return "\n".join(lines)


def to_json(report: JobReport | TrendReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True)


# ---- SVG timeline ------------------------------------------------------------------------------


def _tick_label(t: float, step: float, axis_max: float) -> str:
    """A tick's label, unique on its axis: one unit for the whole axis (ms below 1 s) and as many decimals as
    the step needs (`fmt_seconds` rounds 100 ms and 120 ms both to "0.1 s")."""
    if t == 0:
        return "0"
    scale, unit = (1000.0, "ms") if axis_max < 1.0 else (1.0, "s")
    decimals = next((d for d in range(4) if abs(round(step * scale, d) - step * scale) < 1e-9 * scale), 3)
    return f"{t * scale:.{decimals}f} {unit}"


def axis_ticks(tmax: float) -> tuple[float, list[tuple[float, str]]]:
    """The time axis up to `tmax` seconds: its end, and its ticks (multiples of a nice step, no float drift)."""
    step = _nice_step(tmax)
    axis_max = math.ceil(tmax * 1.02 / step) * step
    return axis_max, [(i * step, _tick_label(i * step, step, axis_max)) for i in range(round(axis_max / step) + 1)]


def _straggler(r: JobReport) -> str:
    """The node to mark as the straggler: none in a one-node job (nothing to be slower than)."""
    return r.slowest_node if r.nodes > 1 else ""


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = max(span, 1e-3) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag  # pragma: no cover


def _e(text: object) -> str:
    """`text` as HTML/SVG text: events come from the store and are not trusted."""
    return html.escape(str(text), quote=True)


class _Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, s: str) -> None:
        self.parts.append(s)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = "") -> None:
        w = max(w, 1.0)
        tip = f"<title>{_e(title)}</title>" if title else ""
        close = f">{tip}</rect>" if tip else "/>"
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{extra}{close}')

    def text(self, x: float, y: float, s: str, extra: str = "") -> None:
        self.add(f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{_e(s)}</text>')


def _group_bar(rows: list[NodeRow], stage: str) -> tuple[float, float, float, float] | None:
    """(p10 start, median start, median end, p90 end) of a stage over a group of nodes."""
    segs = [seg for row in rows for seg in row.segments if seg.stage == stage]
    if not segs:
        return None
    starts = [s.start for s in segs]
    ends = [s.end for s in segs]
    return percentile(starts, 10), percentile(starts, 50), percentile(ends, 50), percentile(ends, 90)


class _Layout(NamedTuple):
    """The timeline's rows: (label, the nodes drawn in the row, is it the straggler's row)."""

    rows: list[tuple[str, list[NodeRow], bool]]
    row_h: int
    first_single: int  # aggregated: the index of the first one-node row after the groups; else -1
    note: str  # what the title adds about the grouping


def _timeline_layout(r: JobReport) -> _Layout:
    """One row per node up to `MAX_NODE_ROWS`; past that, groups by ready time, then the slowest one by one."""
    star = _straggler(r)
    if len(r.rows) <= MAX_NODE_ROWS:
        rows = [
            (f"{'★ ' if row.node == star else ''}{row.node} · r{row.rank}", [row], row.node == star) for row in r.rows
        ]
        return _Layout(rows, 22 if len(rows) <= 16 else 16, -1, "")
    ordered = sorted(r.rows, key=lambda row: (row.ready, row.node))
    bulk, tail = ordered[:-SLOWEST_ROWS], ordered[-SLOWEST_ROWS:]
    size = math.ceil(len(bulk) / GROUP_ROWS)
    groups = [bulk[i : i + size] for i in range(0, len(bulk), size)]
    rows = [
        (
            f"#{i * size + 1}–{i * size + len(g)} · ready {fmt_seconds(g[0].ready)}–{fmt_seconds(g[-1].ready)}",
            g,
            False,
        )
        for i, g in enumerate(groups)
    ]
    first_single = len(rows)
    for i, row in enumerate(tail):
        slow = row.node == r.slowest_node
        rows.append((f"{'★ ' if slow else ''}#{len(bulk) + i + 1} {row.node}", [row], slow))
    note = f" (sorted by ready time: {len(groups)} groups of ≤{size} nodes, then the {SLOWEST_ROWS} slowest)"
    return _Layout(rows, 18, first_single, note)


def timeline_svg(r: JobReport, width: int = 1200) -> str:
    """The timeline as a standalone SVG document."""
    label_w, right, top, bottom_pad = 230, 40, 46, 64
    aggregated = len(r.rows) > MAX_NODE_ROWS
    others = sorted({seg.stage for row in r.rows for seg in row.segments} - set(COLORS))
    exec_stages = [s for s in ("image", "env", "checkpoint") if any(st.stage == s for st in r.stages)]
    tmax = max([row.ready for row in r.rows] + [seg.end for row in r.rows for seg in row.segments] + [0.001])
    axis_max, ticks = axis_ticks(tmax)
    plot_w = width - label_w - right

    def x(t: float) -> float:
        return label_w + max(0.0, t) / axis_max * plot_w

    layout = _timeline_layout(r)
    height = top + layout.row_h * len(layout.rows) + (18 if aggregated else 0) + bottom_pad
    svg = _Svg()
    svg.add(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12">'
    )
    svg.rect(0, 0, width, height, "#ffffff")
    title = f"job {r.job}: {r.nodes} node(s), startup {fmt_seconds(r.startup_s)} to the slowest node's ready"
    svg.text(10, 18, title + layout.note, ' font-size="14" font-weight="600" fill="#222"')
    for t, label in ticks:  # the axis and its grid
        gx = x(t)
        svg.add(f'<line x1="{gx:.1f}" y1="{top - 6}" x2="{gx:.1f}" y2="{height - bottom_pad + 4}" stroke="#ececf0"/>')
        svg.text(gx, top - 10, label, ' text-anchor="middle" fill="#666" font-size="11" class="tick"')
    y = _timeline_rows(svg, layout, x, top, width, exec_stages, others)
    _job_start_line(svg, r, x(r.startup_s), top, y, width)
    _legend(svg, r, y + 40, exec_stages, others, aggregated)
    svg.add("</svg>")
    return "\n".join(svg.parts)


def _timeline_rows(
    svg: _Svg,
    layout: _Layout,
    x: Callable[[float], float],
    top: float,
    width: int,
    stages: list[str],
    others: list[str],
) -> float:
    """Draw the rows (banded, the straggler's outlined); returns the y below the last one."""
    row_h = layout.row_h
    y = top
    for i, (label, rows, is_slow) in enumerate(layout.rows):
        if i == layout.first_single:
            svg.text(8, y + 13, f"the {SLOWEST_ROWS} slowest nodes, one row each:", ' fill="#666" font-size="11"')
            y += 18
        if i % 2 == 0:
            svg.rect(0, y, width, row_h, "#f7f7fa")
        if is_slow:
            svg.rect(2, y + 1, width - 4, row_h - 2, "none", extra=f' stroke="{STRAGGLER}" stroke-width="1.5"')
        label_attr = f' fill="{STRAGGLER}" font-weight="700"' if is_slow else ' fill="#333"'
        svg.text(8, y + row_h / 2 + 4, label[:38], label_attr)
        bar_h = row_h - 6
        if len(rows) == 1:
            _node_bars(svg, rows[0], x, y, row_h, bar_h, others)
        else:
            _group_bars(svg, rows, x, y, row_h, bar_h, stages, others)
        y += row_h
    return y


def _job_start_line(svg: _Svg, r: JobReport, jx: float, top: float, y: float, width: int) -> None:
    """The dashed line where the job starts (the slowest node ready), its words kept inside the picture."""
    svg.add(
        f'<line x1="{jx:.1f}" y1="{top - 4}" x2="{jx:.1f}" y2="{y + 2}" stroke="{STRAGGLER}" stroke-width="1.5" '
        'stroke-dasharray="5,3"/>'
    )
    who = f"slowest node {r.slowest_node}" if _straggler(r) else r.slowest_node
    words = f"job starts: {fmt_seconds(r.startup_s)} ({who} ready)"
    anchor = "end" if jx + 6.5 * len(words) > width - 10 else "start"
    dx = -4 if anchor == "end" else 4
    svg.text(
        jx + dx,
        y + 16,
        words,
        f' text-anchor="{anchor}" fill="{STRAGGLER}" font-size="11" font-weight="600"',
    )


def _node_bars(
    svg: _Svg, row: NodeRow, x: Callable[[float], float], y: float, row_h: float, bar_h: float, others: list[str]
) -> None:
    """One node's row: exec's total behind, a bar per stage (failures outlined, named when there is room),
    stages behind the launcher as a thin line, and a dot where the node was ready."""
    for seg in sorted(row.segments, key=lambda s: s.stage != TOTAL_STAGE):
        tip = (
            f"{row.node} {seg.stage}: {fmt_seconds(seg.end - seg.start)} ({seg.outcome}), "
            f"{fmt_seconds(seg.start)}–{fmt_seconds(seg.end)}"
        )
        fill = color(seg.stage, others)
        if seg.stage == TOTAL_STAGE:
            svg.rect(x(seg.start), y + 2, x(seg.end) - x(seg.start), row_h - 4, fill, tip)
        elif seg.stage in others:
            svg.rect(x(seg.start), y + row_h - 5, x(seg.end) - x(seg.start), 3, fill, tip)
        else:
            stroke = f' stroke="{STRAGGLER}" stroke-width="1.5"' if seg.outcome in ("failed", "fallback") else ""
            svg.rect(x(seg.start), y + 3, x(seg.end) - x(seg.start), bar_h, fill, tip, stroke)
            note = "failed" if stroke else seg.cache if seg.cache == "miss" else ""
            name = "launcher" if seg.stage == READY_STAGE else seg.stage
            words = f"{name} {note} {fmt_seconds(seg.end - seg.start)}".replace("  ", " ")
            if bar_h >= 12 and x(seg.end) - x(seg.start) > 7 * len(words) + 8:
                svg.text(x(seg.start) + 4, y + 3 + bar_h - 4, words, ' fill="#fff" font-size="10" font-weight="600"')
    svg.add(
        f'<circle cx="{x(row.ready):.1f}" cy="{y + row_h / 2:.1f}" r="2.5" fill="#333">'
        f"<title>{_e(row.node)} ready at {fmt_seconds(row.ready)}</title></circle>"
    )


def _group_bars(
    svg: _Svg,
    rows: list[NodeRow],
    x: Callable[[float], float],
    y: float,
    row_h: float,
    bar_h: float,
    stages: list[str],
    others: list[str],
) -> None:
    """A group's row: per stage a solid median bar over a pale p10–p90 band, and the spread of ready times."""
    for stage in [TOTAL_STAGE, *stages, READY_STAGE, *others]:
        bar = _group_bar(rows, stage)
        if bar is None:
            continue
        lo, mid_start, mid_end, hi = bar
        fill = color(stage, others)
        tip = (
            f"{stage} over {len(rows)} nodes: median {fmt_seconds(mid_start)}–{fmt_seconds(mid_end)}, "
            f"p10 start {fmt_seconds(lo)}, p90 end {fmt_seconds(hi)}"
        )
        if stage == TOTAL_STAGE:
            svg.rect(x(mid_start), y + 2, x(mid_end) - x(mid_start), row_h - 4, fill, tip)
            continue
        if stage in others:
            svg.rect(x(mid_start), y + row_h - 5, x(mid_end) - x(mid_start), 3, fill, tip)
            continue
        svg.rect(x(lo), y + 3, x(hi) - x(lo), bar_h, fill, tip, ' fill-opacity="0.35"')
        svg.rect(x(mid_start), y + 5, x(mid_end) - x(mid_start), bar_h - 4, fill, tip)
    readies = [row.ready for row in rows]
    lo, hi, mid = min(readies), max(readies), percentile(readies, 50)
    svg.add(
        f'<line x1="{x(lo):.1f}" y1="{y + row_h / 2:.1f}" x2="{x(hi):.1f}" y2="{y + row_h / 2:.1f}" stroke="#333" '
        f'stroke-width="1"/><circle cx="{x(mid):.1f}" cy="{y + row_h / 2:.1f}" r="2.5" '
        f'fill="#333"><title>ready {fmt_seconds(lo)}–{fmt_seconds(hi)}, median {fmt_seconds(mid)}</title></circle>'
    )


def _legend(svg: _Svg, r: JobReport, y: float, stages: list[str], others: list[str], aggregated: bool) -> None:
    items = [(s, color(s, others)) for s in stages]
    items += [("launcher → ready()", COLORS[READY_STAGE]), ("bootseer (exec total)", COLORS[TOTAL_STAGE])]
    items += [(s, color(s, others)) for s in others]
    lx = 10.0
    for name, fill in items:
        svg.rect(lx, y - 10, 14, 12, fill)
        svg.text(lx + 19, y, name, ' fill="#333"')
        lx += 30 + 7 * len(name)
    svg.text(lx + 6, y, "● ready", ' fill="#333"')
    lx += 70
    if _straggler(r):
        svg.text(lx, y, "★ straggler (slowest to ready)", f' fill="{STRAGGLER}" font-weight="700"')
    if aggregated:
        svg.text(
            10,
            y + 18,
            "Each group row: solid bar = median start to median end of the stage; pale band = 10th to 90th percentile.",
            ' fill="#666" font-size="11"',
        )


# ---- histogram ---------------------------------------------------------------------------------


def ready_histogram_svg(r: JobReport, width: int = 1200, height: int = 180) -> str:
    """How many nodes were ready by when: the straggler's tail at a glance."""
    readies = [row.ready for row in r.rows]
    left, right, top, bottom = 60, 30, 16, 34
    bins = min(60, max(10, int(math.sqrt(len(readies)) * 2)))
    hi = max(readies) or 1.0
    counts = [0] * bins
    for v in readies:
        counts[min(bins - 1, int(v / hi * bins))] += 1
    peak = max(counts)
    plot_w, plot_h = width - left - right, height - top - bottom
    svg = _Svg()
    svg.add(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="11">'
    )
    bw = plot_w / bins
    for i, c in enumerate(counts):
        if not c:
            continue
        h = c / peak * plot_h
        last = i == bins - 1
        svg.rect(
            left + i * bw + 1,
            top + plot_h - h,
            bw - 2,
            h,
            STRAGGLER if last else COLORS[READY_STAGE],
            f"{c} node(s) ready at {fmt_seconds(i * hi / bins)}–{fmt_seconds((i + 1) * hi / bins)}",
        )
    svg.add(f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" stroke="#999"/>')
    for q in (50, 90):
        v = percentile(readies, q)
        qx = left + v / hi * plot_w
        svg.add(
            f'<line x1="{qx:.1f}" y1="{top}" x2="{qx:.1f}" y2="{top + plot_h}" stroke="#333" stroke-dasharray="3,3"/>'
        )
        svg.text(qx + 3, top + 10, f"p{q} {fmt_seconds(v)}", ' fill="#333"')
    svg.text(left, height - 8, "0", ' fill="#666"')
    svg.text(width - right, height - 8, f"{fmt_seconds(hi)} (slowest)", ' fill="#666" text-anchor="end"')
    svg.text(left - 6, top + 10, str(peak), ' fill="#666" text-anchor="end"')
    svg.text(
        width / 2,
        height - 8,
        "seconds from the job's first start to the node's ready",
        ' fill="#666" text-anchor="middle"',
    )
    svg.add("</svg>")
    return "\n".join(svg.parts)


# ---- HTML --------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px 32px;color:#222;
background:#fff;max-width:1240px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;color:#333}
.sub{color:#666;font-size:13px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:18px 0}
.card{border:1px solid #e2e2ea;border-radius:8px;padding:10px 14px;min-width:170px;background:#fafafc}
.card .v{font-size:22px;font-weight:600} .card .k{font-size:12px;color:#666}
.card.bad .v{color:#d62728}
.verdict{background:#fff6e5;border-left:4px solid #f28e2b;padding:10px 14px;font-size:14px;border-radius:4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{padding:4px 10px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f3f3f7;font-weight:600} td:first-child,th:first-child{text-align:left}
td.l,th.l{text-align:left} tr.slow td{color:#d62728;font-weight:600}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.scroll{overflow-x:auto} footer{color:#999;font-size:11px;margin-top:30px}
"""


def _page(title: str, body: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _cards(items: list[tuple[str, str, bool]]) -> str:
    cells = "".join(
        f'<div class="card{" bad" if bad else ""}"><div class="v">{_e(v)}</div><div class="k">{_e(k)}</div></div>'
        for v, k, bad in items
    )
    return f'<div class="cards">{cells}</div>'


def _html_table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def job_html(r: JobReport) -> str:
    """A self-contained page: figures, verdict, timeline, stage table, ready histogram, slowest nodes."""
    which = f"start {r.attempt}" if r.attempt else "latest start of each node"
    body = [
        f"<h1>bootseer report · job {_e(r.job)}</h1>",
        f'<div class="sub">{r.nodes} node(s) · {which} · {len(r.attempts)} start(s) in this job · '
        f"{_e(_first_start_words(r))} · generated {_e(fmt_time(time.time()))}</div>",
        _job_cards(r),
        f'<p class="verdict">{_e(r.verdict)}</p>',
        "<h2>Timeline</h2>",
        f'<div class="scroll">{timeline_svg(r)}</div>',
        "<h2>Stages</h2>",
        _stage_table_html(r),
    ]
    if r.nodes > 8:
        body += ["<h2>Time to ready across nodes</h2>", f'<div class="scroll">{ready_histogram_svg(r)}</div>']
    body.append("<h2>Nodes</h2>" if r.nodes <= MAX_NODE_ROWS else "<h2>The 15 slowest nodes</h2>")
    body.append(_node_table_html(r))
    if len(r.attempts) > 1:
        body.append("<h2>Starts in this job</h2>")
        body.append(
            _html_table(
                ["start", "nodes", "first start", "startup"],
                [[str(a.attempt), str(a.nodes), _e(fmt_time(a.started)), fmt_seconds(a.startup_s)] for a in r.attempts],
            )
        )
    body.append("<footer>bootseer report · timeline times are seconds after the shown start began</footer>")
    return _page(f"bootseer report · {r.job}", body)


def _counts_gpus(r: JobReport) -> bool:
    """GPU time is shown only when something said the job has GPUs (not the assumed default of a CPU job)."""
    return r.gpus_source != "default"


def _job_cards(r: JobReport) -> str:
    """The headline figures of a job, the ones that call for action marked (none when it is already fast)."""
    act = not already_fast(r)
    items = [(fmt_seconds(r.startup_s), "startup: job's first start → slowest node ready", act)]
    if _straggler(r):
        items += [
            (r.slowest_node, "slowest node (the straggler)", act),
            (fmt_seconds(r.median_ready_s), "median node ready", False),
            (fmt_seconds(r.straggler_wait_s), "median node's wait for the slowest", False),
        ]
    if _counts_gpus(r):
        words = f"GPU time wasted: {r.nodes} × {r.gpus_per_node} GPUs ({r.gpus_source}) × {fmt_seconds(r.startup_s)}"
        items.append((f"{r.gpu_hours_wasted:.2f} GPU-h", words, False))
    items.append((f"{r.ready_called}/{r.nodes}", "nodes that called bootseer_cli.ready()", r.ready_called < r.nodes))
    return _cards(items)


def _stage_table_html(r: JobReport) -> str:
    """The stage table of the page: the rows of `stage_cells`, escaped, with the stage's colour swatch."""
    others = sorted({seg.stage for row in r.rows for seg in row.segments} - set(COLORS))
    rows = []
    for s, cells in zip(r.stages, map(stage_cells, r.stages), strict=True):
        sw = f'<span class="sw" style="background:{color(s.stage, others)}"></span>'
        rows.append([sw + _e(cells.label), *(_e(c) for c in cells[1:])])
    return _html_table(STAGE_HEADER, rows)


def _node_table_html(r: JobReport) -> str:
    """Every node's stage durations (or, past `MAX_NODE_ROWS`, the 15 slowest), the straggler marked."""
    stage_names = [s.stage for s in r.stages if s.stage not in (TOTAL_STAGE, READY_STAGE)]
    listed = r.rows if r.nodes <= MAX_NODE_ROWS else sorted(r.rows, key=lambda row: -row.ready)[:15]
    rows, classes = [], []
    star = _straggler(r)
    for row in listed:
        by = {seg.stage: seg.end - seg.start for seg in row.segments}
        rows.append(
            [_e(("★ " if row.node == star else "") + row.node), str(row.rank), _e(row.run)]
            + [fmt_seconds(by[n]) if n in by else "–" for n in [*stage_names, TOTAL_STAGE, READY_STAGE]]
            + [fmt_seconds(row.ready), fmt_seconds(row.wait_s)]
        )
        classes.append("slow" if row.node == star else "")
    return _html_table(
        ["node", "rank", "run", *stage_names, "bootseer", "launcher", "ready at", "waited"], rows, classes
    )


def trend_svg(t: TrendReport, width: int = 1200, height: int = 260) -> str:
    """Startup per start over time: one dot per start, oldest on the left."""
    left, right, top, bottom = 60, 30, 20, 40
    svg = _Svg()
    svg.add(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="11">'
    )
    svg.rect(0, 0, width, height, "#ffffff")
    plot_w, plot_h = width - left - right, height - top - bottom
    rows = t.rows
    ymax = max([r.startup_s for r in rows] + [0.001])
    step = _nice_step(ymax, 5)
    ymax = math.ceil(ymax / step) * step
    v = 0.0
    while v <= ymax + 1e-9:
        gy = top + plot_h - v / ymax * plot_h
        svg.add(f'<line x1="{left}" y1="{gy:.1f}" x2="{width - right}" y2="{gy:.1f}" stroke="#ececf0"/>')
        svg.text(left - 6, gy + 4, fmt_seconds(v) if v else "0", ' text-anchor="end" fill="#666"')
        v += step
    n = len(rows)
    pts = []
    for i, r in enumerate(rows):
        px = left + (i + 0.5) / max(n, 1) * plot_w
        py = top + plot_h - r.startup_s / ymax * plot_h
        pts.append((px, py, r))
    if len(pts) > 1:
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in pts)
        svg.add(f'<polyline points="{path}" fill="none" stroke="{COLORS[READY_STAGE]}" stroke-width="2"/>')
    for px, py, r in pts:
        svg.add(
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{COLORS["image"]}"><title>{_e(r.job)} start '
            f"{r.attempt}: {fmt_seconds(r.startup_s)}, {r.nodes} nodes, {_e(fmt_time(r.started))}</title></circle>"
        )
    if rows:
        svg.text(left, height - 10, fmt_time(rows[0].started), ' fill="#666"')
        svg.text(width - right, height - 10, fmt_time(rows[-1].started), ' fill="#666" text-anchor="end"')
    svg.text(
        width / 2,
        height - 10,
        "startup per start (job's first start → slowest node ready)",
        ' fill="#666" text-anchor="middle"',
    )
    svg.add("</svg>")
    return "\n".join(svg.parts)


def trend_html(t: TrendReport) -> str:
    hit = f"{t.hit_rate:.0%}" if t.hit_rate is not None else "–"
    body = [
        f"<h1>bootseer report · last {t.since_s / 86400:g} day(s)</h1>",
        f'<div class="sub">{t.jobs} job(s) · {t.starts} start(s) · {t.node_starts} node start(s) · generated '
        f"{_e(fmt_time(time.time()))}</div>",
        _cards(
            [
                (fmt_seconds(t.median_startup_s), "median startup per start", False),
                (fmt_seconds(t.mean_startup_s), "mean startup per start", False),
                (hit, f"cache hit rate ({t.hits} hits, {t.misses} misses)", False),
                (fmt_bytes(t.bytes_saved), "bytes saved (hits not read from the store)", False),
                (f"{t.gpu_hours_wasted:.2f} GPU-h", "GPU time wasted in startup", False),
            ]
        ),
        f'<p class="verdict">Trend: {_e(t.trend)}</p>',
        "<h2>Startup per start</h2>",
        f'<div class="scroll">{trend_svg(t)}</div>',
        "<h2>Starts</h2>",
        _html_table(TREND_HEADER, [[_e(v) for v in c] for c in map(start_cells, t.rows)]),
    ]
    return _page("bootseer report · trend", body)
