"""Control characters from the store never reach the terminal, and never make the SVG or the page invalid.

Node names, reasons, job ids and details are written by any job that can write the store: a node name
with ESC [2J cleared the screen of whoever read the report, and one with BEL made the SVG unparseable."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from bootseer_cli import events
from bootseer_cli.report.svg import esc
from bootseer_cli.report.text import terminal_safe
from bootseer_cli.store.core import Store

EVIL_NODE = "node\x1b[2J\x07\x9b31m\u202eevil"
EVIL_REASON = "slow\x1b]0;owned\x07 \x00\x0b"
JOB = "j"  # the job id is the directory of its events: not free text


def _store(tmp_path: Path) -> Store:
    import pyarrow.parquet as pq

    st = Store((tmp_path / "store").as_uri())
    now = time.time() - 60
    rows = []
    for rank, node, slow in ((0, EVIL_NODE, 9.0), (1, "ok1", 1.0), (2, "ok2", 1.2)):
        rows += [
            {"job": JOB, "run": "r", "node": node, "rank": rank, "stage": "image", "start": now, "end": now + slow,
             "outcome": "miss", "reason": EVIL_REASON, "detail": EVIL_REASON},
            {"job": JOB, "run": "r", "node": node, "rank": rank, "stage": "bootseer", "start": now,
             "end": now + slow + 0.1, "reason": EVIL_REASON},
            {"job": JOB, "run": "r", "node": node, "rank": rank, "stage": "ready", "start": now + slow + 0.1,
             "end": now + slow + 2},
        ]  # fmt: skip
    pq.write_table(events.to_table(rows), tmp_path / "e.parquet")
    st.put_bytes("events/j/x.parquet", (tmp_path / "e.parquet").read_bytes())
    return st


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bootseer_cli", "report", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c == "\u202e"]


def test_the_text_report_sends_no_control_character_to_the_terminal(tmp_path: Path) -> None:
    st = _store(tmp_path)
    out = _report("--store", st.uri, "--job", JOB)
    assert out.returncode == 0, out.stderr
    assert "evil" in out.stdout  # the slow node is named
    assert _controls(out.stdout) == [], repr(out.stdout)
    assert _controls(out.stderr) == [], repr(out.stderr)
    assert "\\x1b[2J" in out.stdout  # shown, written out: the reader sees what the store holds


def test_the_svg_and_the_page_stay_well_formed(tmp_path: Path) -> None:
    st = _store(tmp_path)
    html, svg = tmp_path / "r.html", tmp_path / "r.svg"
    out = _report("--store", st.uri, "--job", JOB, "--html", str(html), "--svg", str(svg))
    assert out.returncode == 0, out.stderr
    root = ET.parse(svg).getroot()  # before: "not well-formed (invalid token)"
    labels = " ".join(el.text or "" for el in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "node" in labels and "evil" in labels
    page = html.read_text()
    assert "\x1b" not in page and "\x07" not in page and "\x00" not in page


def test_the_escapes_themselves() -> None:
    assert terminal_safe("a\x1b[2Jb\x07\nc\x9bd\u202ee") == "a\\x1b[2Jb\\x07\nc\\x9bd\\u202ee"
    assert terminal_safe("plain ünïcode ✓") == "plain ünïcode ✓"
    hostile = "x" + "".join(map(chr, range(0x20))) + "\ud800\ufffe\x85"
    assert ET.fromstring("<t>" + esc(hostile) + "</t>").text.startswith("x\ufffd")
