"""A report as a self-contained HTML page: the figures, the verdict, the SVG drawings and the tables.
Every string from the events is escaped: events come from the store and are not trusted."""

from __future__ import annotations

import time

from ..units import fmt_bytes, fmt_seconds, fmt_time
from .analysis import TrendReport
from .findings import already_fast
from .job import JobReport
from .starts import FIRST_STEP_STAGE, LAUNCHER_STAGES, READY_STAGE, TOTAL_STAGE
from .svg import MAX_NODE_ROWS, background_stages, color, esc, ready_histogram_svg, timeline_svg, trend_svg
from .text import counts_gpus, first_start_words, stage_cells, start_cells, straggler_node

STAGE_HEADER = ["stage", "nodes", "p50", "p90", "max", "hits", "misses", "failed", "from store", "from peers"]
STAGE_HEADER += ["straggler", "cost to job"]
TREND_HEADER = ["started", "job", "start", "nodes", "startup", "hits", "misses", "from store", "from peers"]
TREND_HEADER += ["saved", "GPU-h"]

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
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _cards(items: list[tuple[str, str, bool]]) -> str:
    cells = "".join(
        f'<div class="card{" bad" if bad else ""}"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
        for v, k, bad in items
    )
    return f'<div class="cards">{cells}</div>'


def _html_table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def job_html(r: JobReport) -> str:
    """A self-contained page: figures, verdict, timeline, stage table, ready histogram, slowest nodes."""
    which = f"start {r.attempt}" if r.attempt else "latest start of each node"
    body = [
        f"<h1>bootseer report · job {esc(r.job)}</h1>",
        f'<div class="sub">{r.nodes} node(s) · {which} · {len(r.attempts)} start(s) in this job · '
        f"{esc(first_start_words(r))} · generated {esc(fmt_time(time.time()))}</div>",
        _job_cards(r),
        f'<p class="verdict">{esc(r.verdict)}</p>',
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
                ["start", "nodes", "began", "startup"],
                [
                    [str(a.attempt), str(a.nodes), esc(fmt_time(a.started)), fmt_seconds(a.startup_s)]
                    for a in r.attempts
                ],
            )
        )
    body.append("<footer>bootseer report · timeline times are seconds after the shown start began</footer>")
    return _page(f"bootseer report · {r.job}", body)


def _job_cards(r: JobReport) -> str:
    """The headline figures of a job, the ones that call for action marked (none when it is already fast)."""
    act = not already_fast(r)
    which = f"start {r.attempt}" if r.attempt else "this start"
    items = [(fmt_seconds(r.startup_s), f"startup: {which}'s first node start → slowest node ready", act)]
    if straggler_node(r):
        items += [
            (r.slowest_node, "slowest node (the straggler)", act),
            (fmt_seconds(r.median_ready_s), "median node ready", False),
            (fmt_seconds(r.straggler_wait_s), "median node's wait for the slowest", False),
        ]
    if counts_gpus(r):
        words = f"GPU time wasted: {r.nodes} × {r.gpus_per_node} GPUs ({r.gpus_source}) × {fmt_seconds(r.startup_s)}"
        items.append((f"{r.gpu_hours_wasted:.2f} GPU-h", words, False))
    unmeasured = r.nodes - r.ready_called - r.first_step_detected
    items.append((f"{r.ready_called}/{r.nodes}", "nodes that called bootseer_cli.ready()", False))
    if r.first_step_detected:
        items.append((f"{r.first_step_detected}/{r.nodes}", "nodes ready at their first optimizer step", False))
    if unmeasured:
        items.append((f"{unmeasured}/{r.nodes}", "nodes measured only to exec's hand-over (no step seen)", True))
    return _cards(items)


def _stage_table_html(r: JobReport) -> str:
    """The stage table of the page: the rows of `stage_cells`, escaped, with the stage's colour swatch."""
    others = background_stages({seg.stage for row in r.rows for seg in row.segments})
    rows = []
    for s, cells in zip(r.stages, map(stage_cells, r.stages), strict=True):
        sw = f'<span class="sw" style="background:{color(s.stage, others)}"></span>'
        rows.append([sw + esc(cells.label), *(esc(c) for c in cells[1:])])
    return _html_table(STAGE_HEADER, rows)


_LAUNCHER_HEADS = {FIRST_STEP_STAGE: "to first step", READY_STAGE: "launcher"}


def _node_table_html(r: JobReport) -> str:
    """Every node's stage durations (or, past `MAX_NODE_ROWS`, the 15 slowest), the straggler marked."""
    stage_names = [s.stage for s in r.stages if s.stage not in (TOTAL_STAGE, *LAUNCHER_STAGES)]
    shown = {s.stage for s in r.stages}
    launcher = [n for n in (FIRST_STEP_STAGE, READY_STAGE) if n in shown] or [READY_STAGE]
    listed = r.rows if r.nodes <= MAX_NODE_ROWS else sorted(r.rows, key=lambda row: -row.ready)[:15]
    rows, classes = [], []
    star = straggler_node(r)
    for row in listed:
        by = {seg.stage: seg.end - seg.start for seg in row.segments}
        rows.append(
            [esc(("★ " if row.node == star else "") + row.node), str(row.rank), esc(row.run)]
            + [fmt_seconds(by[n]) if n in by else "–" for n in [*stage_names, TOTAL_STAGE, *launcher]]
            + [fmt_seconds(row.ready), fmt_seconds(row.wait_s)]
        )
        classes.append("slow" if row.node == star else "")
    heads = ["node", "rank", "run", *stage_names, "bootseer", *(_LAUNCHER_HEADS[n] for n in launcher)]
    return _html_table(
        [*heads, "ready at", "waited"],
        rows,
        classes,
    )


def trend_html(t: TrendReport) -> str:
    hit = f"{t.hit_rate:.0%}" if t.hit_rate is not None else "–"
    body = [
        f"<h1>bootseer report · last {t.since_s / 86400:g} day(s)</h1>",
        f'<div class="sub">{t.jobs} job(s) · {t.starts} start(s) · {t.node_starts} node start(s) · generated '
        f"{esc(fmt_time(time.time()))}</div>",
        _cards(
            [
                (fmt_seconds(t.median_startup_s), "median startup per start", False),
                (fmt_seconds(t.mean_startup_s), "mean startup per start", False),
                (hit, f"cache hit rate ({t.hits} hits, {t.misses} misses)", False),
                (fmt_bytes(t.bytes_saved), "bytes saved (hits not read from the store)", False),
                (f"{t.gpu_hours_wasted:.2f} GPU-h", "GPU time wasted in startup", False),
            ]
        ),
        f'<p class="verdict">Trend: {esc(t.trend)}</p>',
        "<h2>Startup per start</h2>",
        f'<div class="scroll">{trend_svg(t)}</div>',
        "<h2>Starts</h2>",
        _html_table(TREND_HEADER, [[esc(v) for v in c] for c in map(start_cells, t.rows)]),
    ]
    return _page("bootseer report · trend", body)
