"""The HTML report of a small one-node CPU job read back through headless Chromium (issue 17, item 7):
tick labels distinct at fine scales, no straggler star or red card for one node, no GPU time without
GPUs, and the header's first start equal to the starts table's first row."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bootseer_cli.report.svg import axis_ticks
from bootseer_cli.store.core import Store
from tests.report.support import chromium_screenshot, write_run

pytestmark = pytest.mark.integration


def _start(t: float) -> list[tuple[str, float, float, str, dict[str, object]]]:
    """A fast CPU start (no GPU hint): env 50 ms, exec 60 ms, ready at 130 ms."""
    return [
        ("env", t, t + 0.05, "restored", {"cache": "hit", "bytes": 1000, "bytes_from_store": 0}),
        ("bootseer", t, t + 0.06, "done", {}),
        ("ready", t + 0.06, t + 0.13, "ok", {"local_rank": "0"}),
    ]


class _Page(HTMLParser):
    """The SVG tick labels, the cards, the header line and the starts table's cells of a rendered DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.ticks: list[str] = []
        self.cards: list[str] = []
        self.sub = ""
        self.cells: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = a.get("class") or ""
        if tag == "text" and a.get("y") == "36.0" and a.get("text-anchor") == "middle":  # the axis row
            self._in = "tick"
        elif tag == "div" and cls.startswith("card"):
            self.cards.append(cls)
        elif tag == "div" and cls == "sub":
            self._in = "sub"
        elif tag == "td":
            self._in = "td"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("text", "div", "td"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "tick":
            self.ticks.append(data.strip())
        elif self._in == "sub":
            self.sub += data
        elif self._in == "td":
            self.cells.append(data.strip())


def _dump_dom(html: Path, tmp: Path) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Debian package chromium is required (apt-get install chromium)"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
    cmd += [f"--user-data-dir={tmp / 'profile'}", "--dump-dom", html.resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env={**os.environ, "HOME": str(tmp)})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_small_cpu_job_page_in_chromium(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    base = time.time() - 600
    for k, t in enumerate((base, base + 60, base + 120)):  # three starts of one node; the latest is shown
        write_run(store, tmp_path, "tiny", "cpu-box", 0, f"20260101T00000{k}-0000000{k}", _start(t))
    html = tmp_path / "tiny.html"
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "report", "--store", store.uri, "--job", "tiny", "--html", str(html)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    page = _Page()
    page.feed(_dump_dom(html, tmp_path))
    assert len(page.ticks) >= 5 and len(set(page.ticks)) == len(page.ticks), page.ticks
    assert "★" not in html.read_text(), "a one-node job has no straggler"
    assert "card bad" not in page.cards, "no red card when the verdict is 'nothing to fix'"
    assert "GPU" not in html.read_text(), "no GPU time for a job nothing said has GPUs"
    first = re.search(r"first start (\S+ \S+)", page.sub)
    assert first is not None, page.sub
    starts = [c for c in page.cells if re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", c)]
    assert len(starts) == 3, page.cells  # the starts table's "first start" column
    assert first.group(1) == starts[0], (page.sub, starts)
    png = tmp_path / "tiny.png"
    chromium_screenshot(html, png, tmp_path / "shot")
    assert png.stat().st_size > 5_000


@pytest.mark.parametrize("tmax", [0.013, 0.13, 0.6, 0.95, 1.3, 2.6, 13.0, 47.0, 130.0, 1300.0, 5400.0])
def test_tick_labels_are_distinct_at_every_scale(tmax: float) -> None:
    axis_max, ticks = axis_ticks(tmax)
    labels = [label for _, label in ticks]
    assert axis_max >= tmax and 4 <= len(labels) <= 12
    assert len(set(labels)) == len(labels), labels
    units = {label.split()[-1] for label in labels[1:]}
    assert len(units) == 1, labels  # one unit along an axis
