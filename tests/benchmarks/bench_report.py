"""How long `bootseer report` takes over large jobs, against the bare read of their events.

    python tests/benchmarks/bench_report.py [--nodes 1000,4000]

For each size: generate a job of N nodes (one Parquet file per node, six events each, as the agent
uploads them) in a temporary file:// store, then time side by side in one run (best of 3, since the
build machine is shared): the bare read of the events with `tests.support.events_table.load_table`,
which any report must pay, and the whole report (load, analysis, HTML page and SVG). The ratio is
what the report adds on top of reading. Everything lives under one temporary directory, removed
however the run ends.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.report.support import node_events, write_run
from tests.support.events_table import load_table

from bootseer_cli.report import analysis, load
from bootseer_cli.report.page import job_html
from bootseer_cli.report.svg import timeline_svg
from bootseer_cli.store.core import Store

REPEAT = 3


def best(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(best wall seconds, best CPU seconds, last result) over REPEAT runs."""
    walls, cpus, result = [], [], None
    for _ in range(REPEAT):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), result


def bench(n: int, root: Path) -> dict[str, float]:
    store = Store((root / f"store-{n}").as_uri())
    rng = random.Random(n)
    base = time.time() - 3600
    for k in range(n):
        evs = node_events(base + rng.uniform(0, 2), rng, env_miss=k % 97 == 5, ckpt_s=60.0 if k == n // 2 else None)
        write_run(store, root / f"gen-{n}", "big", f"node-{k:05d}", k, "20260101T000000-aaaaaaaa", evs)

    def report() -> tuple[str, str, int]:
        r = analysis.analyze_job(load.load_job(store, "big"), "big")
        return job_html(r), timeline_svg(r), r.nodes

    read_s, read_cpu, table = best(lambda: load_table(store, "big"))
    total_s, total_cpu, (page, svg, nodes) = best(report)
    assert nodes == n and table.num_rows == 6 * n
    return {
        "events": float(table.num_rows),
        "read_s": read_s,
        "read_cpu": read_cpu,
        "total_s": total_s,
        "total_cpu": total_cpu,
        "html_kb": len(page) / 1024,
        "svg_kb": len(svg) / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1000,4000")
    sizes = [int(x) for x in ap.parse_args().nodes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        print(
            f"{'nodes':>6} {'events':>7} {'read':>7} {'(cpu)':>7} {'report':>7} {'(cpu)':>7} "
            f"{'ratio':>6} {'html KiB':>8} {'svg KiB':>8}"
        )
        for n in sizes:
            r = bench(n, root)
            print(
                f"{n:>6} {int(r['events']):>7} {r['read_s']:>6.2f}s {r['read_cpu']:>6.2f}s {r['total_s']:>6.2f}s "
                f"{r['total_cpu']:>6.2f}s {r['total_s'] / r['read_s']:>5.1f}x {r['html_kb']:>8.0f} {r['svg_kb']:>8.0f}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
