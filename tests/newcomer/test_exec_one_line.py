"""`bootseer exec` with a checkpoint mount prints one line, the summary the README shows (issue 29
item 10): no "mounted at" line, and no line about the previous start's empty mount point every time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import pkgindex

pytestmark = pytest.mark.integration


def test_exec_with_a_mount_prints_one_summary_line(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "w.bin").write_bytes(b"weights\n")
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = {k: v for k, v in pkgindex.clean_env().items() if not k.startswith("BOOTSEER_")}
    env.update(
        {
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "XDG_RUNTIME_DIR": str(xdg),
            "BOOTSEER_STORE": (tmp_path / "store").as_uri(),
            "BOOTSEER_EXEC_AGENT": "0",
        }
    )
    bs = [sys.executable, "-m", "bootseer_cli"]
    push = subprocess.run([*bs, "ckpt", "push", str(ck), "-n", "job", "-t", "t1"], env=env, capture_output=True)
    assert push.returncode == 0, push.stderr
    (tmp_path / "bootseer.toml").write_text('[checkpoint]\nname = "job"\n')
    for start in range(3):  # the second and third find the mount points of the ones before
        r = subprocess.run(
            [*bs, "exec", "--", "sh", "-c", 'cat "$BOOTSEER_CKPT_DIR/w.bin"'],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout == "weights\n"
        lines = r.stderr.splitlines()
        assert len(lines) == 1, f"start {start}: {lines}"
        assert lines[0].startswith("bootseer: image ") and "| checkpoint " in lines[0], lines
        assert "mounted job:t1" in lines[0] and lines[0].endswith(" total"), lines
        time.sleep(0.5)  # the mount's server sees its owner gone and unmounts
