"""Which files a setup still writes: judged by the file itself, not by a path another mount namespace shares.

CI failed on two jobs setting up at once on one machine: each node's venv is mounted at the same path in
its own mount namespace, so node A's pip writing `<venv>/x.py` made node B refuse its capture."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bootseer_cli.envsnap.capture import open_for_writing

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a mount namespace")

HOLD = 'mount --bind "$1" "$2" && exec 3>>"$2/x.py" && echo ready && exec sleep 30'


def _holder(argv: list[str]) -> subprocess.Popen[str]:
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_a_writer_of_the_same_path_in_another_mount_namespace_is_not_ours(tmp_path: Path) -> None:
    if not shutil.which("unshare"):
        pytest.fail("util-linux unshare is required")
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    (mine / "x.py").write_text("ours\n")
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", HOLD, "sh", str(theirs), str(mine)]
    p = _holder(argv)
    try:
        assert (theirs / "x.py").exists()  # it writes its own file, seen by it at our path
        assert open_for_writing({str(mine / "x.py")}) == []
    finally:
        p.kill()
        p.wait()


def test_a_writer_of_our_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("ours\n")
    p = subprocess.Popen(
        ["sh", "-c", 'exec 3>>"$1" && echo ready && exec sleep 30', "sh", str(tmp_path / "x.py")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 5
        found = open_for_writing({str(tmp_path / "x.py")})
        while not found and time.monotonic() < deadline:
            time.sleep(0.05)
            found = open_for_writing({str(tmp_path / "x.py")})
        assert found == [f"{tmp_path / 'x.py'} (pid {p.pid})"]
    finally:
        p.kill()
        p.wait()
