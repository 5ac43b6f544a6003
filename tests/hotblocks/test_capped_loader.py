"""A real lazy loader behind a real bandwidth cap: the S3 server runs in a network namespace whose
egress is capped by tbf (issue #19: "each behind a tbf cap"), the delaying proxy in front of it stands
in for netem (not in this kernel), and `rclone mount --vfs-cache-mode off` reads through both.

The cap must bind, or a benchmark "behind a cap" measures loopback; and the hot-block path (record
through the mount, then skip replay on a mount that drops pages at open) must work through it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.hotblocks import probe
from tests.support import netns
from tests.support.delayproxy import DelayProxy
from tests.support.netns import Lab
from tests.support.rclonemount import RcloneMount, upload
from tests.support.s3server import delayed

from .conftest import MiB, wait_for, write_config
from .test_loaders import _exec, _show

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("rclone") is None or not netns.available(),
        reason="needs root, FUSE, rclone, ip netns and tc",
    ),
]

RATE_MBIT = 40  # 5 MB/s: a 4 MB read takes ~0.8 s, against a few ms on loopback
BIG = 4 * MiB
# a prefix and subnet no other Lab user takes (bench_p2p: bsp2p/10.201.0, bench_stripe: bsck/10.201.44,
# bench_hotblocks: bshot/10.201.19), so this test can run while a benchmark holds its lab
LAB_PREFIX, LAB_SUBNET = "bscap", "10.203.0"


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[tuple[str, DelayProxy]]:
    """The tree in a bucket served from a capped namespace: (remote, the delaying proxy before it).

    The tree is what conftest's PROG reads: 40 small files and big0.bin (here 4 MB, to time).
    Uploading goes root → server, which the cap (on the server's egress) leaves free."""
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    for i in range(40):
        (tree / "pkg" / f"m{i:03d}.py").write_bytes(os.urandom(12_000))
    (tree / "big0.bin").write_bytes(os.urandom(BIG))
    with Lab(LAB_PREFIX, subnet=LAB_SUBNET) as lab:
        host = lab.add_host(rate_mbit=RATE_MBIT)
        lab.attach_root()
        with delayed(tmp_path / "s3", host=host.ip, netns=host.name) as (_, proxy):
            upload(tree, proxy.endpoint, "bootseer/tree")
            yield "bootseer/tree", proxy


def test_a_capped_mount_pays_the_cap_and_still_records_then_skips_replay(
    capped: tuple[str, DelayProxy], prog: Path, tmp_path: Path
) -> None:
    """(a) Reading 4 MB through the mount takes at least ~size/cap: the tbf cap binds on the loader's
    GETs. (b) Through that mount, bootseer records the files the start opened, and a later start skips
    replay with one line (the mount drops pages at open), making only the program's own requests."""
    remote, proxy = capped
    probe.forget()
    with RcloneMount(proxy.endpoint, remote, tmp_path / "mnt-off", "off", tmp_path) as m:
        t = time.perf_counter()
        with open(m.mountpoint / "big0.bin", "rb") as f:
            assert len(f.read()) == BIG
        took = time.perf_counter() - t
        floor = 0.6 * BIG / (RATE_MBIT * 1e6 / 8)
        assert took >= floor, f"4 MB in {took:.2f} s: faster than the {RATE_MBIT} mbit cap allows ({floor:.2f} s)"

        cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint], ready="call")
        assert "recording this start" in _exec(cfg, tmp_path, prog, m.mountpoint)
        wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=30, what="the record")
        shown = _show(cfg, tmp_path)
        assert shown["method"] == "opened-files"
        assert shown["files"] == 41  # exactly what the start opened: 40 small files and big0

        before = proxy.requests
        out = _exec(cfg, tmp_path, prog, m.mountpoint)
        assert "not replaying:" in out and "drops a file's pages at every open" in out
        assert "no replay (pages dropped at open)" in out and "replayed" not in out
        assert proxy.requests - before < 200  # the program's own reads only (no replay of 4 MB + 40 files)
