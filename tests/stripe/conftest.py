"""Fixtures for the striped-checkpoint tests: small real checkpoints, stores, and mount cleanup.

Every FUSE mount a test makes lives under its tmp_path; the `mounts` fixture unmounts whatever is
still mounted there at teardown (normal unmount, then lazy), so no test leaves a mount behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store, blob_path
from bootseer_cli.stripe.mount import mount_info
from tests.support.mounts import mounted_under as _mounted_under

CELL = 64 << 10


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Path]:
    """A directory for mount points; nothing stays mounted under tmp_path after the test."""
    root = tmp_path / "mnt"
    root.mkdir()
    yield root
    for mp in reversed(_mounted_under(str(tmp_path))):
        subprocess.run(["fusermount3", "-u", mp], capture_output=True)
        if mount_info(mp) is not None:
            subprocess.run(["umount", "-l", mp], capture_output=True)
    left = _mounted_under(str(tmp_path))
    assert not left, f"mounts left behind: {left}"


def write_random(path: Path, size: int, seed: int) -> bytes:
    import random

    data = random.Random(seed).randbytes(size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


@pytest.fixture
def plain_ckpt(tmp_path: Path) -> Path:
    """A directory with files of awkward sizes (empty, smaller than a cell, not a multiple of one)."""
    d = tmp_path / "plain"
    write_random(d / "model.bin", 3 * CELL * 4 + 12345, 1)
    write_random(d / "optim" / "state.bin", CELL - 1, 2)
    write_random(d / "optim" / "tiny", 7, 3)
    (d / "empty.txt").write_bytes(b"")
    (d / "emptydir").mkdir()
    return d


def stripe_file(target_root: Path, digest: str) -> Path:
    """The file that holds a stripe blob on a file:// target (or an S3 server's data directory)."""
    return target_root / blob_path(digest)


def file_store(tmp_path: Path, name: str = "store") -> Store:
    return Store((tmp_path / name).as_uri())


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def wait_until(pred, timeout: float = 10.0, step: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()
