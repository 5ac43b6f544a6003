"""`bootseer exec` with a [checkpoint]: mounted (or pulled) before the launcher starts, exported as
$BOOTSEER_CKPT_DIR, and the mount is gone once the launcher has exited."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bootseer_cli.stripe.mount import mount_info
from bootseer_cli.stripe.push import push

from .conftest import CELL, file_store, run_cli, wait_until, write_random

pytestmark = pytest.mark.integration

LAUNCHER = (
    "import hashlib, os; d = os.environ['BOOTSEER_CKPT_DIR']; "
    "print(d, hashlib.sha256(open(os.path.join(d, 'w', 'f.bin'), 'rb').read()).hexdigest())"
)


def _config(tmp_path: Path, store_uri: str, mountpoint: Path, mode: str) -> Path:
    cfg = tmp_path / "bootseer.toml"
    cfg.write_text(
        f'[store]\nuri = "{store_uri}"\n\n[checkpoint]\nname = "job"\nmountpoint = "{mountpoint}"\nmode = "{mode}"\n'
    )
    return cfg


@pytest.mark.parametrize("mode", ["mount", "pull"])
def test_exec_mounts_or_pulls_the_latest_checkpoint(tmp_path: Path, mounts: Path, mode: str) -> None:
    store = file_store(tmp_path)
    data = write_random(tmp_path / "src" / "w" / "f.bin", 5 * CELL + 11, 3)
    push(store, tmp_path / "src", "job", "old", stripes=2, cell_size=CELL)
    write_random(tmp_path / "src" / "w" / "f.bin", 5 * CELL + 11, 4)
    push(store, tmp_path / "src", "job", "new", stripes=2, cell_size=CELL)
    (tmp_path / "src" / "w" / "f.bin").write_bytes(data)  # so "latest" (new) is not what is on disk now
    mp = mounts / "ck"
    cfg = _config(tmp_path, store.uri, mp, mode)
    r = run_cli("exec", "--config", str(cfg), "--", "python", "-c", LAUNCHER)
    assert r.returncode == 0, r.stderr
    newest = hashlib.sha256((tmp_path / "src" / "w" / "f.bin").read_bytes()).hexdigest()
    out_dir, digest = r.stdout.split()
    assert out_dir == str(mp)
    assert digest != newest  # the launcher saw tag "new", not the bytes we put back on disk
    assert digest == hashlib.sha256(_pushed_new(tmp_path)).hexdigest()
    if mode == "mount":
        assert "checkpoint" in r.stderr and "mounted job:new" in r.stderr
        assert wait_until(lambda: mount_info(mp) is None, timeout=15), "the mount outlived the launcher"
    else:
        assert (mp / "w" / "f.bin").read_bytes() == _pushed_new(tmp_path)
        r = run_cli("exec", "--config", str(cfg), "--", "python", "-c", LAUNCHER)
        assert r.returncode == 0 and "already pulled" in r.stderr, r.stderr


def _pushed_new(tmp_path: Path) -> bytes:
    import random

    return random.Random(4).randbytes(5 * CELL + 11)


def test_exec_starts_the_job_when_the_checkpoint_is_unavailable(tmp_path: Path, mounts: Path) -> None:
    cfg = _config(tmp_path, (tmp_path / "empty-store").as_uri(), mounts / "ck", "mount")
    r = run_cli("exec", "--config", str(cfg), "--", "python", "-c", "print('started')")
    assert r.returncode == 0 and r.stdout.strip() == "started"
    # a job's first start, before its first push: said in the summary (a writable directory, pushed behind
    # the job), neither a warning nor a stage failure
    assert "warning: checkpoint" not in r.stderr
    assert "checkpoint stage failed" not in r.stderr and "job: none yet, writable dir" in r.stderr, r.stderr


_HIDE_FUSE = """
d=$1; shift
for n in null zero random urandom full; do touch "$d/$n"; mount --bind "/dev/$n" "$d/$n"; done
mkdir "$d/shm" && mount -t tmpfs tmpfs "$d/shm"
mount --rbind "$d" /dev
exec "$@"
"""


def test_without_dev_fuse_one_warning_then_a_pull(tmp_path: Path, mounts: Path) -> None:
    """Issue 17, item 3: a node without /dev/fuse (a mount namespace hiding it) says so in one line and pulls."""
    import shutil
    import subprocess
    import sys

    if not shutil.which("unshare"):
        pytest.fail("util-linux unshare is required")
    store = file_store(tmp_path)
    write_random(tmp_path / "src" / "w" / "f.bin", 3 * CELL, 5)
    push(store, tmp_path / "src", "job", "v1", stripes=2, cell_size=CELL)
    cfg = _config(tmp_path, store.uri, mounts / "ck", "mount")
    (tmp_path / "dev").mkdir()
    cmd = ["unshare", "-m", "sh", "-c", _HIDE_FUSE, "sh", str(tmp_path / "dev")]
    cmd += [sys.executable, "-m", "bootseer_cli", "exec", "--config", str(cfg), "--", "python", "-c", LAUNCHER]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "FUSE" in ln]
    assert len(warnings) == 1 and "/dev/fuse is missing" in warnings[0] and "pulling job:v1" in warnings[0], r.stderr
    assert "cannot mount" not in r.stderr and "pulled job:v1" in r.stderr
    assert (mounts / "ck" / "w" / "f.bin").read_bytes() == (tmp_path / "src" / "w" / "f.bin").read_bytes()


def test_fuse_missing_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bootseer_cli.stripe.stage import fuse_missing

    assert fuse_missing(str(tmp_path / "nope")) == f"{tmp_path / 'nope'} is missing"
    (tmp_path / "plain").write_text("")
    assert fuse_missing(str(tmp_path / "plain")) == f"{tmp_path / 'plain'} is not a device"
    monkeypatch.setenv("PATH", str(tmp_path))  # no fusermount3 on PATH
    assert fuse_missing("/dev/null", euid=1000).startswith("fusermount3 is not installed")
    assert fuse_missing("/dev/null", euid=0) == ""
