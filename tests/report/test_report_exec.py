"""The report of real `bootseer exec` runs: several concurrent "nodes" of one job on one S3 store, each
launcher calling `bootseer_cli.ready()` from two local ranks, the agent uploading the events. The
figures are checked against the events as the foundation loads them."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.store.core import open_store
from tests.report.recompute import assert_matches, expected
from tests.report.support import chromium_screenshot, colour_stats, node_events, write_run
from tests.support.events_table import load_table
from tests.support.s3server import S3Server

TRAIN = """
import os, subprocess, sys, time
import bootseer_cli
time.sleep(float(sys.argv[1]))
# a second local rank, as torchrun would start one per GPU
subprocess.run([sys.executable, "-c", "import bootseer_cli; bootseer_cli.ready()"],
               env={**os.environ, "LOCAL_RANK": "1"}, check=True)
os.environ["LOCAL_RANK"] = "0"
bootseer_cli.ready()
"""

CONFIG = """
[image]
record = "never"
"""


def _exec_nodes(tmp: Path, store: str, job: str, sleeps: dict[str, float]) -> None:
    procs = []
    for rank, (node, sleep) in enumerate(sleeps.items()):
        env = {**os.environ, "BOOTSEER_NODE": node, "NODE_RANK": str(rank), "BOOTSEER_JOB_ID": job}
        cmd = [sys.executable, "-m", "bootseer_cli", "exec", "-q", "--config", str(tmp / "bootseer.toml")]
        cmd += ["--store", store, "--", sys.executable, str(tmp / "train.py"), str(sleep), "--nproc-per-node=2"]
        procs.append(subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()


def _wait_uploaded(store: Any, job: str, nodes: int, ranks: int = 2, timeout: float = 120) -> list[dict[str, Any]]:
    """The agents upload again when the launcher has ended: wait until every node's ready events are in."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rows = load_table(store, job).to_pylist()
        except OSError:  # an agent replaced a file between the dataset's discovery and its read: again
            rows = []
        ready = {(r["node"], r["detail"]) for r in rows if r["stage"] == "ready"}
        if len(ready) >= nodes * ranks:
            return rows
        assert time.monotonic() < deadline, f"events of {job} not uploaded: {sorted(ready)}"
        time.sleep(0.3)


def _wait_agents_gone(marker: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if " agent " in cmdline and marker in cmdline:
                alive.append(pid)
        if not alive:
            return
        assert time.monotonic() < deadline, f"agents still running: {alive}"
        time.sleep(0.3)


def _report(store: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bootseer_cli", "report", "--store", store, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_report_of_real_exec_runs(s3_server: S3Server, tmp_path: Path, isolated_cache: Path) -> None:
    """On S3 (the file:// store is covered by the 1,000-node tests): exec → agent upload → report."""
    store_uri = s3_server.uri(f"t-{os.urandom(6).hex()}")
    (tmp_path / "bootseer.toml").write_text(CONFIG)
    (tmp_path / "train.py").write_text(TRAIN)
    store = open_store(store_uri)
    # an older job in the same store, so --last has to choose
    old = node_events(time.time() - 7200, random.Random(1))
    write_run(store, tmp_path, "job-old", "old-0", 0, "20260101T000000-00000000", old)
    sleeps = {"node-0": 0.2, "node-1": 0.4, "node-2": 0.3, "node-3": 1.0}
    _exec_nodes(tmp_path, store_uri, "job-x", sleeps)
    _wait_uploaded(store, "job-x", len(sleeps))
    _wait_agents_gone(str(isolated_cache))
    rows = _wait_uploaded(store, "job-x", len(sleeps))  # the agents' final uploads

    html, svg, png = tmp_path / "r.html", tmp_path / "r.svg", tmp_path / "r.png"
    out = _report(store_uri, "--last", "--json", "--html", str(html), "--svg", str(svg))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["job"] == "job-x"
    assert {s["stage"] for s in doc["stages"]} == {"image", "bootseer", "ready"}
    exp = expected(rows, gpus=2)
    assert_matches(doc, exp)
    # GPUs per node came from the launcher's command line, recorded by exec on the bootseer event
    assert doc["gpus_per_node"] == 2 and doc["gpus_source"] == "launcher (command line)"
    assert doc["ready_called"] == len(sleeps)
    image = next(s for s in doc["stages"] if s["stage"] == "image")
    assert image["misses"] == len(sleeps) and image["hits"] == 0  # record = "never": nothing to replay
    slowest = doc["slowest_node"]  # node-3 sleeps longest, but the events decide
    assert doc["verdict"].startswith("Fix first:")

    text = _report(store_uri, "--job", "job-x")
    assert text.returncode == 0, text.stderr
    assert f"({slowest})" in text.stdout and "launcher → ready()" in text.stdout

    root = ET.parse(svg).getroot()
    labels = [el.text or "" for el in root.iter("{http://www.w3.org/2000/svg}text")]
    assert sum(1 for t in labels if "· r" in t) == len(sleeps)  # one row per node
    assert any(t.startswith("★") and slowest in t for t in labels)
    chromium_screenshot(html, png, tmp_path)
    colours, inked = colour_stats(png)
    assert colours > 100, colours
    assert inked > 0.10, inked
