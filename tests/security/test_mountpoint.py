"""Item 2 of issue 14: a checkpoint mount point is never followed through a symlink, never another
user's, and a root mount is private unless `[checkpoint] allow_other` says otherwise.

A plain user (made here with `useradd`, removed afterwards) plants a symlink (or its own directory)
at root's configured mount point in a world-writable sticky directory; root's `bootseer exec` with a
checkpoint must refuse it, say why, mount nothing anywhere, and still start the job. A root mount
without allow_other is unreadable for that user (EACCES through FUSE); with it, readable.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store
from bootseer_cli.stripe.mount import FSTYPE, umount
from bootseer_cli.stripe.push import push

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, a root FUSE mount)"),
]

USER = "bootseer-sec"
CELL = 64 << 10
LAUNCHER = "import os; print('CKPT=' + os.environ.get('BOOTSEER_CKPT_DIR', '-'))"


@pytest.fixture(scope="module")
def plain_user() -> Iterator[str]:
    """A plain local user; created for this module when missing, and removed again."""
    made = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
        made = True
    yield USER
    if made:
        subprocess.run(["userdel", USER], check=False)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A directory the plain user can reach (tmp_path is root's 0700), with a sticky 1777 `tmp` in it."""
    base = Path(tempfile.mkdtemp(prefix="bootseer-sec-", dir="/tmp"))
    base.chmod(0o755)
    (base / "tmp").mkdir()
    (base / "tmp").chmod(0o1777)
    yield base
    for mp in reversed(_fuse_mounts_under(str(base))):
        subprocess.run(["umount", "-l", mp], check=False)
    shutil.rmtree(base, ignore_errors=True)


def _fuse_mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split(" - ")[1].startswith("fuse") and ln.split()[4].startswith(prefix)]


def _as_user(user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv], capture_output=True, text=True, errors="replace", timeout=30
    )


def _bootseer(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _job(tmp_path: Path, mountpoint: Path, allow_other: bool = False) -> Path:
    store = Store((tmp_path / "store").as_uri())
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(3 * CELL + 1))
    push(store, src, "job", "t1", stripes=2, cell_size=CELL)
    cfg = tmp_path / "bootseer.toml"
    cfg.write_text(
        f'[store]\nuri = "{store.uri}"\n\n[checkpoint]\nname = "job"\nmountpoint = "{mountpoint}"\n'
        + ("allow_other = true\n" if allow_other else "")
    )
    return cfg


@pytest.mark.parametrize("planted", ["symlink", "directory"])
def test_planted_mountpoint_is_refused_and_the_job_starts(
    tmp_path: Path, shared: Path, plain_user: str, planted: str
) -> None:
    victim = shared / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    mp = shared / "tmp" / "bootseer-ckpt"
    if planted == "symlink":
        r = _as_user(plain_user, "ln", "-s", str(victim), str(mp))
    else:
        r = _as_user(plain_user, "mkdir", str(mp))
    assert r.returncode == 0, r.stderr
    cfg = _job(tmp_path, mp)
    r = _bootseer("exec", "--config", str(cfg), "--", sys.executable, "-c", LAUNCHER, cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # the job started, without its checkpoint
    assert "CKPT=-" in r.stdout
    why = "is a symbolic link" if planted == "symlink" else "not by this user"
    assert why in r.stderr and str(mp) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not _fuse_mounts_under(str(shared)), "a FUSE mount was left behind"
    assert (victim / "precious").read_text() == "keep me" and sorted(os.listdir(victim)) == ["precious"]
    assert mp.is_symlink() == (planted == "symlink")  # the planted entry was neither followed nor replaced


def test_root_mount_is_private_unless_allow_other(tmp_path: Path, shared: Path, plain_user: str) -> None:
    mp = shared / "mnt"
    for allow_other, readable in ((False, False), (True, True)):
        (tmp_path / str(allow_other)).mkdir()
        cfg = _job(tmp_path / str(allow_other), mp, allow_other)
        r = _bootseer("ckpt", "mount", "job:t1", str(mp), "--config", str(cfg), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        try:
            with open("/proc/self/mountinfo") as f:
                assert any(FSTYPE in ln and f" {mp} " in ln for ln in f)
            got = _as_user(plain_user, "cat", str(mp / "w.bin"))
            if readable:
                assert got.returncode == 0, got.stderr
            else:
                assert got.returncode != 0 and "Permission denied" in got.stderr, got.stderr
        finally:
            umount(mp)


def test_default_mountpoint_is_private_and_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No shared /tmp path by default: under $XDG_RUNTIME_DIR/bootseer when that is ours and 0700, else
    /run/bootseer/<uid>; the stage mounts at `ckpt-<run id>` beside the documented base."""
    from bootseer_cli.settings import CheckpointSettings

    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert CheckpointSettings().mountpoint == str(xdg / "bootseer" / "ckpt")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert CheckpointSettings().mountpoint == f"/run/bootseer/{os.geteuid()}/ckpt"
