"""Issue 26, case 4: two jobs of one uid on one node each keep their own checkpoint mount, and root
never takes its runtime directory from another user.

Before: both mounted at `<runtime>/ckpt`; the second start unmounted the first job's live mount and
mounted its own, so job A read job B's checkpoint; and root trusted any `XDG_RUNTIME_DIR` (after
`su`/`sudo -E`, another user's), following a link planted there. Real `bootseer exec` runs, real FUSE.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store
from bootseer_cli.stripe.push import push

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a root FUSE mount, useradd)"),
]

USER = "bootseer-sec"
CELL = 64 << 10
# prints its checkpoint dir and the digest of w.bin, waits for GO (a path), then prints the digest again
LAUNCHER = (
    "import hashlib, os, sys, time\n"
    "d = os.environ.get('BOOTSEER_CKPT_DIR', '-')\n"
    "h = lambda: hashlib.sha256(open(os.path.join(d, 'w.bin'), 'rb').read()).hexdigest() if d != '-' else '-'\n"
    "print(d, h(), flush=True)\n"
    "go = sys.argv[1]\n"
    "while go != '-' and not os.path.exists(go): time.sleep(0.05)\n"
    "print(d, h(), flush=True)\n"
)


@pytest.fixture(scope="module")
def plain_user() -> Iterator[str]:
    made = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
        made = True
    yield USER
    if made:
        subprocess.run(["userdel", USER], check=False)


def _fuse_mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        lines = [ln for ln in f if ln.split(" - ")[1].startswith("fuse")]
    return [ln.split()[4] for ln in lines if ln.split()[4] == prefix or ln.split()[4].startswith(prefix + "/")]


@pytest.fixture
def xdg(tmp_path: Path) -> Iterator[Path]:
    """A private runtime dir of root's for the runs; nothing stays mounted under tmp_path."""
    d = tmp_path / "xdg"
    d.mkdir(mode=0o700)
    yield d
    for mp in reversed(_fuse_mounts_under(str(tmp_path))):
        subprocess.run(["umount", "-l", mp], check=False)


def _push(tmp_path: Path, name: str, seed: int) -> tuple[Store, str]:
    import random

    store = Store((tmp_path / "store").as_uri())
    src = tmp_path / f"src-{name}"
    src.mkdir()
    data = random.Random(seed).randbytes(3 * CELL + seed)
    (src / "w.bin").write_bytes(data)
    push(store, src, name, "t1", stripes=2, cell_size=CELL)
    return store, hashlib.sha256(data).hexdigest()


def _config(tmp_path: Path, store: Store, name: str, mountpoint: Path | None = None) -> Path:
    cfg = tmp_path / f"{name}.toml"
    text = f'[store]\nuri = "{store.uri}"\n\n[checkpoint]\nname = "{name}"\n'
    cfg.write_text(text + (f'mountpoint = "{mountpoint}"\n' if mountpoint else ""))
    return cfg


def _exec(cfg: Path, go: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--config", str(cfg), "--"]
    argv += [sys.executable, "-c", LAUNCHER, go]
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_") and k != "XDG_RUNTIME_DIR"}
    env.update(extra)
    return env


def _first_line(p: subprocess.Popen[str]) -> list[str]:
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        _, err = p.communicate(timeout=30)
        pytest.fail(f"the launcher printed nothing: {err}")
    return line.split()


def test_two_runs_of_one_uid_each_see_their_own_checkpoint(tmp_path: Path, xdg: Path) -> None:
    _, want_a = _push(tmp_path, "job-a", 1)
    store, want_b = _push(tmp_path, "job-b", 2)
    env = _env(XDG_RUNTIME_DIR=str(xdg), XDG_CACHE_HOME=str(tmp_path / "cache"))
    go = tmp_path / "go"
    a = _exec(_config(tmp_path, store, "job-a"), str(go), env, tmp_path)
    try:
        dir_a, got_a = _first_line(a)
        assert got_a == want_a
        b = _exec(_config(tmp_path, store, "job-b"), "-", env, tmp_path)
        out_b, err_b = b.communicate(timeout=120)
        assert b.returncode == 0, err_b
        dir_b, got_b = out_b.split()[:2]
        assert got_b == want_b, err_b
        assert dir_a != dir_b
        for d in (dir_a, dir_b):
            assert Path(d).parent == xdg / "bootseer" and Path(d).name.startswith("ckpt-")
        go.touch()
        out_a, err_a = a.communicate(timeout=60)
    finally:
        go.touch()
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, err_a
    assert out_a.split() == [dir_a, want_a], "job A's mount was taken by job B's start"


def test_a_live_mount_at_a_configured_mountpoint_is_never_taken(tmp_path: Path, xdg: Path) -> None:
    _, want_a = _push(tmp_path, "job-a", 1)
    store, _ = _push(tmp_path, "job-b", 2)
    mp = tmp_path / "mnt"
    env = _env(XDG_RUNTIME_DIR=str(xdg), XDG_CACHE_HOME=str(tmp_path / "cache"))
    go = tmp_path / "go"
    a = _exec(_config(tmp_path, store, "job-a", mp), str(go), env, tmp_path)
    try:
        assert _first_line(a) == [str(mp), want_a]
        b = _exec(_config(tmp_path, store, "job-b", mp), "-", env, tmp_path)
        out_b, err_b = b.communicate(timeout=120)
        assert b.returncode == 0, err_b  # the job started, without a checkpoint
        assert out_b.split()[:2] == ["-", "-"], err_b
        assert "live checkpoint mount of another run" in err_b and "Traceback" not in err_b, err_b
        go.touch()
        out_a, err_a = a.communicate(timeout=60)
    finally:
        go.touch()
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, err_a
    assert out_a.split() == [str(mp), want_a], "job A's mount was taken by job B's start"


def _wait_unmounted(d: str) -> None:
    deadline = time.time() + 15
    while _fuse_mounts_under(d) and time.time() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("hostile", ["other-users-dir", "symlink-to-etc"])
def test_root_ignores_a_hostile_xdg_runtime_dir(tmp_path: Path, plain_user: str, hostile: str) -> None:
    import tempfile

    store, want = _push(tmp_path, "job-a", 3)
    base = Path(tempfile.mkdtemp(prefix="bootseer-xdg-", dir="/tmp"))
    victim = base / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    if hostile == "other-users-dir":
        # the user's own runtime dir (0700, theirs), with `bootseer` a link to the victim
        xdg = base / "run-user"
        xdg.mkdir(mode=0o700)
        (xdg / "bootseer").symlink_to(victim)
        uid = pwd.getpwnam(plain_user).pw_uid
        os.lchown(xdg / "bootseer", uid, uid)
        os.chown(xdg, uid, uid)
        target = victim
    else:
        xdg = base / "xdg"
        xdg.symlink_to("/etc")
        target = Path("/etc")
    before = sorted(os.listdir(target))
    env = _env(XDG_RUNTIME_DIR=str(xdg), XDG_CACHE_HOME=str(tmp_path / "cache"))
    p = _exec(_config(tmp_path, store, "job-a"), "-", env, tmp_path)
    out, err = p.communicate(timeout=120)
    try:
        assert p.returncode == 0, err
        d, got = out.split()[:2]
        assert got == want, err
        assert Path(d).parent == Path("/run/bootseer/0") and Path(d).name.startswith("ckpt-"), d
        assert sorted(os.listdir(target)) == before, "the hostile runtime dir's target was touched"
        assert not _fuse_mounts_under(str(target)) and not _fuse_mounts_under(str(base))
        if hostile == "other-users-dir":
            assert (victim / "precious").read_text() == "keep me"
    finally:
        if out:
            _wait_unmounted(d)
            subprocess.run(["rm", "-rf", "--one-file-system", d, f"{d}.owner"], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def test_the_next_start_cleans_ended_runs_and_leaves_live_mounts(tmp_path: Path, xdg: Path) -> None:
    """A per-run dir whose server died (a stale mount) and an old empty one go; a live mount stays."""
    import signal

    from bootseer_cli.stripe.catalog import load_manifest
    from bootseer_cli.stripe.mount import mount_detached, mount_info

    _, want_a = _push(tmp_path, "job-a", 1)
    store, _ = _push(tmp_path, "job-b", 2)
    base = xdg / "bootseer"
    base.mkdir(mode=0o700)
    m = load_manifest(store, "job-b", "t1")
    dead = mount_detached(m, base / "ckpt-dead", store.uri)
    os.kill(dead, signal.SIGKILL)
    os.waitpid(dead, 0)
    live = mount_detached(m, base / "ckpt-live", store.uri)
    (base / "ckpt-old").mkdir()
    try:
        env = _env(XDG_RUNTIME_DIR=str(xdg), XDG_CACHE_HOME=str(tmp_path / "cache"))
        p = _exec(_config(tmp_path, store, "job-a"), "-", env, tmp_path)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.split()[1] == want_a, err
        assert mount_info(base / "ckpt-dead") is None and not (base / "ckpt-dead").exists()
        assert not (base / "ckpt-old").exists()
        assert mount_info(base / "ckpt-live") is not None, "a live mount of another run was taken"
        assert len(list((base / "ckpt-live").iterdir())) == 1  # and still serves its checkpoint
        assert "removed 2 mount point(s) of ended runs" in err, err
    finally:
        os.kill(live, signal.SIGTERM)
