"""A replay into a loader's own disk cache fetches close to the record's bytes (issue 28, item 5).

The loader is a real `rclone mount --vfs-cache-mode full` of a bucket on the loopback S3 server. What
rclone fetched is what its cache holds afterwards (the blocks of its sparse cache files: what its
`--bwlimit` charges). The kernel drops a file's pages at every open on this mount, so its readahead past
the end of each recorded extent is a request to rclone for bytes nobody reads: `import torch`'s record
(80 MB) made rclone fetch 117 MB, 3 MB of it readahead. The rest (gaps under 1 MiB that rclone's
download stream reads through, responses left in flight when a stream is left) is rclone's own doing:
docs/notes/hotblocks.md run 12.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.hotblocks import replay
from tests.support.delayproxy import DelayProxy
from tests.support.rclonemount import RcloneMount, upload
from tests.support.s3server import delayed

from .conftest import MiB

KiB = 1 << 10
EXTENT, GAP, COUNT = 256 * KiB, 2 * MiB, 24  # sparse extents: each its own ranged GET on rclone

needs_rclone = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("rclone") is None, reason="needs root, FUSE and rclone"
)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, DelayProxy]]:
    base = tmp_path_factory.mktemp("intoloader")
    tree = base / "tree"
    tree.mkdir()
    (tree / "lib.so").write_bytes(os.urandom(COUNT * (EXTENT + GAP) + GAP))
    with delayed(base / "s3", delay_ms=1.0) as (_, proxy):
        upload(tree, proxy.endpoint, "bootseer/tree")
        yield "bootseer/tree", proxy


def _fetched(bucket: tuple[str, DelayProxy], tmp_path: Path, into_loader: bool) -> tuple[int, int]:
    """(bytes rclone's cache holds, bytes the replay read) after replaying the sparse extents of lib.so
    into a fresh full-cache mount, one stream, as the stage reads a file's extents."""
    remote, proxy = bucket
    name = "ra-off" if into_loader else "ra-on"
    with RcloneMount(proxy.endpoint, remote, tmp_path / name, "full", tmp_path) as m:
        lib = str(m.mountpoint / "lib.so")
        work = [(lib, GAP + i * (EXTENT + GAP), EXTENT) for i in range(COUNT)]
        res = replay.run(work, threads=1, into_loader=into_loader)
        assert res.errors == 0 and res.bytes_read == COUNT * EXTENT
        cache = tmp_path / f"rclone-cache-{name}" / "vfs"
        deadline = time.monotonic() + 5
        held = 0
        while time.monotonic() < deadline:  # rclone writes what is in flight a little after the read returns
            time.sleep(0.5)
            now = sum(p.stat().st_blocks * 512 for p in cache.rglob("*") if p.is_file())
            if now == held:
                break
            held = now
    return held, res.bytes_read


@pytest.mark.integration
@needs_rclone
def test_a_replay_into_a_loaders_own_cache_makes_it_fetch_no_readahead_past_the_extents(
    bucket: tuple[str, DelayProxy], tmp_path: Path
) -> None:
    """24 extents of 256 KiB, 2 MiB apart: with the kernel's readahead rclone fetched 9.4 MB for 6.3 MB
    read (1.5x: 128 KiB past each extent); with POSIX_FADV_RANDOM on the replay's fds, the 6.3 MB.
    Before the fix the replay always read with readahead (and `run` had no `into_loader`)."""
    cached, read = _fetched(bucket, tmp_path, into_loader=True)
    assert cached <= 1.25 * read, f"rclone fetched {cached} bytes for {read} replayed"
    with_readahead, _ = _fetched(bucket, tmp_path, into_loader=False)  # what the replay did before
    assert with_readahead > 1.25 * read, f"the kernel's readahead cost nothing here ({with_readahead} bytes)"
