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
    assert "warning: checkpoint stage failed" in r.stderr and "no tags" in r.stderr
