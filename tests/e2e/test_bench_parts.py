"""bench_e2e's breakdown of a start, read from events written by bootseer's own `events.record`.

The cold start's split (setup, capture + publish, what bootseer added before exec) is what issue 16's
goal is measured by: reading the event's stage facts from the wrong place printed the whole env
stage as one figure and counted the setup as bootseer's cost (found by the first `--quick` run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.events import RunInfo, record
from tests.benchmarks.bench_e2e import stage_parts
from tests.e2e.harness import Run, read_events

T = 1000.0  # the node's first command


def _parts(tmp_path: Path, events: list[tuple[str, float, float, str, dict[str, Any]]], ended: float) -> dict:
    """`stage_parts` of a start whose node recorded `events` (stage, start, end, outcome, facts;
    times after T) through bootseer's own `events.record`; rank 0 ready where the `ready` event is."""
    info = RunInfo(job="j", node="n", rank=0, run="r", run_dir=tmp_path)
    for stage, start, end, outcome, facts in events:
        record(info, stage, T + start, T + end, outcome, **facts)
    ready = next(T + start for stage, start, *_ in events if stage == "ready")
    return stage_parts(Run(0, f"train: ready t={ready}\n", read_events(tmp_path / "events.jsonl"), T, T + ended))


def test_cold_start_split_from_real_events(tmp_path: Path) -> None:
    events = [
        ("image", 1, 3, "miss", {"files": 10}),
        ("env", 3, 13, "built", {"files": 5, "setup_s": 7.5}),
        ("checkpoint", 13, 13.5, "miss", {}),
        ("bootseer", 0.5, 14, "done", {}),
        ("ready", 20, 20, "ok", {"local_rank": 0}),
        ("hot-record", 21, 29, "built", {}),
    ]

    parts = _parts(tmp_path, events, ended=40)

    assert parts["setup"] == pytest.approx(7.5)
    assert parts["capture + publish"] == pytest.approx(2.5)
    assert parts["hot-block record (evict)"] == pytest.approx(2.0)
    assert parts["checkpoint"] == pytest.approx(0.5)
    assert parts["exec overhead"] == pytest.approx(14 - 12.5)  # before exec, outside the stages
    assert parts["launcher to first step"] == pytest.approx(6.0)
    assert parts["hot-record (agent, behind the launcher)"] == pytest.approx(8.0)
    assert "ready (agent, behind the launcher)" not in parts


def test_a_restores_split_from_real_events(tmp_path: Path) -> None:
    """A restore is the env stage's one figure, and of it the blob's fetch and extraction (the stage's
    own facts) and the MB from peers: the e2e restore took 5-10 s on a disk where the benchmark of the
    restore alone took 1.5 s, and the split is what told the disk from the delivery."""
    events = [
        ("env", 1, 6, "restored", {"bytes_from_peers": 3_000_000, "fetch_s": 0.5, "extract_s": 4.25}),
        ("bootseer", 0.5, 6.5, "done", {}),
        ("ready", 9, 9, "ok", {"local_rank": 0}),
    ]

    parts = _parts(tmp_path, events, ended=12)

    assert parts["env restored"] == pytest.approx(5.0)
    assert parts["of it fetch"] == pytest.approx(0.5)
    assert parts["of it extract"] == pytest.approx(4.25)
    assert parts["of it from peers MB"] == pytest.approx(3.0)
