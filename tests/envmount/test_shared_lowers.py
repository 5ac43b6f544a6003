"""An image's lower stays mounted for the node's next start (envmount/lowers.py).

Before: each run mounted its image and unmounted it when its launcher ended, so the kernel dropped the
decompressed pages with the mount, and a restart on the same node imported as slowly as a cold start
(2.37 s against 1.63 s from the extracted tree, CPU torch, 2 cores). Now the lower is mounted once per
node cache and each run's overlay stacks on it: the run's own mounts still go with it; the lower goes
at a later start's sweep once no run uses it and none has for `IDLE_S`; a lower whose FUSE server died
is mounted again, never used dead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bootseer_cli.envmount import lowers
from bootseer_cli.envmount.mounts import devices_at
from tests.support.slowdown import scaled

from .conftest import agents_done, bootseer, mounted_under, node, shared_lowers_under
from .test_mount_mode import _job, _publish

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a kernel loop mount)"),
]


def _start(base: Path, root: Path, nd: dict[str, str], path: str | None = None) -> str:
    r = bootseer(["exec", "--config", str(base / "bootseer-mount.toml"), "--", *_job(base, root)], nd, path=path)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr  # mounted
    agents_done(nd)
    assert mounted_under(str(base)) == []  # the run's overlay went with it
    return r.stderr


def test_a_restart_stacks_on_the_same_lower_and_an_idle_one_goes_at_a_later_sweep(
    base: Path, wheels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = base / "env"
    _publish(base, root, wheels)
    nd = node(base, "fresh")
    _start(base, root, nd)
    [lower] = shared_lowers_under(str(base))
    [dev] = devices_at(lower)
    _start(base, root, nd)  # the restart: its overlay stacks on the lower the first run left
    assert shared_lowers_under(str(base)) == [lower] and devices_at(lower) == [dev]
    doctor = bootseer(["doctor", "--config", str(base / "bootseer-mount.toml")], nd)
    [line] = [ln for ln in doctor.stdout.splitlines() if "env images" in ln]
    assert "1 image(s) kept mounted" in line and os.path.dirname(lower) in line, line  # the admin is told

    monkeypatch.setenv("XDG_CACHE_HOME", nd["XDG_CACHE_HOME"])
    from bootseer_cli.envmount.runs import sweep

    sweep(keep="none")  # used a moment ago: kept
    assert shared_lowers_under(str(base)) == [lower]
    record = Path(lower + ".json")
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "used": time.time() - 2 * lowers.IDLE_S}))
    sweep(keep="none", lowers=[lower])  # the one a start is about to use: kept, however idle
    assert shared_lowers_under(str(base)) == [lower]
    sweep(keep="none")
    assert shared_lowers_under(str(base)) == [] and not os.path.exists(lower)


def test_a_lower_whose_fuse_server_died_is_mounted_again(base: Path, wheels: Path) -> None:
    root = base / "env"
    _publish(base, root, wheels)
    nd = node(base, "fresh")
    fuse = base / "fuse-bin"  # `mount` off PATH: squashfuse and fuse-overlayfs, as a plain user mounts
    fuse.mkdir()
    for tool in ("squashfuse_ll", "squashfuse", "fuse-overlayfs", "fusermount3", "fusermount", "sh", "env"):
        if shutil.which(tool):
            (fuse / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    assert "fuse squashfs" in _start(base, root, nd, path=str(fuse))
    [lower] = shared_lowers_under(str(base))
    pids = subprocess.run(["pgrep", "-f", f"squashfuse.* {lower}"], capture_output=True, text=True).stdout.split()
    assert pids, "no squashfuse server for the lower"
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)  # the job's cgroup ended, say: the mount stays, and answers nothing
    deadline = time.monotonic() + scaled(30)
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(OSError):
        os.listdir(lower)  # the dead lower, as the next start finds it

    assert "fuse squashfs" in _start(base, root, nd, path=str(fuse))  # the job ran on a live mount
    assert shared_lowers_under(str(base)) == [lower] and os.listdir(lower)  # the new server answers
    again = subprocess.run(["pgrep", "-f", f"squashfuse.* {lower}"], capture_output=True, text=True).stdout.split()
    assert again and not set(again) & set(pids), (again, pids)


def test_a_start_does_not_wait_forever_on_the_lowers_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another start holding the node's lowers lock (a mount that hangs) costs this start its deadline,
    then a BootseerError (the env stage extracts instead), never an endless wait."""
    from bootseer_cli.envmount import mounts
    from bootseer_cli.errors import BootseerError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(mounts, "MOUNT_TIMEOUT_S", 0.1)
    root = lowers.lowers_root()
    root.mkdir(parents=True, mode=0o700)
    (root / lowers.LOCK).touch()
    holder = subprocess.Popen(["flock", str(root / lowers.LOCK), "sleep", "600"])
    try:
        for _ in range(200):  # until the holder has it
            if subprocess.run(["flock", "-n", str(root / lowers.LOCK), "true"]).returncode:
                break
            time.sleep(0.05)
        with pytest.raises(BootseerError, match="stayed locked"):
            lowers.shared_lower(str(tmp_path / "no.squashfs"), "d" * 64)
        assert lowers.sweep_lowers(set()) == 0  # the sweep gives up as quietly
    finally:
        holder.kill()
        holder.wait()
