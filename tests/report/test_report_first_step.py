"""Issue 44 item 3: a real training program that never calls `bootseer_cli.ready()` is measured to its
first optimizer step. `bootseer exec` runs a torch program (the test venv's interpreter, which stands
for the job's: the hook it gets is stdlib-only code); the agent uploads the events to a local store;
`bootseer report` must count the time after exec's hand-over up to that step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.store.core import open_store
from tests.support.events_table import load_table

pytest.importorskip("torch")

# Data loading before the first step (a sleep), then three real SGD steps; the program says when its
# first step began and ended, and whether anything imported bootseer_cli into it.
TRAIN = """
import json, os, sys, time
import torch
time.sleep(1.0)  # "data loading": after exec, before the first step
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
marks = {}
for step in range(3):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    if step == 0:
        marks["before"] = time.time()
    opt.step()
    if step == 0:
        marks["after"] = time.time()
marks["bootseer_imported"] = "bootseer_cli" in sys.modules
marks["pid"] = os.getpid()
with open(sys.argv[1], "w") as f:
    json.dump(marks, f)
"""

# The interpreter's own sitecustomize (here on the user's PYTHONPATH): it must still run.
THEIR_SITECUSTOMIZE = """
import os
with open(os.environ["CHAINED_MARK"], "a") as f:
    f.write(f"{os.getpid()}\\n")
"""


def _exec(tmp: Path, store: str, job: str, config: str = "") -> dict[str, Any]:
    (tmp / "bootseer.toml").write_text('[image]\nrecord = "never"\n' + config)
    (tmp / "train.py").write_text(TRAIN)
    theirs = tmp / "theirs"
    theirs.mkdir(exist_ok=True)
    (theirs / "sitecustomize.py").write_text(THEIR_SITECUSTOMIZE)
    env = {**os.environ, "BOOTSEER_JOB_ID": job, "PYTHONPATH": str(theirs), "CHAINED_MARK": str(tmp / "chained")}
    marks = tmp / "marks.json"
    cmd = [sys.executable, "-m", "bootseer_cli", "exec", "-q", "--config", str(tmp / "bootseer.toml")]
    cmd += ["--store", store, "--", sys.executable, str(tmp / "train.py"), str(marks)]
    done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(marks.read_text())


def _uploaded(store: Any, job: str, stage: str, timeout: float = 120) -> list[dict[str, Any]]:
    """The agent uploads again once the launcher has ended: wait for the `stage` event to arrive."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rows = load_table(store, job).to_pylist()
        except OSError:  # the agent replaced the file between listing and reading
            rows = []
        if any(r["stage"] == stage for r in rows):
            return rows
        if time.monotonic() > deadline:
            return rows
        time.sleep(0.3)


def _report(store: str, job: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bootseer_cli", "report", "--store", store, "--job", job, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_report_counts_to_the_first_optimizer_step_without_ready(tmp_path: Path, isolated_cache: Path) -> None:
    store_uri = (tmp_path / "store").as_uri()
    marks = _exec(tmp_path, store_uri, "job-fs")
    assert marks["bootseer_imported"] is False  # the hook is standalone: nothing of bootseer in the job
    # the interpreter's own sitecustomize still ran, in the training process itself
    assert str(marks["pid"]) in (tmp_path / "chained").read_text().split()

    rows = _uploaded(open_store(store_uri), "job-fs", "first_step")
    by_stage = {r["stage"]: r for r in rows}
    assert "first_step" in by_stage, sorted(by_stage)
    first, total = by_stage["first_step"], by_stage["bootseer"]
    # order: exec hands over, the program loads its data (1 s), then steps; the event is the step's end
    # (the span starts at BOOTSEER_EXEC_TIME, set in the launcher's environment just before exec's own event ends)
    assert total["start"] <= first["start"] <= total["end"] < first["end"]
    assert marks["before"] <= first["end"] <= marks["after"]
    assert first["end"] - total["end"] >= 1.0
    assert json.loads(first["extra"])["pid"] == marks["pid"]
    (run_dir,) = [p.parent for p in isolated_cache.rglob(f"runs/{first['run']}/run.json")]
    assert (run_dir / "ready").exists()  # the agent's tasks end their wait at the first step too

    out = _report(store_uri, "job-fs", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["startup_s"] == pytest.approx(first["end"] - total["start"], abs=1e-3)
    assert doc["first_step_detected"] == 1 and doc["ready_called"] == 0
    assert [s["stage"] for s in doc["stages"]][-2:] == ["bootseer", "first_step"]
    assert "[p2p]" not in json.dumps(doc)  # one node, local store: no P2P advice
    text = _report(store_uri, "job-fs")
    assert text.returncode == 0, text.stderr
    assert "launcher → first step" in text.stdout and "neither called" not in text.stdout


@pytest.mark.integration
def test_first_step_detection_can_be_turned_off(tmp_path: Path, isolated_cache: Path) -> None:
    store_uri = (tmp_path / "store").as_uri()
    marks = _exec(tmp_path, store_uri, "job-off", "[report]\nfirst_step = false\n")
    assert str(marks["pid"]) in (tmp_path / "chained").read_text().split()  # their PYTHONPATH untouched
    (run_dir,) = [p.parent for p in isolated_cache.rglob("runs/*/run.json")]
    stages = [json.loads(line)["stage"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert "bootseer" in stages and "first_step" not in stages
    assert not (run_dir / "pyhook").exists() and not (run_dir / "ready").exists()


# DDP on gloo under torchrun, two local ranks; after the first step each rank trains on until the
# test says so, as a long job would.
TRAIN_DDP = """
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
    deadline = time.time() + 420  # far past the test's own deadline: only the test's "go" ends it
    while step == 0 and not os.path.exists(sys.argv[1]) and time.time() < deadline:
        time.sleep(0.1)
dist.destroy_process_group()
"""


@pytest.mark.integration
def test_torchrun_ranks_first_steps_reach_the_report_while_the_job_trains(tmp_path: Path, isolated_cache: Path) -> None:
    store_uri = (tmp_path / "store").as_uri()
    store = open_store(store_uri)
    (tmp_path / "bootseer.toml").write_text('[image]\nrecord = "never"\n')
    (tmp_path / "train.py").write_text(TRAIN_DDP)
    go = tmp_path / "go"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    cmd = [sys.executable, "-m", "bootseer_cli", "exec", "-q", "--config", str(tmp_path / "bootseer.toml")]
    cmd += ["--store", store_uri, "--", torchrun, "--standalone", "--nproc-per-node=2", "train.py", str(go)]
    env = {**os.environ, "BOOTSEER_JOB_ID": "job-ddp"}
    job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 210
        ranks: set[str] = set()
        while len(ranks) < 2:  # both ranks' first steps, uploaded by the agent while the job trains on
            assert job.poll() is None, job.communicate()[1].decode()
            assert time.monotonic() < deadline, f"first steps not uploaded during the run: {ranks}"
            time.sleep(0.5)
            try:
                rows = load_table(store, "job-ddp").to_pylist()
            except OSError:
                continue
            ranks = {json.loads(r["extra"])["local_rank"] for r in rows if r["stage"] == "first_step"}
        assert job.poll() is None  # seen while the job still trains
    finally:
        go.touch()
        _, err = job.communicate(timeout=480)
    assert job.returncode == 0, err.decode()

    out = _report(store_uri, "job-ddp", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    total = next(r for r in rows if r["stage"] == "bootseer")
    last_step = max(r["end"] for r in rows if r["stage"] == "first_step")
    assert doc["startup_s"] == pytest.approx(last_step - total["start"], abs=1e-3)
    assert (doc["first_step_detected"], doc["ready_called"]) == (1, 0)
    assert (doc["gpus_per_node"], doc["gpus_source"]) == (2, "launcher (command line)")
