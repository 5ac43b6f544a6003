"""The quickstart waits for its agents (issue 17, item 7): it never deletes the venv an agent runs from,
and reads the report only once every start's agent has uploaded its events."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def _run_dir(runs: Path, name: str, job: str) -> Path:
    d = runs / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"job": job, "node": "n", "rank": 0, "run": name}))
    (d / "agent.json").write_text("{}")
    return d


def _waiter(runs: Path, job: str, timeout_s: int = 30) -> subprocess.Popen[str]:
    script = f'. "{QUICKSTART}/wait-agents.sh"; wait_for_agents "$1" "$2" {timeout_s}; echo waited'
    return subprocess.Popen(["bash", "-c", script, "x", str(runs), job], stdout=subprocess.PIPE, text=True)


def test_waits_until_the_agent_is_done(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    d = _run_dir(runs, "r1", "qs-1")
    agent = subprocess.Popen(["sleep", "60"])
    (d / "agent.pid").write_text(str(agent.pid))
    _run_dir(runs, "r0", "another-job")  # another job's unfinished run: not waited for
    w = _waiter(runs, "qs-1")
    try:
        time.sleep(1.0)
        assert w.poll() is None, "returned while the agent was still running"
        (d / "agent.log").write_text("12:00:00 agent done\n")
        assert w.wait(timeout=10) == 0 and w.stdout is not None and w.stdout.read().strip() == "waited"
    finally:
        agent.kill()
        agent.wait()
        w.kill()


def test_an_agent_that_died_is_not_waited_for(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    d = _run_dir(runs, "r1", "qs-2")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (d / "agent.pid").write_text(str(dead.pid))
    t0 = time.monotonic()
    assert _waiter(runs, "qs-2").wait(timeout=20) == 0
    assert time.monotonic() - t0 < 5


def test_run_sh_waits_before_every_venv_removal_and_the_report() -> None:
    text = (QUICKSTART / "run.sh").read_text()
    assert "sleep 2" not in text, "a fixed sleep is a guess, not a wait"
    body = text[text.index("new_node() {") :]
    assert re.search(r"new_node\(\) \{\s*\n\s*agents_done\b[^\n]*\n\s*rm -rf \"\$venv\"", body)
    assert re.search(r"agents_done\b[^\n]*\n(?:echo[^\n]*\n)?bootseer report", text)
    assert subprocess.run(["bash", "-n", str(QUICKSTART / "run.sh")]).returncode == 0


def test_quickstart_scripts_are_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        pytest.fail("apt-get install shellcheck")
    r = subprocess.run(["shellcheck", "-x", "run.sh", "wait-agents.sh"], cwd=QUICKSTART, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
