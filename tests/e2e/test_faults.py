"""Faults during a start of the example job. In each, the job either starts correctly by the slow
path or fails with a clear message, and nothing half-written stays behind.

The nodes start from a copy of the session's seed store, where the job already ran once (env
snapshot and checkpoint published), so each test pays for one start, not for a cold build first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from bootseer_cli.trust import default_domain
from tests.e2e.harness import DEPS_COMMAND, Run, env_kind, mounted, wait_for

pytestmark = pytest.mark.integration


def partial_files(root) -> list[str]:
    """Temporary files a fetch or an extraction would leave behind if it did not clean up."""
    return [str(p) for p in root.rglob("*") if ".part-" in p.name or p.name.endswith((".tmp", ".partial"))]


def assert_whole_env(node, seed) -> None:
    assert node.pip_freeze() == seed.freeze
    check = node.python("import bsexample_fnv, einops, msgpack, tabulate; print(bsexample_fnv.fnv1a64(b'a'))")
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == str(0xAF63DC4C8601EC8C)  # FNV-1a-64 of b"a": the compiled extension works


def assert_started_slow_path(run: Run, seed, kinds: tuple[str, ...] = ("fallback", "built")) -> None:
    assert run.rc == 0, run.output[-5000:]
    assert env_kind(run) in kinds, (run.stage("env"), run.output[-5000:])
    assert "Successfully installed" in run.output  # the setup ran
    assert "bootseer: warning:" in run.output  # and said why, loudly
    assert run.versions()["tabulate"] == "0.10.0"
    assert not run.leftover


def env_blob(store_dir) -> tuple[str, object]:
    refs = list((store_dir / default_domain() / "refs" / "env").glob("*.json"))
    assert len(refs) == 1, refs
    doc = json.loads(refs[0].read_text())
    digest = doc.get("blob") or doc.get("digest")
    path = store_dir / "blobs" / "sha256" / digest[:2] / digest
    assert path.is_file(), path
    return digest, path


def test_store_killed_during_restore(cluster, seed, s3_factory, monkeypatch):
    cluster.image = seed.image
    monkeypatch.setenv("RCLONE_BWLIMIT", "100k")  # a restore that takes seconds: long enough to be cut
    server = s3_factory()
    try:
        node = cluster.node("n1", seed.s3_store(server), BOOTSEER_EXEC_SKIP="image,checkpoint")
        started = node.start(command=DEPS_COMMAND)
        wait_for(lambda: partial_files(node.cache) or started.proc.poll() is not None, 300, "the snapshot download")
        assert started.proc.poll() is None, started.output()[-4000:]  # still downloading: now cut it
    finally:
        server.stop()
    run = started.wait()
    assert_started_slow_path(run, seed)
    assert not partial_files(node.cache)
    assert_whole_env(node, seed)


def test_corrupted_snapshot_blob(cluster, seed, tmp_path):
    cluster.image = seed.image
    store_dir = seed.copy_to(tmp_path / "store")
    digest, blob = env_blob(store_dir)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    node = cluster.node("n1", store_dir.as_uri(), BOOTSEER_EXEC_SKIP="image")
    run = node.run_job(steps=1, train_args=["--no-push"])
    assert_started_slow_path(run, seed)
    assert not list(node.cache.rglob(digest)), "the corrupt blob was kept in the node cache"
    assert not partial_files(node.cache)
    assert_whole_env(node, seed)
    # the checkpoint stage was unaffected: the job resumed where the seed run stopped
    assert int(run.one("resumed")["step"]) == seed.saved_step


def test_local_disk_full_during_restore(cluster, seed, s3_factory, tmp_path):
    """The node's blob cache on a tmpfs too small for the snapshot: the start runs without the node cache
    (one warning, issue 29) and restores through a private scratch directory, instead of filling the disk.

    An S3 store: a restore from a local file:// store reads the blob in place and needs no cache room."""
    cluster.image = seed.image
    small = tmp_path / "small-disk"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    server = s3_factory()
    try:
        node = cluster.node(
            "n1", seed.s3_store(server), BOOTSEER_EXEC_SKIP="image", BOOTSEER_STORE_CACHE_DIR=str(small)
        )
        run = node.start(command=DEPS_COMMAND).wait()
        assert run.rc == 0, run.output[-5000:]
        assert f"the node cache {small} is full: starting without it" in run.output
        assert run.output.count("bootseer: warning:") == 1, run.output[-5000:]  # said once
        assert env_kind(run) in ("restored", "hit"), (run.stage("env"), run.output[-5000:])
        assert run.versions()["tabulate"] == "0.10.0"
        assert not partial_files(small) and not run.leftover
        assert_whole_env(node, seed)
    finally:
        server.stop()
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_launcher_sigkilled_leaves_nothing(cluster, seed, tmp_path):
    """SIGKILL the launcher mid-run: the agent ends, the checkpoint mount goes, nothing keeps running.

    This node runs in the machine's own mount namespace (its venv at its own path, its env built
    from scratch under a fresh image key), so the mount it makes is visible here to be checked."""
    store = seed.file_store(tmp_path)
    node = cluster.node("n1", store, isolated=False, BOOTSEER_EXEC_SKIP="image")
    mnt = node.root / "mnt"
    started = node.start(
        steps=3, train_args=["--no-push", "--sleep-per-step", "30"], env={"BOOTSEER_CHECKPOINT_MOUNTPOINT": str(mnt)}
    )
    wait_for(lambda: "train: ready" in started.output(), 180, "the first training step")
    assert mounted(mnt), "the checkpoint was not mounted while the job ran"
    assert len(node.processes()) >= 4  # launcher, 2 workers, agent (and the mount server)
    os.kill(started.proc.pid, signal.SIGKILL)
    started.proc.wait(10)
    wait_for(lambda: not node.processes(), 60, "every process of the node to end")
    assert not mounted(mnt)
    run_dir = node.run_dirs()[-1]
    assert not (run_dir / "agent.pid").exists()
    assert "agent done" in (run_dir / "agent.log").read_text()
    assert int(started.output().split("train: resumed step=")[1].split()[0]) == seed.saved_step
    time.sleep(0.5)
    assert not node.processes()
