"""Single flight: several nodes start `bootseer exec` at once on one store with a cold cache; exactly one
runs the setup, the others wait for its snapshot and restore it.

Each node is a process in its own mount namespace with its own directory bound at the same env path,
so every node sees an empty env at one absolute path, as containers from one image do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import pkgindex
from tests.support.s3server import S3_ENV

pytestmark = pytest.mark.integration

NODES = 3
BIND = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


def test_exactly_one_node_runs_the_setup(tmp_path: Path, store_uri: str) -> None:
    env_at = tmp_path / "env"  # the path every node sees its env at
    env_at.mkdir()
    marker = tmp_path / "setup-runs"
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store_uri}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{env_at}"]\nwait_s = 90\n'
        f'setup = ["echo $$ >> {marker}; sleep 3; mkdir -p {env_at}/lib && echo built > {env_at}/lib/data.txt"]\n'
    )
    procs = []
    for i in range(NODES):
        node = tmp_path / f"node{i}"
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
            subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    results = [p.communicate(timeout=180) for p in procs]
    errs = [err for _out, err in results]
    assert [p.returncode for p in procs] == [0] * NODES, errs
    assert len(marker.read_text().split()) == 1, f"the setup ran more than once: {errs}"
    assert sum("published" in e for e in errs) == 1, errs
    assert sum("restored" in e for e in errs) == NODES - 1, errs
    for i in range(NODES):
        node = tmp_path / f"node{i}"
        assert (node / "out").read_text() == "built\n", errs[i]
        assert (node / "env" / "lib" / "data.txt").read_text() == "built\n"
        assert (node / "env" / ".bootseer-env.json").exists(), "each node's env is stamped"
    assert not (env_at / "lib").exists(), "nodes wrote only into their own namespaces"
