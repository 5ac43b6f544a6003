"""Record a start, replay it: on local disk (page-cache residency) and through the lazy FUSE image."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bootseer_cli.hotblocks.pagecache import evict, walk_files
from bootseer_cli.store.core import Store
from tests.support.lazyfs import LazyMount

from .conftest import MiB, bootseer, pages, resident_set, wait_for, write_config


def _record(tree: Path, program: Path, cwd: Path) -> dict:
    write_config(cwd / "bootseer.toml", [tree])  # replay reads only under the configured roots
    r = bootseer("hot", "record", "--root", str(tree), "--", sys.executable, str(program), str(tree), cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert "recorded 2 files" in r.stderr
    shown = bootseer("hot", "show", "--json", cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_recorded_start_then_replay_makes_the_recorded_extents_resident(
    tree: Path, program: Path, tmp_path: Path
) -> None:
    doc = _record(tree, program, tmp_path)
    assert doc["files"] == 2 and doc["stale_files"] == 0
    assert {Path(f["path"]).name for f in doc["top_files"]} == {"f1.bin", "f3.bin"}  # f2 was never read
    assert 0 < doc["share_of_roots"] < 0.9

    evict(list(walk_files([tree])))
    assert resident_set(tree / "f1.bin") == set()
    r = bootseer("hot", "replay", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bytes_read"] == doc["bytes"] and out["stale_files"] == 0
    # what the start read is in the page cache again, and the file it never touched is not
    assert pages(MiB, 200_000) <= resident_set(tree / "f1.bin")
    assert pages(0, 50_000) <= resident_set(tree / "f3.bin")
    assert resident_set(tree / "f2.bin") == set()


def test_a_changed_file_is_skipped_and_counted(tree: Path, program: Path, tmp_path: Path) -> None:
    _record(tree, program, tmp_path)
    with open(tree / "f3.bin", "ab") as f:  # size and mtime change
        f.write(b"more")
    evict(list(walk_files([tree])))
    r = bootseer("hot", "replay", "--json", cwd=tmp_path)
    out = json.loads(r.stdout)
    assert out["stale_files"] == 1
    assert resident_set(tree / "f3.bin") == set()  # not read: it is not the file that was recorded
    assert pages(MiB, 200_000) <= resident_set(tree / "f1.bin")
    shown = json.loads(bootseer("hot", "show", "--json", cwd=tmp_path).stdout)
    assert shown["stale_files"] == 1 and 0 < shown["stale_share"] < 1


def test_hot_verbs_fail_cleanly_without_a_record_or_command(tmp_path: Path) -> None:
    r = bootseer("hot", "replay", cwd=tmp_path)
    assert r.returncode != 0 and "no hot-block record" in r.stderr and "Traceback" not in r.stderr
    r = bootseer("hot", "record", "--root", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "no command given" in r.stderr
    r = bootseer("hot", "show", cwd=tmp_path)
    assert r.returncode == 1 and "no hot-block record" in r.stdout


@pytest.mark.integration
def test_exec_records_then_replays_through_a_lazy_image(tree: Path, tmp_path: Path) -> None:
    """Start 1 (no record) is recorded by the agent at ready(); start 2, on a cold lazy image, has the
    replay fetch every chunk the start needs before the program runs, so the program fetches none."""
    mnt = tmp_path / "mnt"
    prog = tmp_path / "lazyprog.py"
    prog.write_text(
        "import os, sys, bootseer_cli\n"
        "log = sys.argv[2]\n"
        "open(sys.argv[3], 'w').write(str(len(open(log).read().splitlines())))\n"  # fetches before the program
        "root = sys.argv[1]\n"
        "f = open(os.path.join(root, 'f1.bin'), 'rb'); f.seek(1 << 20); f.read(200_000)\n"
        "g = open(os.path.join(root, 'f3.bin'), 'rb'); g.read(50_000)\n"
        "bootseer_cli.ready()\n"
        "import time; time.sleep(0.5)\n"
    )
    cfg = write_config(tmp_path / "bootseer.toml", [mnt], ready="call", foreground_s=30.0)
    with LazyMount(tree, mnt, delay_ms=5) as lazy:
        mark = tmp_path / "mark1"
        r = bootseer("exec", "-c", str(cfg), "--", sys.executable, str(prog), str(mnt), str(lazy.log), str(mark))
        assert r.returncode == 0, r.stderr
        assert "recording this start" in r.stderr
        first = set(lazy.fetches())
        wait_for(lambda: bootseer("hot", "show", "-c", str(cfg)).returncode == 0, what="the record")

        lazy.restart()  # cold chunk cache, empty page cache
        mark = tmp_path / "mark2"
        r = bootseer("exec", "-c", str(cfg), "--", sys.executable, str(prog), str(mnt), str(lazy.log), str(mark))
        assert r.returncode == 0, r.stderr
        assert "replayed" in r.stderr
        fetches = lazy.fetches()
        before = set(fetches[: int(mark.read_text())])
        during = set(fetches[int(mark.read_text()) :])
    assert first <= before  # the replay fetched every chunk the recorded start needed…
    assert not (during & first)  # …so the program itself fetched none of them
    assert ("/f2.bin", 0) not in before  # and nothing the start never read


@pytest.mark.integration
def test_mostly_stale_record_is_taken_again(tree: Path, program: Path, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "bootseer.toml", [tree], ready="quiet")
    doc = _record(tree, program, tmp_path)
    for name in ("f1.bin", "f3.bin"):
        os.utime(tree / name, ns=(1, 1))
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, str(program), str(tree), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "mostly stale" in r.stderr and "recording this start" in r.stderr

    def new_record() -> bool:
        d = json.loads(bootseer("hot", "show", "--json", "-c", str(cfg)).stdout)
        return d["record"] != doc["record"] and d["stale_files"] == 0

    wait_for(new_record, what="a new record")


@pytest.mark.integration
def test_foreground_deadline_hands_the_rest_to_the_agent(tree: Path, program: Path, tmp_path: Path) -> None:
    _record(tree, program, tmp_path)
    cfg = write_config(tmp_path / "bootseer.toml", [tree], foreground_s=0.0)
    evict(list(walk_files([tree])))
    # the launcher waits (without reading) until the agent has read the hot set for it
    waiter = tmp_path / "wait.py"
    waiter.write_text(
        "import os, sys, time\n"
        "d = os.environ['BOOTSEER_RUN_DIR']\n"
        "for _ in range(200):\n"
        "    log = open(os.path.join(d, 'agent.log')).read() if os.path.exists(os.path.join(d, 'agent.log')) else ''\n"
        "    if 'hot-prefetch:' in log: sys.exit(0)\n"
        "    time.sleep(0.1)\n"
        "sys.exit(7)\n"
    )
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, str(waiter), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "to the agent" in r.stderr
    assert pages(MiB, 200_000) <= resident_set(tree / "f1.bin")
    assert resident_set(tree / "f2.bin") == set()


@pytest.mark.integration
def test_a_record_whose_blob_is_gone_from_the_store_is_taken_again(
    tree: Path, program: Path, tmp_path: Path, store_uri: str, isolated_cache: Path
) -> None:
    """An object store's lifecycle rule (or a hand) deletes the record's blob while its ref stays. That is
    no passing outage: before, every start warned "cannot read the hot-block record", started without
    replay and never took a new record, and `hot show` said only "blob … not found"."""
    cfg = write_config(tmp_path / "bootseer.toml", [tree], ready="quiet")
    cfg.write_text(cfg.read_text() + f'[store]\nuri = "{store_uri}"\n')
    r = bootseer("hot", "record", "-c", str(cfg), "--", sys.executable, str(program), str(tree), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    old = json.loads(bootseer("hot", "show", "--json", "-c", str(cfg)).stdout)["record"]
    Store(store_uri).delete_blob(old)
    for cached in isolated_cache.rglob(f"{old}*"):
        cached.unlink()

    shown = bootseer("hot", "show", "-c", str(cfg))  # asked before the start takes a new record
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, str(program), str(tree), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "gone from the store" in r.stderr and "recording this start (record gone)" in r.stderr
    assert shown.returncode == 1
    assert shown.stderr.count("\n") == 1 and "gone from the store" in shown.stderr and "takes a new one" in shown.stderr

    def new_record() -> bool:
        d = bootseer("hot", "show", "--json", "-c", str(cfg))
        return d.returncode == 0 and json.loads(d.stdout)["record"] != old

    wait_for(new_record, what="a new record in place of the one whose blob is gone")
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, str(program), str(tree), cwd=tmp_path)
    assert r.returncode == 0 and "replayed" in r.stderr, r.stderr
