"""What the agent learns for the next start: an empty record (warned about, backed off from), the
never-slower verdict (replay turned off after a start it made slower), and a stale record re-taken
without an eviction walk before exec. Real `bootseer exec`, real agent, fanotify as root."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bootseer_cli.commands.options import load_settings
from bootseer_cli.hotblocks import status
from bootseer_cli.hotblocks.status import RETRY_EVERY
from bootseer_cli.store.core import open_store

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
    assert first["replay"]["recording_s"] and not first["replay"]["off"]

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


def test_judged_against_the_recording_start_only_a_clear_win_or_loss_is_decided_and_between_a_control_start_decides(
    tmp_path: Path,
) -> None:
    """The figures of the s3fs kernel_cache benchmark (recording 56.0 s, replay 54.1 s, plain 50.9 s):
    against the recording start the replay looked like a small win; the control start shows it loses."""
    store = open_store(f"file://{tmp_path / 'store'}")
    doc = status.add_sample(store, "img", "rec", "recording", 56.0)
    assert not status.needs_control(doc)  # nothing with replay yet
    doc = status.add_sample(store, "img", "rec", "with", 54.1)
    assert not doc["off"] and status.needs_control(doc)
    doc = status.add_sample(store, "img", "rec", "without", 50.9)  # the control start
    assert doc["off"] and "without 50.9 s" in doc["why"] and not status.needs_control(doc)

    # a clear win (lazyfs: 3.8 s against 8.7 s) needs no control; a clear loss is off at once
    assert not status.needs_control(status.add_sample(store, "lazy", "rec", "recording", 8.7))
    assert not status.needs_control(status.add_sample(store, "lazy", "rec", "with", 3.8))
    status.add_sample(store, "slow", "rec", "recording", 10.0)
    lost = status.add_sample(store, "slow", "rec", "with", 10.6)
    assert lost["off"] and "the recording start 10.0 s" in lost["why"]


def test_a_start_after_a_replay_that_did_not_clearly_pay_runs_without_it_and_is_judged(
    tree: Path, tmp_path: Path
) -> None:
    """The stage reads the verdict: after a replay start barely faster than the recording start, the
    next start skips replay as a control, says so, and its time lands on the "without" side."""
    prog = tmp_path / "prog.py"
    prog.write_text(READY_PROG)
    cfg = write_config(tmp_path / "bootseer.toml", [tree], ready="call")
    assert "recording this start" in _exec(cfg, tmp_path, str(prog), str(tree))
    wait_for(lambda: _show(cfg, tmp_path).get("record") and _show(cfg, tmp_path)["replay"]["recording_s"])
    shown = _show(cfg, tmp_path)
    recording = shown["replay"]["recording_s"][0]
    store = open_store(load_settings(cfg).store.uri)
    status.add_sample(store, shown["image_key"], shown["record"], "with", recording * 0.95)  # as the agent would

    out = _exec(cfg, tmp_path, str(prog), str(tree))
    assert "not replaying: a control start" in out and "replayed" not in out
    wait_for(lambda: _show(cfg, tmp_path)["replay"]["without_s"], what="the control start's sample")
    # one control is enough: the next start replays, or is told replay is off (by the two sides' medians)
    out = _exec(cfg, tmp_path, str(prog), str(tree))
    assert "a control start" not in out and ("replayed" in out or "replay is off for this image" in out), out


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
