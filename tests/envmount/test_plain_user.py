"""Issue 48, first step: a plain user mounts the env image through FUSE (`squashfuse` + `fuse-overlayfs`).

The user (uid 65534, with only the DAC capabilities that let it read this root-owned test venv) builds
and publishes into its own store domain, then a fresh node cache of the same user starts the job on
the mounted env: squashfuse for the image, fuse-overlayfs for the writable view. Root's /dev/fuse is
0600 here, where a plain user's node has it 0666: each node runs in a private mount namespace with a
0666 node of the same device bound over it, and the mounts, made in that namespace, are checked from
inside it (the job) and by their record (the agent removes the run's mount directory only once every
mount is gone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nobody import NOBODY, USER_FUSE, as_nobody

from .conftest import WHEELS, agents_done, config, unmount_all
from .test_mount_mode import JOB

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become the plain user (setpriv)"),
]

AS_NOBODY = as_nobody("dac_read_search", "dac_override")


@pytest.fixture
def plain_base() -> Iterator[Path]:
    """A 0755 directory under /tmp owned by the plain user (tmp_path is root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="bootseer-envmount-", dir="/tmp"))
    base.chmod(0o755)
    os.chown(base, NOBODY, NOBODY)
    try:
        yield base
    finally:
        unmount_all(str(base))
        shutil.rmtree(base, ignore_errors=True)


def _node(base: Path, name: str) -> dict[str, str]:
    home = base / name
    for d in (home, home / "cache", home / "rt"):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chown(d, NOBODY, NOBODY)
    return {"XDG_CACHE_HOME": str(home / "cache"), "XDG_RUNTIME_DIR": str(home / "rt")}


def _as_nobody(argv: list[str], nd: dict[str, str], agent: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "PIP_"))}
    env.update({**nd, "HOME": nd["XDG_CACHE_HOME"], "BOOTSEER_EXEC_AGENT": "1" if agent else "0"})
    env["PIP_CONFIG_FILE"] = "/dev/null"
    dev = Path(nd["XDG_CACHE_HOME"]).parent / f"fuse-{time.monotonic_ns()}"
    cmd = ["unshare", "-m", "sh", "-c", USER_FUSE, str(dev), *AS_NOBODY, sys.executable, "-m", "bootseer_cli"]
    return subprocess.run([*cmd, *argv], env=env, capture_output=True, text=True, timeout=300)


def test_plain_user_mounts_the_env_through_fuse(plain_base: Path, wheels: Path) -> None:
    if shutil.which("squashfuse_ll") is None and shutil.which("squashfuse") is None:
        pytest.fail("squashfuse is required (apt-get install squashfuse)")
    root = plain_base / "env"
    wh = plain_base / "wheels"
    shutil.copytree(wheels, wh)
    cfg = config(plain_base, root, wh)
    for p in [plain_base / "store", cfg, *wh.iterdir(), wh]:
        os.chown(p, NOBODY, NOBODY)
    script = plain_base / "job.py"
    script.write_text(JOB)
    launcher = ["/bin/sh", "-c", f"exec {sys.executable} {script} {root}"]
    builder = _node(plain_base, "builder")
    r = _as_nobody(["exec", "--config", str(cfg), "--", *launcher], builder, agent=False)
    assert r.returncode == 0 and r.stdout.split()[-1] == "False", r.stdout + r.stderr
    assert len(WHEELS) == 2
    shutil.rmtree(root)
    fresh = _node(plain_base, "fresh")
    r = _as_nobody(["exec", "--config", str(cfg), "--", *launcher], fresh, agent=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "1.17.0", "3.20", "late", "True"], r.stdout + r.stderr
    assert "mounted image" in r.stderr and "fuse squashfs + fuse overlay" in r.stderr, r.stderr
    agents_done(fresh)
    runs = Path(fresh["XDG_CACHE_HOME"]) / "bootseer" / "env-mount"
    assert not list(runs.iterdir()), "the agent did not take the mounts down"
    assert [n for n in os.listdir(root) if not n.startswith(".bootseer-env")] == [], "the job's writes reached the tree"
