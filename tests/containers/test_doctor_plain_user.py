"""`bootseer doctor` run by a plain user on a node whose Docker engine runs (issue 46 finding 8): the
engine's socket is root's and the docker group's, and the user is in neither. doctor said "no Docker
engine … start dockerd" about an engine that was running; it must name the socket's permission."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.nobody import as_nobody

pytestmark = pytest.mark.integration

SOCK = "/var/run/docker.sock"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become the plain user (setpriv)")
def test_doctor_as_a_plain_user_names_the_sockets_permission_not_a_missing_engine(docker_client: object) -> None:
    assert os.path.exists(SOCK), "the engine's socket is missing"
    base = Path(tempfile.mkdtemp(prefix="bootseer-doctor-", dir="/tmp"))  # the user's own, 0777
    base.chmod(0o777)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "DOCKER_"))}
    env.update({"HOME": str(base), "XDG_CACHE_HOME": str(base / "cache"), "XDG_RUNTIME_DIR": str(base)})
    argv = [*as_nobody("dac_read_search"), sys.executable, "-m", "bootseer_cli", "doctor", "--json"]
    argv += ["--store", (base / "store").as_uri()]
    r = subprocess.run(argv, cwd=base, env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    docker = checks["docker"]
    assert docker["status"] == "warn", docker
    assert "permission denied" in docker["detail"] and SOCK in docker["detail"], docker
    assert "no Docker engine" not in docker["detail"], docker
    assert "docker" in docker["fix"] and "start dockerd" not in docker["fix"], docker
