"""Report wording (issue 29 item 10): "saved" counts only bytes a hit did not fetch from the store (a
hot-block replay's local reads are not savings), one node is "1 node", and the page's startup card
names the start it shows, not "the job's first start" when the second is shown."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from bootseer_cli.store.core import Store
from tests.report.support import node_events, write_run


def _report(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bootseer_cli", "report", "--store", store.uri, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def test_saved_bytes_leave_out_local_replays(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    t = time.time() - 3600
    evs = node_events(t, random.Random(1))  # image replay 200 MiB (local), env 300 MiB restored, …
    rows = write_run(store, tmp_path, "job-a", "n0", 0, "run-1", evs)
    env = next(e for e in rows if e["stage"] == "env")
    doc = json.loads(_report(store, "--since", "1d", "--json").stdout)
    assert doc["bytes_saved"] == env["bytes"] - env["bytes_from_store"], doc["bytes_saved"]


def test_one_node_is_one_node_and_the_card_names_the_shown_start(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    base = time.time() - 600
    for k, t in enumerate((base, base + 120)):  # two starts of a one-node job with 8 GPUs; the second is shown
        write_run(store, tmp_path, "solo", "box", 0, f"run-{k}", node_events(t, random.Random(k), gpus=8))
    text = _report(store, "--job", "solo").stdout
    assert "1 nodes" not in text and "(1 node × 8 GPUs" in text, text
    html = tmp_path / "solo.html"
    _report(store, "--job", "solo", "--html", str(html))
    page = html.read_text()
    assert "1 nodes" not in page, [ln for ln in page.splitlines() if "1 nodes" in ln]
    assert "job&#x27;s first start" not in page and "job's first start" not in page
    assert "startup: this start" in page or "startup: start 2" in page, "the card does not name the shown start"
