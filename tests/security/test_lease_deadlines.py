"""Every wait on another node has a deadline from the reader's own settings, never from the document.

A forged or far-future lease (`expires` a century away, `ttl: 4e9`) must not stop a job from starting:
the p2p fetch falls back to the store after `[p2p] deadline_s`, and an env build whose holder died is
taken over after the reader's `[env] lease_ttl_s` (plus skew), not `[env] wait_s`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bootseer_cli.config import load
from bootseer_cli.settings import P2PSettings, Settings
from bootseer_cli.store.core import Store
from tests.support import pkgindex
from tests.support.s3server import S3_ENV

pytestmark = pytest.mark.integration

FOREVER = {"expires": time.time() + 4e9, "ttl": 4e9, "host": "gone", "pid": 1}


def _p2p(**p2p: object) -> P2PSettings:
    return Settings.from_config(load(None, {("p2p", k): v for k, v in p2p.items()}, environ={})).p2p


def test_lease_live_ignores_a_ttl_beyond_the_readers(store_uri: str) -> None:
    st = Store(store_uri, settle_s=0.3)
    st.put_bytes("leases/env-forever", json.dumps({"owner": "x", **FOREVER}).encode())
    doc = st.read_lease("env-forever")
    assert st.lease_live("env-forever", doc, ttl_s=2.0)  # just written: held for the reader's TTL …
    assert not st.lease_live("env-forever", doc, ttl_s=2.0, now=time.time() + 5.0)  # … and no longer
    for bad in ({"expires": "NaN"}, {"expires": float("nan"), "ttl": 1}, {"expires": "soon"}):
        assert not st.lease_live("env-forever", bad, ttl_s=2.0)


def test_a_far_future_p2p_lease_falls_back_to_the_store_within_the_deadline(s3_server, tmp_path: Path) -> None:
    """Before: `_wait_for_torrent` waited for as long as the lease document said (forever)."""
    from bootseer_cli.delivery import fetch_blob
    from bootseer_cli.store.cache import BlobCache
    from tests.p2p.nodes import swarm_secret_file

    store = Store(s3_server.uri(f"t-deadline-{time.time_ns()}"), settle_s=0.3)
    digest = store.put_blob_bytes(b"a blob whose torrent never comes" * 1000)
    store.put_bytes(f"leases/p2p-{digest}", json.dumps({"owner": "forger", **FOREVER}).encode())
    secret = str(swarm_secret_file(tmp_path))  # the job's swarm secret: without one there is no swarm
    got: list[object] = []
    t0 = time.monotonic()
    fetch = threading.Thread(
        target=lambda: got.append(
            fetch_blob(
                _p2p(enabled=True, deadline_s=2, key_file=secret),
                store,
                digest,
                cache=BlobCache(tmp_path / "c", 1 << 30),
            )
        ),
        daemon=True,
    )
    fetch.start()
    fetch.join(20.0)
    assert got, "the fetch was still waiting for the forged lease's torrent after 20 s"
    elapsed = time.monotonic() - t0
    assert elapsed < 2 + 6, elapsed
    fetched = got[0]
    assert fetched.source == "store" and fetched.bytes_from_store == 32000  # type: ignore[attr-defined]
    assert "deadline_s" in fetched.note  # type: ignore[attr-defined]


# The reader's [env] lease_ttl_s: small, since the test waits one TTL (+ skew, TTL/2) for the dead holder.
LEASE_TTL_S = 1


def _exec(tmp_path: Path, store_uri: str, setup: str) -> subprocess.Popen[str]:
    env = pkgindex.clean_env({**S3_ENV, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    for k in [k for k in env if k.startswith("BOOTSEER_")]:
        del env[k]
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store_uri}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{tmp_path / "env"}"]\nwait_s = 300\nlease_ttl_s = {LEASE_TTL_S}\n'
        f"setup = [{json.dumps(setup)}]\n"
    )
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"]
    return subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def test_an_env_lease_with_a_huge_ttl_is_taken_over_after_the_readers_ttl(tmp_path: Path, store_uri: str) -> None:
    """Before: the next node waited `wait_s` (300 s here) for a holder that was long dead."""
    (tmp_path / "env").mkdir()
    building, die = tmp_path / "building", tmp_path / "die"
    # One setup for both nodes (it is part of the env key): the first one hangs, the second builds.
    setup = f"if [ -e {die} ]; then touch {building}; sleep 600; fi; echo built > {tmp_path}/built"
    die.touch()
    dying = _exec(tmp_path, store_uri, setup)
    deadline = time.monotonic() + 60
    while not building.exists() and dying.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert building.exists(), dying.communicate()
    os.killpg(dying.pid, signal.SIGKILL)  # the builder's node dies, holding the lease …
    dying.communicate()
    st = Store(store_uri)
    [rel] = st.list("leases")
    key = rel.rsplit("/", 1)[1]
    doc = st.read_lease(key)
    assert doc is not None
    doc.update(expires=time.time() + 4e9, ttl=4e9)  # … which claims to hold for a century
    st.put_bytes(f"leases/{key}", json.dumps(doc).encode())
    die.unlink()
    t0 = time.monotonic()
    run = _exec(tmp_path, store_uri, setup)
    try:
        _out, err = run.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        pytest.fail(f"the next start was still waiting on the dead node's lease after 90 s: {run.communicate()[1]}")
    elapsed = time.monotonic() - t0
    assert run.returncode == 0, err
    assert (tmp_path / "built").read_text() == "built\n"
    assert "within [env] wait_s" not in err, err
    assert elapsed < LEASE_TTL_S * 1.5 + 25, (elapsed, err)
