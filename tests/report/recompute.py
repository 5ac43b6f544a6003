"""An independent recomputation of a job report's figures from raw event dicts (no bootseer_cli.report code)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any


def q(values: list[float], p: int) -> float:
    """The p-th percentile, linear between order statistics."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def latest_runs(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """node -> the events of its latest run (by the start of its `bootseer` event)."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        runs[(r["node"], r["run"])].append(r)
    best: dict[str, tuple[float, list[dict[str, Any]]]] = {}
    for (node, _), evs in runs.items():
        start = min(e["start"] for e in evs if e["stage"] == "bootseer")
        if node not in best or start > best[node][0]:
            best[node] = (start, evs)
    return {node: evs for node, (_, evs) in best.items()}


def expected(rows: list[dict[str, Any]], gpus: int) -> dict[str, Any]:
    nodes = latest_runs(rows)
    start = {n: min(e["start"] for e in evs if e["stage"] == "bootseer") for n, evs in nodes.items()}
    ready = {}
    for n, evs in nodes.items():
        # ready(), else the detected first optimizer step, else exec's hand-over
        readies = [e["end"] for e in evs if e["stage"] == "ready"]
        readies = readies or [e["end"] for e in evs if e["stage"] == "first_step"]
        ready[n] = max(readies) if readies else max(e["end"] for e in evs if e["stage"] == "bootseer")
    t0 = min(start.values())
    slowest = max(ready, key=lambda n: ready[n])
    startup = ready[slowest] - t0
    stages: dict[str, dict[str, Any]] = {}
    names = {e["stage"] for evs in nodes.values() for e in evs}
    for stage in names:
        dur: dict[str, float] = {}
        hits = misses = from_store = from_peers = 0
        for n, evs in nodes.items():
            mine = [e for e in evs if e["stage"] == stage]
            if not mine:
                continue
            dur[n] = max(e["end"] for e in mine) - min(e["start"] for e in mine)
            hits += sum(1 for e in mine if e["cache"] == "hit")
            misses += sum(1 for e in mine if e["cache"] == "miss")
            from_store += sum(e["bytes_from_store"] for e in mine)
            from_peers += sum(e["bytes_from_peers"] for e in mine)
        values = list(dur.values())
        p50 = q(values, 50)
        worst = max(dur, key=lambda n: dur[n])
        # the job's start had `worst` taken the median in this stage
        others = max((ready[n] for n in ready if n != worst), default=float("-inf"))
        cost = ready[slowest] - max(others, ready[worst] - max(0.0, dur[worst] - p50))
        stages[stage] = {
            "nodes": len(values),
            "p50_s": p50,
            "p90_s": q(values, 90),
            "max_s": max(values),
            "hits": hits,
            "misses": misses,
            "bytes_from_store": from_store,
            "bytes_from_peers": from_peers,
            "straggler": worst,
            "straggler_cost_s": cost,
        }
    return {
        "nodes": len(nodes),
        "startup_s": startup,
        "slowest_node": slowest,
        "median_ready_s": q([r - t0 for r in ready.values()], 50),
        "gpu_hours_wasted": len(nodes) * gpus * startup / 3600.0,
        "stages": stages,
    }


def assert_matches(report: dict[str, Any], exp: dict[str, Any], tol: float = 1e-6) -> None:
    assert report["nodes"] == exp["nodes"]
    assert report["slowest_node"] == exp["slowest_node"]
    for key in ("startup_s", "median_ready_s", "gpu_hours_wasted"):
        assert abs(report[key] - exp[key]) <= tol * max(1.0, abs(exp[key])), (key, report[key], exp[key])
    got = {s["stage"]: s for s in report["stages"]}
    assert set(got) == set(exp["stages"])
    for stage, e in exp["stages"].items():
        g = got[stage]
        for key, value in e.items():
            if isinstance(value, float):
                assert abs(g[key] - value) <= tol * max(1.0, abs(value)), (stage, key, g[key], value)
            else:
                assert g[key] == value, (stage, key, g[key], value)
