"""Declare a capability once (issue 24): a toy fifth capability, a package (`toycap/`) and one table row,
shows in exec's summary line, `--skip`, `bootseer config`, the report's stage table and picture, and gc's
keep set. Nothing else in bootseer changes for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tomllib

from bootseer_cli import capabilities, gc
from bootseer_cli.report import svg
from bootseer_cli.store.core import Store
from tests.foundation import toycap

ROOT = Path(__file__).resolve().parents[2]


def toy(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`bootseer ARGS` with the toy's row in the table (and nothing else told about it)."""
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", **env}
    cmd = [sys.executable, "-m", "tests.foundation.toycap", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, env=environ)


@pytest.fixture
def with_toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table as the toy's process sees it (`toycap.register()`), for what the test expects."""
    monkeypatch.setattr(capabilities, "CAPABILITIES", [*capabilities.CAPABILITIES, toycap.ROW])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    store = (tmp_path / "store").as_uri()
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store}"\n[exec]\nagent = false\n[toy]\nenabled = true\ngreeting = "hi there"\n'
    )
    return tmp_path


@pytest.mark.usefixtures("with_toy")
def test_exec_runs_it_and_skip_knows_it(project: Path) -> None:
    r = toy(["exec", "--", "sh", "-c", "exit 7"], project, BOOTSEER_JOB_ID="toyjob")
    assert r.returncode == 7, r.stderr
    assert "| toy " in r.stderr and "toy says hi there" in r.stderr  # the summary line
    r = toy(["exec", "--skip", "toy", "--", "true"], project)
    assert r.returncode == 0 and "toy says" not in r.stderr
    r = toy(["exec", "--skip", "toi", "--", "true"], project)
    assert r.returncode == 2 and "did you mean 'toy'?" in r.stderr
    assert f"stages: {', '.join(capabilities.stage_names())})" in r.stderr  # the table's, the toy's last
    r = toy(["exec", "--help"], project)
    assert "toy" in r.stdout  # the --skip help lists the table's stages


def test_config_shows_and_checks_its_section(project: Path) -> None:
    r = toy(["config"], project, BOOTSEER_TOY_GREETING="from env")
    assert r.returncode == 0, r.stderr
    doc = tomllib.loads(r.stdout)
    assert doc["toy"] == {"enabled": True, "greeting": "from env"}
    (project / "bootseer.toml").write_text("[toy]\nenabled = 3\n")
    r = toy(["config"], project)
    assert r.returncode == 2 and "[toy] enabled must be true or false" in r.stderr


@pytest.mark.usefixtures("with_toy")
def test_the_report_lists_and_draws_its_stage(project: Path) -> None:
    assert toy(["exec", "--", "true"], project, BOOTSEER_JOB_ID="toyjob").returncode == 0
    r = toy(["report", "--job", "toyjob", "--svg", "timeline.svg"], project)
    assert r.returncode == 0, r.stderr
    assert "toy (the fifth capability)" in r.stdout
    # The picture draws the toy as an exec stage: a bar of the height of the row's bars, in the colour the
    # table's order gives it, not the thin line under the bars that work behind the launcher gets.
    ns = "{http://www.w3.org/2000/svg}"
    rects = ET.parse(project / "timeline.svg").getroot().iter(f"{ns}rect")
    tips = {r.findtext(f"{ns}title") or "": r for r in rects}
    toy_bar = next(rect for tip, rect in tips.items() if " toy: " in tip)
    total = next(rect for tip, rect in tips.items() if " bootseer: " in tip)
    assert float(toy_bar.get("height", 0)) >= float(total.get("height", 0)) - 6  # a bar, not a 3-px line
    assert toy_bar.get("fill") == svg.color("toy", []) != svg.OTHER_COLORS[0]


def test_gc_keeps_what_its_refs_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(b"what the toy restores")
    store.write_ref("toy", "k1", {"blob": digest, "created": 1e9})
    policy = gc.Policy(keep_days=1e6, grace_s=0)  # the ref is young enough; the blob is past the grace
    assert digest in {d.name for d in gc.plan(store, policy).doomed}  # premise: unknown kind, orphan blob
    monkeypatch.setattr(capabilities, "CAPABILITIES", [*capabilities.CAPABILITIES, toycap.ROW])
    assert digest not in {d.name for d in gc.plan(store, policy).doomed}
    old = gc.Policy(keep_days=0, grace_s=0)
    assert {("toy", "k1"), ("blob", digest)} <= {(d.kind, d.name) for d in gc.plan(store, old).doomed}
    json.dumps([d.as_json() for d in gc.plan(store, old).doomed])


def test_gc_names_what_it_would_remove_in_the_rows_words(project: Path) -> None:
    Store((project / "store").as_uri()).write_ref("toy", "k1", {"created": 1e9})
    r = toy(["gc", "--keep-days", "0", "--dry-run"], project)
    assert r.returncode == 0, r.stderr
    assert "toy greetings: 1," in r.stdout, r.stdout
