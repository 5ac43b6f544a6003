"""What the agent learns for the next start: an empty record (warned about, backed off from), the
never-slower verdict (replay turned off after a start it made slower), and a stale record re-taken
without an eviction walk before exec. Real `bootseer exec`, real agent, fanotify as root."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bootseer_cli.hotblocks.status import RETRY_EVERY

from .conftest import bootseer, pages, resident_set, wait_for, write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify mount marks need root")

READY_PROG = """
import os, sys, bootseer_cli
root = sys.argv[1]
with open(os.path.join(root, "f1.bin"), "rb") as f:
    f.seek(1 << 20)
    f.read(200_000)
with open(os.path.join(root, "f3.bin"), "rb") as f:
    f.read(50_000)
bootseer_cli.ready()
"""


def _exec(cfg: Path, cwd: Path, *argv: str) -> str:
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, *argv, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return r.stderr


def _show(cfg: Path, cwd: Path) -> dict:
    return json.loads(bootseer("hot", "show", "--json", "-c", str(cfg), cwd=cwd).stdout)


@pytest.mark.integration
def test_empty_record_is_warned_by_the_next_start_and_not_retried_every_start(tree: Path, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "bootseer.toml", [tree], ready="quiet")
    out = _exec(cfg, tmp_path, "-c", "pass")  # opens nothing under the roots
    assert "recording this start" in out
    wait_for(lambda: (_show(cfg, tmp_path).get("last_empty") or {}).get("why"), what="the empty-record note")
    assert "opened no file under" in _show(cfg, tmp_path)["last_empty"]["why"]

    for i in range(RETRY_EVERY - 1):  # backed off: warned, not recorded
        out = _exec(cfg, tmp_path, "-c", "pass")
        assert "last hot-block record of this image was empty" in out and "opened no file" in out
        assert f"not recording again for {RETRY_EVERY - 1 - i} more start(s)" in out
        assert "recording this start" not in out
    out = _exec(cfg, tmp_path, "-c", "pass")  # the N-th start tries again
    assert "trying again" in out and "recording this start" in out


@pytest.mark.integration
def test_a_changed_tree_ends_the_backoff(tree: Path, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "bootseer.toml", [tree], ready="quiet")
    _exec(cfg, tmp_path, "-c", "pass")
    wait_for(lambda: _show(cfg, tmp_path).get("last_empty"), what="the empty-record note")
    (tree / "new.bin").write_bytes(b"x" * 10_000)  # the root's mtime changes
    out = _exec(cfg, tmp_path, "-c", "pass")
    assert "trying again" in out and "recording this start" in out


@pytest.mark.integration
def test_replay_that_made_the_start_slower_is_turned_off_until_the_record_changes(tree: Path, tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(READY_PROG)
    # replay at 0.5 MB/s in the foreground: ~1.5 MB of record costs ~3 s before exec, a sure loss
    cfg = write_config(tmp_path / "bootseer.toml", [tree], ready="call", prefetch_mbps=0.5, foreground_s=30.0)
    assert "recording this start" in _exec(cfg, tmp_path, str(prog), str(tree))
    wait_for(lambda: _show(cfg, tmp_path).get("record"), what="the record")
    first = _show(cfg, tmp_path)
    assert first["replay"]["without_s"] and not first["replay"]["off"]

    assert "replayed" in _exec(cfg, tmp_path, str(prog), str(tree))
    wait_for(lambda: _show(cfg, tmp_path)["replay"]["off"], what="the verdict")
    shown = bootseer("hot", "show", "-c", str(cfg), cwd=tmp_path).stdout
    assert "replay: OFF for this image until the record changes" in shown

    out = _exec(cfg, tmp_path, str(prog), str(tree))
    assert "not replaying: replay is off for this image" in out and "replayed" not in out

    # a new record (here by hand) is judged afresh: replay is on again
    r = bootseer("hot", "record", "--root", str(tree), "--", sys.executable, str(prog), str(tree), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _show(cfg, tmp_path)["record"] != first["record"]
    assert not _show(cfg, tmp_path)["replay"]["off"]
    assert "replayed" in _exec(cfg, tmp_path, str(prog), str(tree))


@pytest.mark.integration
def test_a_stale_record_is_taken_again_without_evicting_the_roots(tree: Path, program: Path, tmp_path: Path) -> None:
    r = bootseer("hot", "record", "--root", str(tree), "--", sys.executable, str(program), str(tree), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for name in ("f1.bin", "f3.bin"):
        os.utime(tree / name, ns=(1, 1))
    (tree / "f2.bin").read_bytes()  # resident; an eviction walk before exec would drop it
    assert pages(0, 3 << 20) <= resident_set(tree / "f2.bin")
    cfg = write_config(tmp_path / "bootseer.toml", [tree], ready="quiet")
    out = _exec(cfg, tmp_path, "-c", "import time; time.sleep(0.2)")
    assert "mostly stale" in out and "recording this start" in out
    assert pages(0, 3 << 20) <= resident_set(tree / "f2.bin")
