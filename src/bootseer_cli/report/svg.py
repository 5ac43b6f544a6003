"""A report drawn as SVG: the timeline, the histogram of ready times and the trend of startups.

The timeline has one row per node (a coloured bar per stage, the launcher's time to ready() after
it, the straggler marked, a line where the job starts). Past `MAX_NODE_ROWS` nodes one row per node
no longer reads, so nodes are sorted by when they were ready and drawn as groups (a solid bar from
the group's median stage start to median end, a pale band from its 10th to 90th percentile), with
the straggler kept as a row of its own. Every string from the events is escaped: events come from
the store and are not trusted.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from typing import NamedTuple

from ..capabilities import stage_names
from ..units import fmt_seconds, fmt_time
from .analysis import TrendReport
from .job import JobReport, NodeRow
from .starts import FIRST_STEP_STAGE, LAUNCHER_STAGES, READY_STAGE, TOTAL_STAGE, count, percentile
from .text import straggler_node

MAX_NODE_ROWS = 64
GROUP_ROWS = 32
SLOWEST_ROWS = 10
# The capability table's stages take these in the table's order (image, env, checkpoint, compile, …): a
# stage added to the table is drawn as a bar of its own colour with nothing here changed.
STAGE_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#8cd17d", "#86bcb6")
COLORS = {
    READY_STAGE: "#76b7b2",
    FIRST_STEP_STAGE: "#499894",
    TOTAL_STAGE: "#dcdce4",
}
OTHER_COLORS = ("#b07aa1", "#9c755f", "#ff9da7", "#edc948", "#bab0ac")
STRAGGLER = "#d62728"


def exec_stages(shown: set[str]) -> list[str]:
    """The capability table's stages among `shown`, in the table's order: drawn as bars of their own."""
    return [s for s in stage_names() if s in shown]


def background_stages(shown: set[str]) -> list[str]:
    """The rest of `shown` but exec's total and the launcher's: the agent's work behind the launcher (and
    any stage the table does not know, events being untrusted), drawn as a thin line under the bars."""
    return sorted(shown - set(stage_names()) - set(COLORS))


def color(stage: str, others: list[str]) -> str:
    if stage in COLORS:
        return COLORS[stage]
    table = stage_names()
    if stage in table:
        return STAGE_COLORS[table.index(stage) % len(STAGE_COLORS)]
    return OTHER_COLORS[others.index(stage) % len(OTHER_COLORS)] if stage in others else OTHER_COLORS[0]


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


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = max(span, 1e-3) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag  # pragma: no cover


# What XML 1.0 does not allow (C0 controls but tab and newlines, surrogates, U+FFFE/U+FFFF), and the C1
# controls it discourages: one such character from the store made the whole SVG unparseable.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def esc(text: object) -> str:
    """`text` as HTML/SVG text: events come from the store and are not trusted, so markup is escaped and
    characters XML cannot hold are shown as U+FFFD (the page and the SVG stay well-formed)."""
    return html.escape(_NOT_XML.sub("\ufffd", str(text)), quote=True)


class _Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, s: str) -> None:
        self.parts.append(s)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = "") -> None:
        w = max(w, 1.0)
        tip = f"<title>{esc(title)}</title>" if title else ""
        close = f">{tip}</rect>" if tip else "/>"
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{extra}{close}')

    def text(self, x: float, y: float, s: str, extra: str = "") -> None:
        self.add(f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{esc(s)}</text>')


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
    star = straggler_node(r)
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
    others = background_stages({seg.stage for row in r.rows for seg in row.segments})
    bars = exec_stages({st.stage for st in r.stages})
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
    y = _timeline_rows(svg, layout, x, top, width, bars, others)
    _job_start_line(svg, r, x(r.startup_s), top, y, width)
    _legend(svg, r, y + 40, bars, others, aggregated)
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
    who = f"slowest node {r.slowest_node}" if straggler_node(r) else r.slowest_node
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
            name = "launcher" if seg.stage in LAUNCHER_STAGES else seg.stage
            words = f"{name} {note} {fmt_seconds(seg.end - seg.start)}".replace("  ", " ")
            if bar_h >= 12 and x(seg.end) - x(seg.start) > 7 * len(words) + 8:
                svg.text(x(seg.start) + 4, y + 3 + bar_h - 4, words, ' fill="#fff" font-size="10" font-weight="600"')
    svg.add(
        f'<circle cx="{x(row.ready):.1f}" cy="{y + row_h / 2:.1f}" r="2.5" fill="#333">'
        f"<title>{esc(row.node)} ready at {fmt_seconds(row.ready)}</title></circle>"
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
    for stage in [TOTAL_STAGE, *stages, FIRST_STEP_STAGE, READY_STAGE, *others]:
        bar = _group_bar(rows, stage)
        if bar is None:
            continue
        lo, mid_start, mid_end, hi = bar
        fill = color(stage, others)
        tip = (
            f"{stage} over {count(len(rows), 'node')}: median {fmt_seconds(mid_start)}–{fmt_seconds(mid_end)}, "
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
    shown = {seg.stage for row in r.rows for seg in row.segments}
    if FIRST_STEP_STAGE in shown:
        items.append(("launcher → first step", COLORS[FIRST_STEP_STAGE]))
    if READY_STAGE in shown or FIRST_STEP_STAGE not in shown:
        items.append(("launcher → ready()", COLORS[READY_STAGE]))
    items.append(("bootseer (exec total)", COLORS[TOTAL_STAGE]))
    items += [(s, color(s, others)) for s in others]
    lx = 10.0
    for name, fill in items:
        svg.rect(lx, y - 10, 14, 12, fill)
        svg.text(lx + 19, y, name, ' fill="#333"')
        lx += 30 + 7 * len(name)
    svg.text(lx + 6, y, "● ready", ' fill="#333"')
    lx += 70
    if straggler_node(r):
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


# ---- trend -------------------------------------------------------------------------------------


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
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{STAGE_COLORS[0]}"><title>{esc(r.job)} start '
            f"{r.attempt}: {fmt_seconds(r.startup_s)}, {count(r.nodes, 'node')}, "
            f"{esc(fmt_time(r.started))}</title></circle>"
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
