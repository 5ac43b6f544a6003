"""The record is bounded: fanotify's default queue (drained while the start runs; an overflow costs its
window, and the record is published with its coverage: test_busy_node.py), only the launcher's own opens,
and replay never leaves the configured roots.

Real fanotify (as root), real `bootseer hot record`, real page cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.config import load as load_config
from bootseer_cli.hotblocks.pagecache import evict, walk_files
from bootseer_cli.hotblocks.record import Record, load, publish
from bootseer_cli.hotblocks.replay import replay
from bootseer_cli.settings import Settings
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store

from .conftest import MiB, bootseer, resident_set, write_config

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify mount marks need root")

READS_F1_F3 = """
import os, sys, time
root = sys.argv[1]
for name in ("f1.bin", "f3.bin"):
    with open(os.path.join(root, name), "rb") as f:
        f.read(100_000)
time.sleep(1.5)
"""

# Another job on the node: reads f2 over and over, before, during and after the recorded start.
NEIGHBOUR = """
import os, sys, time
path = sys.argv[1]
while True:
    with open(path, "rb") as f:
        f.read(100_000)
    time.sleep(0.02)
"""


def _record(tmp_path: Path, tree: Path, prog: str, ready: str = "1") -> subprocess.CompletedProcess[str]:
    write_config(tmp_path / "bootseer.toml", [tree])
    (tmp_path / "prog.py").write_text(prog)
    argv = ["hot", "record", "--root", str(tree), "--ready", ready, "--", sys.executable, str(tmp_path / "prog.py")]
    return bootseer(*argv, str(tree), cwd=tmp_path, timeout=120)


def _shown(tmp_path: Path) -> dict:
    r = bootseer("hot", "show", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@root_only
@pytest.mark.integration
def test_opens_of_a_process_outside_the_launchers_tree_are_not_recorded(tree: Path, tmp_path: Path) -> None:
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(tree / "f2.bin")])
    try:
        time.sleep(0.3)
        r = _record(tmp_path, tree, READS_F1_F3)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert r.returncode == 0, r.stderr
    assert "recorded 2 files" in r.stderr, r.stderr
    assert {Path(f["path"]).name for f in _shown(tmp_path)["top_files"]} == {"f1.bin", "f3.bin"}


OPENS_MANY = """
import os, sys
root = sys.argv[1]
os.mkdir(os.path.join(root, "many"))
for i in range(20_000):  # more events than the default queue holds (16384), none read meanwhile;
    # distinct files, as fanotify merges repeated opens of one file by one process into one event
    os.close(os.open(os.path.join(root, "many", str(i)), os.O_WRONLY | os.O_CREAT, 0o644))
with open(os.path.join(root, "f3.bin"), "rb") as f:
    f.read(100_000)
import bootseer_cli
bootseer_cli.ready()
"""


@root_only
@pytest.mark.integration
def test_a_start_that_opens_more_files_than_the_queue_holds_is_recorded(tree: Path, tmp_path: Path) -> None:
    """Before issue 44 the queue was read only at ready: it overflowed, and nothing was published."""
    r = _record(tmp_path, tree, OPENS_MANY, ready="call")
    assert r.returncode == 0, r.stderr
    assert "recorded 1 files" in r.stderr, r.stderr  # f3.bin: the 20,000 empty files have no pages
    assert "incomplete" not in r.stderr
    assert {Path(f["path"]).name for f in _shown(tmp_path)["top_files"]} == {"f3.bin"}


@pytest.mark.integration
def test_a_record_with_extents_outside_the_roots_replays_nothing_there(tree: Path, tmp_path: Path) -> None:
    """A record comes from the store: its paths must not make replay read (as root) outside the roots."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(2 * MiB))
    sneaky = f"{tree}/../outside.bin"  # under the root as a string, outside it as a path
    inside = str(tree / "f1.bin")
    files = {p: (os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in (inside, str(outside))}
    files[sneaky] = files[str(outside)]
    rec = Record(
        image_key="k" * 64,
        roots=["/"],  # the record's own roots are the store's word: not used
        files=files,
        extents=sorted([(inside, 0, MiB), (str(outside), 0, MiB), (sneaky, MiB, MiB)]),
    )
    store = Store((tmp_path / "store").as_uri())
    publish(store, rec)
    p2p = Settings.from_config(load_config(None, environ={})).p2p
    found = load(p2p, store, BlobCache(tmp_path / "cache", 1 << 30), "k" * 64, [str(tree)])
    assert found is not None
    got, doc = found
    assert set(got.files) == {inside} and {p for p, _, _ in got.extents} == {inside}
    assert doc["_outside"] == 2

    evict(list(walk_files([tree, outside])))
    res = replay(got)
    assert res.bytes_read == MiB
    assert resident_set(outside) == set()
    assert resident_set(tree / "f1.bin")
