"""How long `bootseer report` takes over large jobs, and the event reader against a plain pyarrow dataset.

    python tests/benchmarks/bench_report.py [--nodes 1000,4000]

For each size: generate a job of N nodes (one Parquet file per node, as the agent uploads them) in a
temporary file:// store, then time side by side in one run: reading the events with
`pyarrow.dataset` over the files (the foundation's `events.load_table`) and with the report's
parallel reader; the analysis; the HTML page and SVG. Prints a table. Everything lives under one
temporary directory, removed however the run ends.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.report.support import node_events, write_run

from bootseer_cli import events
from bootseer_cli.report import analysis, load, render
from bootseer_cli.store import Store


def bench(n: int, root: Path) -> dict[str, float]:
    store = Store((root / f"store-{n}").as_uri())
    rng = random.Random(n)
    base = time.time() - 3600
    for k in range(n):
        evs = node_events(base + rng.uniform(0, 2), rng, env_miss=k % 97 == 5, ckpt_s=60.0 if k == n // 2 else None)
        write_run(store, root / f"gen-{n}", "big", f"node-{k:05d}", k, "20260101T000000-aaaaaaaa", evs)
    out: dict[str, float] = {}
    t = time.perf_counter()
    table = events.load_table(store, "big")
    out["dataset_s"] = time.perf_counter() - t
    t = time.perf_counter()
    rows = load.load_job(store, "big")
    out["reader_s"] = time.perf_counter() - t
    assert len(rows) == table.num_rows
    t = time.perf_counter()
    report = analysis.analyze_job(rows, "big")
    out["analysis_s"] = time.perf_counter() - t
    t = time.perf_counter()
    page = render.job_html(report)
    svg = render.timeline_svg(report)
    out["render_s"] = time.perf_counter() - t
    out["html_kb"] = len(page) / 1024
    out["svg_kb"] = len(svg) / 1024
    out["events"] = float(len(rows))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1000,4000")
    sizes = [int(x) for x in ap.parse_args().nodes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        print(
            f"{'nodes':>6} {'events':>7} {'dataset':>8} {'reader':>7} {'ratio':>6} {'analysis':>8} "
            f"{'render':>7} {'total':>7} {'html KiB':>8}"
        )
        for n in sizes:
            r = bench(n, root)
            total = r["reader_s"] + r["analysis_s"] + r["render_s"]
            print(
                f"{n:>6} {int(r['events']):>7} {r['dataset_s']:>7.2f}s {r['reader_s']:>6.2f}s "
                f"{r['dataset_s'] / r['reader_s']:>5.1f}x {r['analysis_s']:>7.2f}s {r['render_s']:>6.2f}s "
                f"{total:>6.2f}s {r['html_kb']:>8.0f}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
