"""Bad input gives one line and a non-zero exit; bad data in the store is skipped or escaped, never trusted."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bootseer_cli import events
from bootseer_cli.store.core import Store
from tests.report.support import in_process, node_events, write_run


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bootseer_cli", "report", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _one_line_error(out: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("bootseer: error:")]
    assert len(lines) == 1 and words in lines[0], out.stderr


@pytest.fixture
def store(tmp_path: Path) -> Store:
    st = Store((tmp_path / "store").as_uri())
    rng = random.Random(2)
    for k in range(3):
        write_run(st, tmp_path, "job-a", f"n{k}", k, "r1", node_events(time.time() - 100, rng))
    return st


def test_empty_store(tmp_path: Path) -> None:
    _one_line_error(_report("--store", (tmp_path / "empty").as_uri(), "--last"), 1, "no stage events")


def test_bad_arguments(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return in_process(capsys, "--store", store.uri, *args)

    _one_line_error(run("--job", "nope"), 1, "no events for job 'nope'")
    _one_line_error(run("--job", "../x"), 2, "not a job name")
    _one_line_error(run("--job", "job-a", "--last"), 2, "--job and --last")
    _one_line_error(run("--since", "7x"), 2, "--since")
    _one_line_error(run("--since", "7d", "--svg", "x.svg"), 2, "--svg")
    _one_line_error(run("--start", "5"), 1, "no start 5")
    target = tmp_path / "missing-dir" / "r.html"
    _one_line_error(run("--html", str(target)), 1, "cannot write")
    assert not target.parent.exists()
    ok = run("--job", "job-a")
    assert ok.returncode == 0 and "job job-a · 3 node(s)" in ok.stdout


def test_damaged_file_is_skipped_loudly(store: Store) -> None:
    store.put_bytes("events/job-a/n9-broken.parquet", b"PAR1 not really parquet")
    out = _report("--store", store.uri, "--job", "job-a", "--json")
    assert out.returncode == 0, out.stderr
    assert "skipping unreadable event file events/job-a/n9-broken.parquet" in out.stderr
    assert '"nodes": 3' in out.stdout


def test_hostile_names_are_escaped(tmp_path: Path) -> None:
    """Node names come from the store: in the page and the SVG they are text, never markup."""
    st = Store((tmp_path / "store").as_uri())
    evil = '<script>alert(1)</script>&"x'
    now = time.time()
    rows = [
        {"job": "j", "run": "r", "node": evil, "rank": 0, "stage": "bootseer", "start": now, "end": now + 2},
        {"job": "j", "run": "r", "node": evil, "rank": 0, "stage": "ready", "start": now + 2, "end": now + 5},
        {"job": "j", "run": "r", "node": "ok", "rank": 1, "stage": "bootseer", "start": now, "end": now + 1},
    ]
    import pyarrow.parquet as pq

    pq.write_table(events.to_table(rows), tmp_path / "e.parquet")
    st.put_bytes("events/j/x.parquet", (tmp_path / "e.parquet").read_bytes())
    html, svg = tmp_path / "r.html", tmp_path / "r.svg"
    out = _report("--store", st.uri, "--job", "j", "--html", str(html), "--svg", str(svg))
    assert out.returncode == 0, out.stderr
    assert "<script>" not in html.read_text()
    labels = [el.text or "" for el in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert any(evil in t for t in labels)  # shown as text, exactly


def test_gpus_per_node_from_the_config(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """[report] gpus_per_node counts only when set: unset, the launcher's own count (8 here) is used."""
    plain = in_process(capsys, "--store", store.uri, "--job", "job-a")
    assert plain.returncode == 0 and "8 GPUs [launcher (command line)]" in plain.stdout
    toml = tmp_path / "bootseer.toml"
    toml.write_text("[report]\ngpus_per_node = 3\n")
    configured = in_process(capsys, "--store", store.uri, "--job", "job-a", "--config", str(toml))
    assert configured.returncode == 0, configured.stderr
    assert "3 GPUs [[report] gpus_per_node]" in configured.stdout
    flag = in_process(capsys, "--store", store.uri, "--job", "job-a", "--config", str(toml), "--gpus-per-node", "2")
    assert "2 GPUs [--gpus-per-node]" in flag.stdout
