"""The 1,000-node job: every figure against an independent recomputation, a bounded render time, the
SVG parses and the HTML page renders in headless Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bootseer_cli.report import analysis, load
from bootseer_cli.report.page import job_html
from bootseer_cli.report.svg import GROUP_ROWS
from bootseer_cli.store.core import Store
from bootseer_cli.units import fmt_seconds
from tests.report.conftest import BIG_NODES, RESTARTED, STRAGGLER, BigJob
from tests.report.recompute import assert_matches, expected
from tests.report.support import chromium_screenshot, colour_stats, in_process

SVG = "{http://www.w3.org/2000/svg}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "report", *args], capture_output=True, text=True, timeout=120
    )


def test_figures_match_the_events(big_job: BigJob) -> None:
    t = time.monotonic()
    rows = load.load_job(Store(big_job.uri), big_job.job)
    report = analysis.analyze_job(rows, big_job.job)
    page = job_html(report)
    took = time.monotonic() - t
    assert took < 15, f"1,000-node report took {took:.1f} s"  # ~2 s on an idle 2-core machine
    assert len(rows) == len(big_job.rows)
    doc = report.to_json()
    assert_matches(doc, expected(big_job.rows, gpus=8))
    assert doc["nodes"] == BIG_NODES
    assert doc["slowest_node"] == STRAGGLER
    assert doc["gpus_per_node"] == 8 and doc["gpus_source"] == "launcher (command line)"
    # the restarted nodes: two starts in the job, the report shows the latest
    assert [a["attempt"] for a in doc["attempts"]] == [1, 2]
    assert [a["nodes"] for a in doc["attempts"]] == [len(RESTARTED), BIG_NODES]
    assert all(r["attempt"] == 2 for r in doc["rows"] if r["node"] in RESTARTED)
    ckpt = next(s for s in doc["stages"] if s["stage"] == "checkpoint")
    assert ckpt["straggler"] == STRAGGLER and ckpt["straggler_cost_s"] > 10
    assert STRAGGLER in doc["verdict"] and "checkpoint" in doc["verdict"]
    assert STRAGGLER in page and "★" in page


def test_earlier_start_of_a_restarted_job(big_job: BigJob) -> None:
    rows = load.load_job(Store(big_job.uri), big_job.job)
    first = analysis.analyze_job(rows, big_job.job, attempt=1).to_json()
    early = [r for r in big_job.rows if r["run"] == "20260101T000000-00000000"]
    assert_matches(first, expected(early, gpus=8))
    assert first["nodes"] == len(RESTARTED)
    with pytest.raises(Exception, match="no start 3"):
        analysis.analyze_job(rows, big_job.job, attempt=3)


@pytest.mark.integration
def test_cli_json_html_svg_and_screenshot(big_job: BigJob, tmp_path: Path) -> None:
    html, svg, png = tmp_path / "big.html", tmp_path / "big.svg", tmp_path / "big.png"
    t = time.monotonic()
    out = _cli("--store", big_job.uri, "--job", big_job.job, "--json", "--html", str(html), "--svg", str(svg))
    took = time.monotonic() - t
    assert out.returncode == 0, out.stderr
    assert took < 30, f"bootseer report over 1,000 nodes took {took:.1f} s"
    doc = json.loads(out.stdout)
    assert_matches(doc, expected(big_job.rows, gpus=8))
    assert doc["gpu_hours_wasted"] == pytest.approx(BIG_NODES * 8 * doc["startup_s"] / 3600)

    root = ET.parse(svg).getroot()
    assert root.tag == f"{SVG}svg"
    labels = [el.text or "" for el in root.iter(f"{SVG}text")]
    # aggregated: 32 group rows plus the 10 slowest nodes one by one, the straggler starred
    assert sum(1 for text in labels if text.startswith("#") and "·" in text) == GROUP_ROWS
    assert any(text.startswith("★") and STRAGGLER in text for text in labels)
    assert len(list(root.iter(f"{SVG}rect"))) < 2000  # aggregated, not one row per node

    page = html.read_text()
    assert "<svg" in page and "src=" not in page and "<link" not in page  # self-contained
    chromium_screenshot(html, png, tmp_path)
    assert png.stat().st_size > 20_000
    colours, inked = colour_stats(png)
    assert colours > 100, colours
    assert inked > 0.10, inked


def test_text_report(big_job: BigJob, capsys: pytest.CaptureFixture[str]) -> None:
    out = in_process(capsys, "--store", big_job.uri, "--job", big_job.job, "--gpus-per-node", "4")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    exp = expected(big_job.rows, gpus=4)
    assert f"startup {fmt_seconds(exp['startup_s'])} to the slowest node's ready ({STRAGGLER})" in text
    assert "4 GPUs [--gpus-per-node]" in text
    assert f"{exp['gpu_hours_wasted']:.2f} GPU-hours" in text
    for stage in ("image", "env", "checkpoint", "bootseer (exec total)", "launcher → ready()"):
        assert any(line.startswith(stage) for line in text.splitlines()), stage
    assert text.strip().splitlines()[-1].startswith("Fix first:")
