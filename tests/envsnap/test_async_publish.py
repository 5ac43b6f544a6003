"""Capture before exec, upload in the agent (issue 16): the launcher starts before the upload ends, the
agent writes the ref and releases the lease; a builder whose agent dies mid-upload leaves the other
nodes to build once its lease expires; `[exec] agent = false` publishes before exec, as before.

Each node is a process in its own mount namespace with its own directory bound at the same env path
(as containers from one image); the store is a real S3 server (rclone) reached, for the builder,
through a loopback proxy that slows its uploads, so "the upload is still running" is a fact, not luck.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from bootseer_cli.envsnap.catalog import REF_KIND
from bootseer_cli.envsnap.lease import lease_key
from bootseer_cli.errors import StoreError
from bootseer_cli.store.core import open_store
from bootseer_cli.trust import default_domain
from tests.support import pkgindex
from tests.support.s3server import S3_ENV, S3Server
from tests.support.throttle import Throttle

pytestmark = pytest.mark.integration

BIND = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
BLOB_MB = 2  # incompressible: at 256 kB/s through the throttle, an upload of about 8 s
SLOW_BPS = 256_000
T = TypeVar("T")


def _config(path: Path, uri: str, env_at: Path, marker: Path, agent: bool, ttl: float = 60.0) -> Path:
    setup = (
        f"echo $$ >> {marker}; mkdir -p {env_at}/lib && echo built > {env_at}/lib/data.txt"
        f" && head -c {BLOB_MB * 1000 * 1000} /dev/urandom > {env_at}/lib/blob.bin"
        f" && sha256sum {env_at}/lib/blob.bin | cut -c1-64 > {env_at}/lib/blob.sha"
    )
    path.write_text(
        f'[store]\nuri = "{uri}"\n[exec]\nagent = {str(agent).lower()}\n'
        f'[env]\nroots = ["{env_at}"]\nwait_s = 120\nlease_ttl_s = {ttl}\nsetup = ["{setup}"]\n'
    )
    return path


def _node(tmp: Path, name: str, env_at: Path, config: Path, launcher: str) -> subprocess.Popen[str]:
    """`bootseer exec -- sh -c LAUNCHER` as a node: its own env directory bound at `env_at`."""
    node = tmp / name
    (node / "env").mkdir(parents=True)
    env = pkgindex.clean_env({**S3_ENV, "XDG_CACHE_HOME": str(node / "cache")})
    for k in [k for k in env if k.startswith("BOOTSEER_")]:
        del env[k]
    env["BOOTSEER_CONFIG"] = str(config)
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", BIND, "sh", str(node / "env"), str(env_at)]
    argv += [sys.executable, "-m", "bootseer_cli", "exec", "--", "sh", "-c", launcher]
    return subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _launcher(out: Path, env_at: Path) -> str:
    """Record when the launcher started, its run directory, and whether the env it sees is whole."""
    return (
        f"date +%s.%N > {out}.t; echo $BOOTSEER_RUN_DIR > {out}.run; "
        f'test "$(sha256sum {env_at}/lib/blob.bin | cut -c1-64)" = "$(cat {env_at}/lib/blob.sha)" '
        f"&& cat {env_at}/lib/data.txt > {out}"
    )


def _slow_uri(server: S3Server, prefix: str, proxy: Throttle) -> str:
    return server.uri(prefix).replace(server.endpoint, f"127.0.0.1:{proxy.port}")


def _wait_for(what: str, check: Callable[[], T], timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except StoreError:  # a read that raced the agent's write or delete of that object: see `_read`
            value = None  # type: ignore[assignment]
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _read(read: Callable[[], T]) -> T:
    """The test's own read of an object the agent may be replacing or deleting at that moment: the
    suite's S3 server (rclone serve s3) then sometimes answers with an error ("Failed to flush
    response stream"), which is the server's, not what these tests check. Tried again for 10 s."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return read()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _whole(node: Path) -> None:
    lib = node / "env" / "lib"
    assert (lib / "data.txt").read_text() == "built\n"
    assert hashlib.sha256((lib / "blob.bin").read_bytes()).hexdigest() == (lib / "blob.sha").read_text().strip()
    assert (node / "env" / ".bootseer-env.json").exists(), "the env is stamped"


def test_the_launcher_starts_before_the_upload_ends_and_the_agent_writes_the_ref(
    tmp_path: Path, s3_server: S3Server
) -> None:
    prefix = f"t-{os.urandom(6).hex()}"
    proxy = Throttle(("127.0.0.1", s3_server.port), SLOW_BPS).start()
    env_at, marker = tmp_path / "env", tmp_path / "setup-runs"
    env_at.mkdir()
    cfg = _config(tmp_path / "slow.toml", _slow_uri(s3_server, prefix, proxy), env_at, marker, agent=True)
    builder = _node(tmp_path, "a", env_at, cfg, _launcher(tmp_path / "a.out", env_at))
    _out, err = builder.communicate(timeout=180)
    assert builder.returncode == 0, err
    assert "the agent uploads it" in err, err
    store = open_store(s3_server.uri(prefix))
    # the launcher has run (and ended) with a whole env; the upload is still under way, under the lease
    assert (tmp_path / "a.out").read_text() == "built\n", err
    assert store.list_refs(REF_KIND) == [], "the ref was written before exec: the upload was on the critical path"
    run_dir = Path((tmp_path / "a.out.run").read_text().strip())
    log = run_dir / "agent.log"
    _wait_for("the agent's upload to start", lambda: log.exists() and "env-publish: uploading" in log.read_text())
    key = _wait_for("the ref", lambda: store.list_refs(REF_KIND))[0]
    lease_doc = _read(lambda: store.read_lease(lease_key(key)))
    ref = store.read_ref(REF_KIND, key)
    started = float((tmp_path / "a.out.t").read_text())
    assert started < ref["created"], "the launcher started after the ref was written"
    stamp = json.loads((tmp_path / "a" / "env" / ".bootseer-env.json").read_text())
    assert ref["blob"] == stamp["blob"], (ref, stamp)
    assert store.has_blob(ref["blob"])
    _wait_for("the lease's release", lambda: store.read_lease(lease_key(key)) is None, timeout=10)
    assert lease_doc is None or lease_doc.get("owner"), lease_doc
    _wait_for("the agent to end", lambda: "agent done" in log.read_text(), timeout=30)
    assert "env-publish: env" in log.read_text() and "published" in log.read_text(), log.read_text()
    cache = tmp_path / "a" / "cache"
    assert not list(cache.rglob("pending/*")), "the pending capture was adopted into the cache"
    assert list(cache.rglob(ref["blob"])), "the uploaded blob is in the node cache"
    # another node now restores what the agent published
    other = _node(tmp_path, "b", env_at, cfg, _launcher(tmp_path / "b.out", env_at))
    _out, err_b = other.communicate(timeout=180)
    assert other.returncode == 0 and "restored" in err_b, err_b
    _whole(tmp_path / "b")
    assert len(marker.read_text().split()) == 1
    proxy.stop()


def test_a_builder_killed_mid_upload_leaves_the_others_to_build_after_the_lease_expires(
    tmp_path: Path, s3_server: S3Server
) -> None:
    ttl = 3.0
    prefix = f"t-{os.urandom(6).hex()}"
    proxy = Throttle(("127.0.0.1", s3_server.port), SLOW_BPS // 4).start()  # an upload of about 30 s
    env_at, marker = tmp_path / "env", tmp_path / "setup-runs"
    env_at.mkdir()
    slow = _config(tmp_path / "slow.toml", _slow_uri(s3_server, prefix, proxy), env_at, marker, True, ttl)
    fast = _config(tmp_path / "fast.toml", s3_server.uri(prefix), env_at, marker, True, ttl)
    builder = _node(tmp_path, "a", env_at, slow, _launcher(tmp_path / "a.out", env_at))
    _out, err_a = builder.communicate(timeout=180)
    assert builder.returncode == 0 and "the agent uploads it" in err_a, err_a
    log = Path((tmp_path / "a.out.run").read_text().strip()) / "agent.log"
    _wait_for("the agent's upload to start", lambda: log.exists() and "env-publish: uploading" in log.read_text())
    others = [_node(tmp_path, n, env_at, fast, _launcher(tmp_path / f"{n}.out", env_at)) for n in ("b", "c")]
    time.sleep(2 * ttl)  # the builder's agent renews its lease: the others keep waiting
    store = open_store(s3_server.uri(prefix))
    assert store.list_refs(REF_KIND) == [] and len(marker.read_text().split()) == 1
    assert all(p.poll() is None for p in others), "a node stopped waiting while the lease was renewed"
    killed = time.time()
    os.kill(int((log.parent / "agent.pid").read_text()), signal.SIGKILL)  # mid-upload
    results = [p.communicate(timeout=180) for p in others]
    errs = [err for _out, err in results]
    assert [p.returncode for p in others] == [0, 0], errs
    assert all("another node is building" in e for e in errs), errs
    assert len(marker.read_text().split()) >= 2, "nobody built after the builder died"
    for n in ("a", "b", "c"):
        _whole(tmp_path / n)
    key = _wait_for("the new builder's ref", lambda: store.list_refs(REF_KIND), timeout=60)[0]
    assert store.read_ref(REF_KIND, key)["created"] > killed + ttl
    proxy.stop()


def test_without_the_agent_the_ref_is_written_before_exec(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    env_at, marker = tmp_path / "env", tmp_path / "setup-runs"
    env_at.mkdir()
    cfg = _config(tmp_path / "b.toml", store_dir.as_uri(), env_at, marker, agent=False)
    domain = store_dir / default_domain()  # refs and leases live in the user's trust domain
    launcher = f"ls {domain}/refs/env > {tmp_path}/refs-at-start; ls {domain}/leases > {tmp_path}/leases"
    node = _node(tmp_path, "a", env_at, cfg, launcher)
    _out, err = node.communicate(timeout=180)
    assert node.returncode == 0 and "published" in err and "the agent uploads it" not in err, err
    refs = (tmp_path / "refs-at-start").read_text().split()
    assert len(refs) == 1 and refs[0].endswith(".json"), refs
    assert (tmp_path / "leases").read_text().strip() == "", "the lease was released before exec"
