"""The launcher's first-step hook (`bootseer_cli.firststep`) on its own: it chains to the interpreter's
sitecustomize, stays out of the job (no torch, no bootseer_cli imported at start-up), survives a broken
chained sitecustomize and a vanished run directory, and records each process's first step once."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.events import RunInfo
from bootseer_cli.firststep import HOOK_DIR, launcher_pythonpath
from bootseer_cli.settings import ReportSettings, Settings

STEPS = """
import torch
opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
for _ in range(3):
    opt.zero_grad()
    opt.param_groups[0]["params"][0].sum().backward()
    opt.step()
print("trained")
"""


def _run_dir(tmp: Path) -> RunInfo:
    run_dir = tmp / "run"
    run_dir.mkdir(mode=0o700, parents=True)
    run = RunInfo(job="j", node="n", rank=3, run="r1", run_dir=run_dir)
    (run_dir / "run.json").write_text(json.dumps(run.as_dict()))
    return run


def _python(exe: str, code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "PYTHON"))}
    return subprocess.run([exe, "-c", code], env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_hook_dir_is_private_and_first_on_the_path(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    env = launcher_pythonpath(run, Settings(), {"PYTHONPATH": "/a:/b"})
    hook = run.run_dir / HOOK_DIR
    assert env == {"PYTHONPATH": f"{hook}:/a:/b"}
    assert (hook.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in hook.iterdir()) == ["_bootseer_first_step.py", "sitecustomize.py"]
    fresh = _run_dir(tmp_path / "2")  # no PYTHONPATH before: no empty element (the working directory)
    assert launcher_pythonpath(fresh, Settings(), {}) == {"PYTHONPATH": str(fresh.run_dir / HOOK_DIR)}
    off = dataclasses.replace(Settings(), report=ReportSettings(first_step=False))
    assert launcher_pythonpath(_run_dir(tmp_path / "3"), off, {}) == {}


def test_start_up_imports_nothing_of_the_job_and_chains_to_a_broken_sitecustomize(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\nraise ValueError('boom')\n")
    env = launcher_pythonpath(run, Settings(), {"PYTHONPATH": str(theirs)})
    code = "import os, sys; print(os.environ.get('THEIRS'), 'torch' in sys.modules, 'bootseer_cli' in sys.modules)"
    out = _python(sys.executable, code, env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ran", "False", "False"]
    assert "Error in sitecustomize" in out.stderr and "ValueError: boom" in out.stderr
    out = _python(sys.executable, STEPS, env, tmp_path)  # the hook was installed all the same
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["stage"] for line in (run.run_dir / "events.jsonl").read_text().splitlines()] == [
        "first_step"
    ]


def test_each_process_records_its_first_step_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = _run_dir(tmp_path)
    env = launcher_pythonpath(run, Settings(), {})
    env |= {"BOOTSEER_RUN_DIR": str(run.run_dir), "BOOTSEER_EXEC_TIME": "1000.5", "LOCAL_RANK": "1", "RANK": "9"}
    for _ in range(2):
        out = _python(sys.executable, STEPS, env, tmp_path)
        assert out.returncode == 0 and out.stdout.strip() == "trained", out.stderr
    events = [json.loads(line) for line in (run.run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["stage"] for e in events] == ["first_step", "first_step"]  # one per process, not per step
    e = events[0]
    assert (e["job"], e["node"], e["rank"], e["run"], e["start"]) == ("j", "n", 3, "r1", 1000.5)
    assert e["end"] > e["start"] and e["detail"] == "first optimizer step, local rank 1"
    assert json.loads(e["extra"])["local_rank"] == "1" and json.loads(e["extra"])["global_rank"] == "9"
    assert (run.run_dir / "ready").exists()


def test_a_vanished_run_dir_never_reaches_the_job(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = _run_dir(tmp_path)
    env = launcher_pythonpath(run, Settings(), {})
    (run.run_dir / "run.json").unlink()
    out = _python(sys.executable, STEPS, env, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "trained", out.stderr
    assert out.stderr == "" and not (run.run_dir / "events.jsonl").exists()


def test_an_interpreter_without_bootseer_chains_to_its_own_sitecustomize(tmp_path: Path) -> None:
    """Debian's interpreter: no bootseer installed, its own sitecustomize in /usr/lib (the apport hook)."""
    exe = "/usr/bin/python3"
    probe = "import sitecustomize; print(sitecustomize.__file__)"
    if not os.path.exists(exe) or "/usr/lib/" not in _python(exe, probe, {}, tmp_path).stdout:
        pytest.skip("no system interpreter with its own sitecustomize here")
    env = launcher_pythonpath(_run_dir(tmp_path), Settings(), {})
    code = (
        "import sys, importlib.util; chained = sys.modules['_bootseer_chained_sitecustomize']; "
        "print(chained.__file__.startswith('/usr/lib/'), importlib.util.find_spec('bootseer_cli') is None)"
    )
    out = _python(exe, code, env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
