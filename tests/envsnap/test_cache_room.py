"""Issue 46, findings 1 and 3: a node cache that cannot hold the snapshot never costs the env.

A read-only node cache holding the default store (a read-only image's cache, a shared read-only mount)
still gives its snapshot to a fresh node: the store is read where it is, never swapped for a temporary
one, and nothing of the start is left in TMPDIR once the agent ends. A node cache smaller than the
snapshot (a small tmpfs) is not filled until the disk is full: the size is checked first, and the
snapshot is restored from the store straight into the roots, with one line that says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.envsnap.conftest import tree_state
from tests.support.s3server import S3_ENV, S3Server

SRC = str(Path(__file__).resolve().parents[2] / "src")
AGENT_GONE_S = 120.0  # the agent ends soon after the job; a bound for the poll, not a time budget


def _env(cache: Path, tmpdir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update(XDG_CACHE_HOME=str(cache), TMPDIR=str(tmpdir), PYTHONPATH=SRC, **extra)
    return env


def _project(tmp_path: Path, setup: str, store: str | None = None) -> tuple[Path, Path]:
    """A project whose setup (counted in `setups`) writes `setup`'s files under its root."""
    proj, root = tmp_path / "proj", tmp_path / "envroot"
    proj.mkdir()
    root.mkdir()
    count = f"echo ran >> {tmp_path}/setups"
    doc = f'[env]\nsetup = [{f"{setup} && {count}"!r}]\nroots = ["{root}"]\n'
    if store:
        doc = f'[store]\nuri = "{store}"\n' + doc
    (proj / "bootseer.toml").write_text(doc)
    return proj, root


def _setups(tmp_path: Path) -> int:
    f = tmp_path / "setups"
    return len(f.read_text().splitlines()) if f.exists() else 0


def _exec(
    proj: Path, env: dict[str, str], wrap: list[str] | None = None, job: str = "exit 7"
) -> subprocess.CompletedProcess[str]:
    argv = [*(wrap or []), sys.executable, "-m", "bootseer_cli", "exec", "--", "sh", "-c", job]
    r = subprocess.run(argv, cwd=proj, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 7, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _warnings(r: subprocess.CompletedProcess[str]) -> list[str]:
    """The start's warnings but the notice of an unsigned store (once per start, not ours to count)."""
    return [w for w in r.stderr.splitlines() if "warning" in w and "running unsigned" not in w]


def _fresh_node(root: Path) -> None:
    """The roots of a node that never ran this env (no files, no stamp)."""
    shutil.rmtree(root)
    root.mkdir()


def _read_only_wrap(directory: Path) -> list[str]:
    """A command prefix that runs with `directory` read-only: a read-only bind mount in a private mount
    namespace for root (which ignores mode bits), the mode bits for anyone else."""
    if os.geteuid() != 0:
        for d, _, _ in os.walk(directory):
            os.chmod(d, 0o555)
        return []
    if not shutil.which("unshare"):
        pytest.fail("root without unshare(1): cannot make a read-only mount")
    script = f'mount --bind -o ro "{directory}" "{directory}" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def _gone_in_time(tmpdir: Path) -> list[str]:
    """What is left of bootseer in `tmpdir` once the agent ended (polled: the agent outlives the job)."""
    deadline = time.monotonic() + AGENT_GONE_S
    while True:
        left = sorted(p.name for p in tmpdir.iterdir())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_read_only_cache_still_gives_its_store_snapshot_and_leaves_nothing_in_tmpdir(tmp_path: Path) -> None:
    """Before: the default store under a read-only cache was swapped for an empty temporary one, so the
    setup ran on every start and its snapshot was "published" into TMPDIR, which kept it after the job."""
    cache, tmpdir = tmp_path / "cache", tmp_path / "tmp"
    tmpdir.mkdir()
    proj, root = _project(tmp_path, f"head -c 300000 /dev/urandom > {tmp_path}/envroot/lib.so")
    _exec(proj, _env(cache, tmpdir, BOOTSEER_EXEC_AGENT="0"))  # a node with a writable cache publishes
    assert _setups(tmp_path) == 1
    want = tree_state(root)
    _fresh_node(root)
    r = _exec(proj, _env(cache, tmpdir), _read_only_wrap(cache))
    assert _setups(tmp_path) == 1, r.stderr  # restored from the read-only store: no setup
    assert tree_state(root) == want
    assert "restored" in r.stderr, r.stderr
    assert _warnings(r) == [next(w for w in _warnings(r) if "read-only" in w)], r.stderr
    assert _gone_in_time(tmpdir) == []


def test_a_plain_users_read_only_cache_still_gives_its_store_snapshot() -> None:
    """The same as a plain user whose cache is a 0555 tree (mode bits, not a mount): the store is read,
    nothing is published, and nothing stays in TMPDIR once the agent ends."""
    from tests.slurm.plainuser import plain_user, user_bin, world_dir

    user = plain_user()
    with world_dir("bootseer-rocache-") as base:  # tmp_path is root's 0700: the user works in a 0755 one
        bootseer = str(user_bin(user, base) / "bootseer")
        cache, tmpdir = base / "cache", base / "tmp"
        tmpdir.mkdir()
        proj, root = _project(base, f"head -c 300000 /dev/urandom > {base}/envroot/lib.so")
        (base / "setups").touch()
        for d in (cache, tmpdir, proj, root, base / "setups"):
            if not d.exists():
                d.mkdir()
            os.chown(d, user.uid, user.gid)
        env = ["env", f"XDG_CACHE_HOME={cache}", f"TMPDIR={tmpdir}", f"HOME={base}"]

        def start(*extra: str) -> subprocess.CompletedProcess[str]:
            argv = [*env, *extra, bootseer, "exec", "--", "sh", "-c", "exit 7"]
            r = user.run(*argv, cwd=proj, timeout=600)
            assert r.returncode == 7 and "Traceback" not in r.stderr, r.stderr
            return r

        start("BOOTSEER_EXEC_AGENT=0")  # a writable cache: builds and publishes
        assert _setups(base) == 1
        want = tree_state(root)
        _fresh_node(root)
        os.chown(root, user.uid, user.gid)
        for d, _, _ in os.walk(cache):
            os.chmod(d, 0o555)
        try:
            r = start()
            assert _setups(base) == 1, r.stderr  # restored from the store under the 0555 cache
            assert tree_state(root) == want
            assert len(_warnings(r)) == 1 and "not writable" in _warnings(r)[0], r.stderr
            assert _gone_in_time(tmpdir) == []
        finally:
            for d, _, _ in os.walk(cache):
                os.chmod(d, 0o755)


def test_a_read_only_default_store_says_it_cannot_publish(tmp_path: Path) -> None:
    """No snapshot yet and the default store read-only: the setup runs, and one line says the snapshot
    cannot be published there, instead of a publish into a temporary directory."""
    cache, tmpdir = tmp_path / "cache", tmp_path / "tmp"
    tmpdir.mkdir()
    (cache / "bootseer").mkdir(parents=True)
    proj, _ = _project(tmp_path, f"echo x > {tmp_path}/envroot/f")
    r = _exec(proj, _env(cache, tmpdir), _read_only_wrap(cache))
    assert _setups(tmp_path) == 1
    why = [w for w in _warnings(r) if "read-only" not in w.split(":")[2]]
    assert len(why) == 1 and "no snapshot can be published there" in why[0], r.stderr
    assert not any(tmpdir.glob("**/refs")), "a snapshot went to a temporary store"
    assert _gone_in_time(tmpdir) == []


SNAPSHOT_MB = 40  # random bytes: the blob is about as large, more than the small cache below holds
SMALL_CACHE_MB = 32  # what the tmpfs holds: less than the snapshot, more than nodedirs' "full" mark


def _small_tmpfs_wrap(directory: Path) -> list[str]:
    """A command prefix that runs with a `SMALL_CACHE_MB` tmpfs at `directory` (a private mount
    namespace: the mount goes with the command)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("mounting a small tmpfs as the node cache needs root and unshare(1)")
    directory.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={SMALL_CACHE_MB}m tmpfs "{directory}" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def test_a_cache_smaller_than_the_snapshot_is_bypassed_after_a_size_check(tmp_path: Path, s3_server: S3Server) -> None:
    """Before: the download filled the small cache until the disk was full, failed, and the setup ran on
    every start. Now the blob's size is checked against the cache's free space first, and the snapshot
    goes from the store straight into the roots, with one line saying why the cache was not used."""
    uri = f"s3://{s3_server.bucket}/room-{os.urandom(6).hex()}?endpoint_override=127.0.0.1:{s3_server.port}&scheme=http"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    make = f"head -c {SNAPSHOT_MB << 20} /dev/urandom > {tmp_path}/envroot/big.bin"
    proj, root = _project(tmp_path, make, store=uri)
    agentless = {"BOOTSEER_EXEC_AGENT": "0"}
    _exec(proj, _env(tmp_path / "cache-a", tmpdir, **S3_ENV, **agentless))  # publishes to the store
    assert _setups(tmp_path) == 1
    want = tree_state(root)
    _fresh_node(root)
    small = tmp_path / "cache-b"
    r = _exec(proj, _env(small, tmpdir, **S3_ENV, **agentless), _small_tmpfs_wrap(small))
    assert _setups(tmp_path) == 1, r.stderr  # restored: no setup
    assert tree_state(root) == want
    warnings = _warnings(r)
    assert len(warnings) == 1 and "too little for a" in warnings[0], r.stderr
    assert "straight into the roots" in warnings[0]
    assert list(tmpdir.iterdir()) == []  # streamed through a file with no name


def test_a_read_only_cache_streams_a_remote_snapshot_into_the_roots(tmp_path: Path, s3_server: S3Server) -> None:
    """With a read-only cache and a remote store, the snapshot was downloaded into a scratch blob cache in
    TMPDIR for the whole job; now it goes from the store straight into the roots, with no second warning."""
    uri = f"s3://{s3_server.bucket}/ro-{os.urandom(6).hex()}?endpoint_override=127.0.0.1:{s3_server.port}&scheme=http"
    cache, tmpdir = tmp_path / "cache", tmp_path / "tmp"
    tmpdir.mkdir()
    proj, root = _project(tmp_path, f"head -c 3000000 /dev/urandom > {tmp_path}/envroot/lib.so", store=uri)
    _exec(proj, _env(cache, tmpdir, **S3_ENV, BOOTSEER_EXEC_AGENT="0"))
    want = tree_state(root)
    _fresh_node(root)
    blob_in_tmpdir = f'find "{tmpdir}" -type f -size +1000k | grep -q . && exit 8; exit 7'  # while the job runs
    r = _exec(proj, _env(cache, tmpdir, **S3_ENV), _read_only_wrap(cache), job=blob_in_tmpdir)
    assert _setups(tmp_path) == 1, r.stderr
    assert tree_state(root) == want
    assert len(_warnings(r)) == 1 and "read-only" in _warnings(r)[0], r.stderr
    assert _gone_in_time(tmpdir) == []
