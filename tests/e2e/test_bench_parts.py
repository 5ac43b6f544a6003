"""bench_e2e's breakdown of a start, read from events written by bootseer's own `events.record`.

The cold start's split (setup, capture + publish, what bootseer added before exec) is what issue 16's
goal is measured by: reading the event's stage facts from the wrong place printed the whole env
stage as one figure and counted the setup as bootseer's cost (found by the first `--quick` run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer_cli.events import RunInfo, record
from tests.benchmarks.bench_e2e import stage_parts
from tests.e2e.harness import Run, read_events


def test_cold_start_split_from_real_events(tmp_path: Path) -> None:
    info = RunInfo(job="j", node="n", rank=0, run="r", run_dir=tmp_path)
    t = 1000.0  # the node's first command
    record(info, "image", t + 1, t + 3, "miss", files=10)
    record(info, "env", t + 3, t + 13, "built", files=5, setup_s=7.5)
    record(info, "checkpoint", t + 13, t + 13.5, "miss")
    record(info, "bootseer", t + 0.5, t + 14, "done")
    record(info, "ready", t + 20, t + 20, "ok", local_rank=0)
    record(info, "hot-record", t + 21, t + 29, "built")
    run = Run(0, f"train: ready t={t + 20}\n", read_events(tmp_path / "events.jsonl"), t, t + 40)

    parts = stage_parts(run)

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
    info = RunInfo(job="j", node="n", rank=0, run="r", run_dir=tmp_path)
    t = 1000.0
    record(info, "env", t + 1, t + 6, "restored", bytes_from_peers=3_000_000, fetch_s=0.5, extract_s=4.25)
    record(info, "bootseer", t + 0.5, t + 6.5, "done")
    record(info, "ready", t + 9, t + 9, "ok", local_rank=0)
    run = Run(0, f"train: ready t={t + 9}\n", read_events(tmp_path / "events.jsonl"), t, t + 12)

    parts = stage_parts(run)

    assert parts["env restored"] == pytest.approx(5.0)
    assert parts["of it fetch"] == pytest.approx(0.5)
    assert parts["of it extract"] == pytest.approx(4.25)
    assert parts["of it from peers MB"] == pytest.approx(3.0)
