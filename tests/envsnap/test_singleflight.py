"""Single flight: several nodes start `bootseer exec` at once on one store with a cold cache; exactly one
runs the setup, the others wait for its snapshot and restore it.

Each node is a process in its own mount namespace with its own directory bound at the same env path,
so every node sees an empty env at one absolute path, as containers from one image do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import pkgindex
from tests.support.delayproxy import DelayProxy
from tests.support.s3server import S3_ENV, S3Server

pytestmark = pytest.mark.integration

NODES = 3
BIND = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


def _config(tmp_path: Path, store_uri: str) -> tuple[Path, Path]:
    """The project every node starts: its env at one path, a 3 s setup that counts its runs."""
    env_at = tmp_path / "env"  # the path every node sees its env at
    env_at.mkdir()
    marker = tmp_path / "setup-runs"
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store_uri}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{env_at}"]\nwait_s = 90\n'
        f'setup = ["echo $$ >> {marker}; sleep 3; mkdir -p {env_at}/lib && echo built > {env_at}/lib/data.txt"]\n'
    )
    return env_at, marker


def _start_nodes(tmp_path: Path, env_at: Path, name: str, nodes: int = NODES) -> list[tuple[Path, int, str]]:
    """`nodes` nodes (`name`0, `name`1, …, each with a fresh cache and env) start at once; (node, exit, stderr)."""
    procs = []
    for i in range(nodes):
        node = tmp_path / f"{name}{i}"
        (node / "env").mkdir(parents=True)
        env = pkgindex.clean_env({**S3_ENV, "XDG_CACHE_HOME": str(node / "cache")})
        for k in [k for k in env if k.startswith("BOOTSEER_")]:
            del env[k]
        launcher = ["sh", "-c", f"cat {env_at}/lib/data.txt > {node}/out"]
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            BIND,
            "sh",
            str(node / "env"),
            str(env_at),
            sys.executable,
            "-m",
            "bootseer_cli",
            "exec",
            "--",
            *launcher,
        ]
        procs.append(
            (
                node,
                subprocess.Popen(
                    argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                ),
            )
        )
    ran = []
    for node, p in procs:
        _out, err = p.communicate(timeout=180)
        ran.append((node, p.returncode, err))
    return ran


def _assert_one_built_the_rest_restored(ran: list[tuple[Path, int, str]], env_at: Path) -> None:
    errs = [err for _node, _rc, err in ran]
    assert [rc for _node, rc, _err in ran] == [0] * NODES, errs
    assert sum("published" in e for e in errs) == 1, errs
    assert sum("restored" in e for e in errs) == NODES - 1, errs
    for node, _rc, err in ran:
        assert (node / "out").read_text() == "built\n", err
        assert (node / "env" / "lib" / "data.txt").read_text() == "built\n"
        assert (node / "env" / ".bootseer-env.json").exists(), "each node's env is stamped"
    assert not (env_at / "lib").exists(), "nodes wrote only into their own namespaces"


def test_exactly_one_node_runs_the_setup(tmp_path: Path, store_uri: str) -> None:
    env_at, marker = _config(tmp_path, store_uri)
    ran = _start_nodes(tmp_path, env_at, "node")
    assert len(marker.read_text().split()) == 1, f"the setup ran more than once: {[e for *_, e in ran]}"
    _assert_one_built_the_rest_restored(ran, env_at)


def test_a_snapshot_that_cannot_be_restored_is_rebuilt_by_one_node(tmp_path: Path, store_uri: str) -> None:
    """The store's snapshot for the key is broken (its blob gone). Every node fails to restore it; one
    takes the lease and builds, and the others wait for its snapshot. Before, a waiting node's first
    poll read the same broken ref, tried it again, and then ran the setup itself: three setups, not one,
    and each node warned twice."""
    from bootseer_cli.store.core import Store

    env_at, marker = _config(tmp_path, store_uri)
    _assert_one_built_the_rest_restored(_start_nodes(tmp_path, env_at, "first"), env_at)
    store = Store(store_uri)
    (key,) = store.list_refs("env")
    store.delete_blob(store.read_ref("env", key)["blob"])

    ran = _start_nodes(tmp_path, env_at, "node")
    errs = [err for *_, err in ran]
    assert len(marker.read_text().split()) == 2, f"the broken snapshot was rebuilt more than once: {errs}"
    _assert_one_built_the_rest_restored(ran, env_at)
    assert all(e.count("could not restore") == 1 for e in errs), errs
    assert sum("waited for the builder" in e for e in errs) == NODES - 1, errs


def test_a_lease_write_the_store_refuses_for_a_moment_is_taken_again(tmp_path: Path, s3_server: S3Server) -> None:
    """A store that fails one request under load (CI: rclone's S3 server, "INTERNAL_FAILURE … Failed to
    flush response stream") made the node that was taking the build lease give up on it and run the
    setup "locally": a setup whose snapshot nobody publishes, while the other nodes wait on a lease no
    one holds. The first write of a lease claim fails here, on every attempt the S3 client makes (a
    proxy answers 500 InternalError); the node takes the lease on its next try, builds and publishes,
    and a second node restores."""
    from bootseer_cli.store.guard import META_ATTEMPTS

    with DelayProxy((s3_server.host, s3_server.port), delay_ms=0) as proxy:
        uri = s3_server.uri(f"t-{os.urandom(6).hex()}").replace(s3_server.endpoint, proxy.endpoint)
        env_at, marker = _config(tmp_path, uri)
        proxy.fail[("PUT", ".claims/")] = META_ATTEMPTS  # the first claim's write, and the client's retries
        ((_, rc, err),) = _start_nodes(tmp_path, env_at, "first", nodes=1)
        assert proxy.failed, "no claim write was refused: the test did not exercise the fault"
        assert rc == 0, err
        assert "published" in err and "running the setup locally" not in err, err
        ((_, rc, err),) = _start_nodes(tmp_path, env_at, "second", nodes=1)
    assert rc == 0 and "restored" in err, err
    assert len(marker.read_text().split()) == 1, "the setup ran twice"
