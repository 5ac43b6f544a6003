"""`bootseer report --since`: startup per start across jobs, hit rates, bytes saved and the trend."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bootseer_cli.store.core import Store
from bootseer_cli.trust import default_domain
from tests.report.recompute import latest_runs
from tests.report.support import node_events, write_run

DAY = 86400.0


def _job(store: Store, tmp: Path, job: str, t: float, nodes: int, env_miss: bool, rng: random.Random) -> list[dict]:
    rows = []
    for k in range(nodes):
        evs = node_events(t + rng.uniform(0, 1), rng, env_miss=env_miss)
        rows += write_run(store, tmp, job, f"n{k}", k, f"run-{int(t)}", evs)
    return rows


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bootseer_cli", "report", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _startup(rows: list[dict[str, Any]]) -> float:
    nodes = latest_runs(rows)
    t0 = min(e["start"] for evs in nodes.values() for e in evs if e["stage"] == "bootseer")
    return max(e["end"] for evs in nodes.values() for e in evs if e["stage"] == "ready") - t0


def test_since_across_jobs(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    rng = random.Random(3)
    now = time.time()
    _job(store, tmp_path, "ancient", now - 10 * DAY, 3, True, rng)  # outside the window
    a1 = _job(store, tmp_path, "job-a", now - 3 * DAY, 3, True, rng)  # a cold first start…
    a2 = _job(store, tmp_path, "job-a", now - 3 * DAY + 3600, 3, False, rng)  # …then a warm restart
    b = _job(store, tmp_path, "job-b", now - 1 * DAY, 4, False, rng)
    starts = [a1, a2, b]

    html = tmp_path / "trend.html"
    out = _cli("--store", store.uri, "--since", "7d", "--json", "--html", str(html))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["jobs"] == 2 and doc["starts"] == 3 and doc["node_starts"] == 10
    assert [(r["job"], r["attempt"], r["nodes"]) for r in doc["rows"]] == [
        ("job-a", 1, 3),
        ("job-a", 2, 3),
        ("job-b", 1, 4),
    ]
    every = a1 + a2 + b
    hits = sum(1 for e in every if e["cache"] == "hit")
    misses = sum(1 for e in every if e["cache"] == "miss")
    # the image stage's hits are local replays: nothing they read would have come from the store
    saved = sum(e["bytes"] - e["bytes_from_store"] for e in every if e["cache"] == "hit" and e["stage"] != "image")
    assert (doc["hits"], doc["misses"]) == (hits, misses)
    assert abs(doc["hit_rate"] - hits / (hits + misses)) < 1e-9
    assert doc["bytes_saved"] == saved
    assert doc["bytes_from_peers"] == sum(e["bytes_from_peers"] for e in every)
    for got, rows in zip(doc["rows"], starts, strict=True):
        assert abs(got["startup_s"] - _startup(rows)) < 1e-6
    startups = [_startup(r) for r in starts]
    assert abs(doc["mean_startup_s"] - sum(startups) / 3) < 1e-6
    # the cold start was the slowest: older half (1 start) vs newer half (2 starts) is better
    assert doc["trend"].startswith("better")
    page = html.read_text()
    assert "<svg" in page and "job-b" in page and "ancient" not in page

    text = _cli("--store", store.uri, "--since", "2d")
    assert text.returncode == 0, text.stderr
    assert "1 job(s), 1 start(s), 4 node start(s)" in text.stdout


def test_last_is_the_job_with_the_latest_event(tmp_path: Path) -> None:
    """--last compares the events, not only the upload times, of the most recently uploaded jobs."""
    import os

    from bootseer_cli.report.load import last_job

    store = Store((tmp_path / "store").as_uri())
    rng = random.Random(8)
    now = time.time()
    _job(store, tmp_path, "late-events", now - 100, 2, False, rng)
    assert last_job(store) == "late-events"
    _job(store, tmp_path, "early-events", now - 5000, 2, False, rng)  # uploaded after, but its events are older
    assert last_job(store) == "late-events"
    for f in (tmp_path / "store" / default_domain() / "events" / "late-events").iterdir():
        os.utime(f, (now - 50, now - 50))
    assert last_job(store) == "late-events"
