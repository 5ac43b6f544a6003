"""Job identity: every node of one job reports under the launcher's or the scheduler's job id, and starts
that nothing names are never merged (issue 17, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.events import RunInfo
from bootseer_cli.launcher import job_id_hint
from bootseer_cli.store.core import open_store
from tests.support.events_table import load_table


@pytest.mark.parametrize(
    ("command", "environ", "expected"),
    [
        (["torchrun", "--nnodes=2", "--rdzv-id=myjob", "train.py"], {}, ("myjob", "command line")),
        (["torchrun", "--rdzv_id", "j7", "train.py", "--lr", "1"], {}, ("j7", "command line")),
        (["python", "-m", "torch.distributed.run", "--rdzv-id", "m", "x.py"], {}, ("m", "command line")),
        (["torchrun", "--rdzv-id=none", "x.py"], {"SLURM_JOB_ID": "4242"}, ("4242", "$SLURM_JOB_ID")),
        (["torchrun", "--rdzv-id=myjob"], {"BOOTSEER_JOB_ID": "set"}, ("set", "$BOOTSEER_JOB_ID")),
        (["torchrun", "x.py"], {"PET_RDZV_ID": "pet"}, ("pet", "$PET_RDZV_ID")),
        (["deepspeed", "--num_gpus=8", "x.py"], {"SLURM_JOB_ID": "99"}, ("99", "$SLURM_JOB_ID")),
        (["accelerate", "launch", "x.py"], {"TORCHELASTIC_RUN_ID": "te"}, ("te", "$TORCHELASTIC_RUN_ID")),
        (["accelerate", "launch", "x.py"], {"LSB_JOBID": "lsf1"}, ("lsf1", "$LSB_JOBID")),
        (["torchrun", "x.py"], {}, None),
        (["torchrun", "--rdzv-id"], {"TORCHELASTIC_RUN_ID": "none"}, None),
    ],
)
def test_job_id_hint(command: list[str], environ: dict[str, str], expected: object) -> None:
    assert job_id_hint(command, environ) == expected


def test_generated_ids_are_unique_per_start(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PET_RDZV_ID", "LSB_JOBID", "PBS_JOBID", "FLUX_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    jobs = {RunInfo.new(["torchrun", "x.py"]).job for _ in range(20)}  # all within one second
    assert len(jobs) == 20 and all(j.startswith("job-") for j in jobs)
    assert RunInfo.new(["torchrun", "--rdzv-id=abc", "x.py"]).job == "abc"


def _start(tmp_path: Path, node: str, *launcher_args: str) -> None:
    """`bootseer exec -- torchrun …` with a stand-in torchrun on PATH (the parsing reads the real argv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    torchrun = bin_dir / "torchrun"
    torchrun.write_text("#!/bin/sh\nexit 0\n")
    torchrun.chmod(0o755)
    # One cheap stage, so that the start has a run and reports events: an env setup over an empty root.
    (tmp_path / "root").mkdir(exist_ok=True)
    (tmp_path / "bootseer.toml").write_text(f'[env]\nsetup = ["true"]\nroots = ["{tmp_path / "root"}"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "BOOTSEER_NODE": node, "BOOTSEER_EXEC_AGENT": "0"}
    cmd = [sys.executable, "-m", "bootseer_cli", "exec", "--", "torchrun", *launcher_args]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_two_nodes_of_one_torchrun_job_are_one_job(tmp_path: Path) -> None:
    for node in ("node-a", "node-b"):
        _start(tmp_path, node, "--nnodes=2", "--rdzv-id=myjob", "train.py")
    store = open_store(None)
    rows = load_table(store, "myjob").to_pylist()
    assert {r["node"] for r in rows} == {"node-a", "node-b"}
    # Two starts that nothing names: two jobs, even in the same second.
    _start(tmp_path, "node-c", "train.py")
    _start(tmp_path, "node-c", "train.py")
    jobs = {Path(d.rstrip("/")).name for d in store.list_dirs("events")}
    assert len(jobs - {"myjob"}) == 2, jobs
