"""Write credentials out of the launcher (issue 25): a training job gets neither the store URI (which
may carry keys) nor the variables the store's client reads its credentials from, unless the job
pushes checkpoints itself and says so; `ckpt push` inside such a job then says what to set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.s3server import S3Server

pytestmark = pytest.mark.integration

DUMP = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


def run_exec(cwd: Path, env: dict[str, str], *launcher: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", *launcher]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture
def s3(tmp_path: Path, s3_env: dict[str, str]) -> S3Server:
    server = S3Server(tmp_path / "s3").start()
    yield server
    server.stop()


def test_the_launcher_gets_no_store_credentials(tmp_path: Path, s3: S3Server, s3_env: dict[str, str]) -> None:
    env = {**os.environ, **s3_env, "BOOTSEER_STORE": s3.uri("jobs")}
    (tmp_path / "bootseer.toml").write_text('[exec]\nagent = false\n[env]\nsetup = ["true"]\n')
    r = run_exec(tmp_path, env, *DUMP)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert "AWS_SECRET_ACCESS_KEY" not in seen and "AWS_ACCESS_KEY_ID" not in seen
    assert seen["BOOTSEER_STORE_WITHHELD"] == "1" and seen["BOOTSEER_STORE"] == env["BOOTSEER_STORE"]  # a location
    key, secret = s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_SECRET_ACCESS_KEY"]
    with_secret = {**env, "BOOTSEER_STORE": s3.uri("jobs").replace("s3://", f"s3://{key}:{secret}@", 1)}
    seen = json.loads(run_exec(tmp_path, with_secret, *DUMP).stdout.strip().splitlines()[-1])
    assert "BOOTSEER_STORE" not in seen  # a URI that carries the secret is a credential itself
    (tmp_path / "bootseer.toml").write_text("[exec]\nagent = false\npass_store_credentials = true\n")
    seen = json.loads(run_exec(tmp_path, env, *DUMP).stdout.strip().splitlines()[-1])
    assert seen["AWS_SECRET_ACCESS_KEY"] == s3_env["AWS_SECRET_ACCESS_KEY"] and "BOOTSEER_STORE" in seen


def test_ckpt_push_inside_the_job_says_what_to_set(tmp_path: Path, s3: S3Server, s3_env: dict[str, str]) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "w.bin").write_bytes(os.urandom(4096))
    env = {**os.environ, **s3_env}
    (tmp_path / "bootseer.toml").write_text(f'[store]\nuri = "{s3.uri("jobs")}"\n[exec]\nagent = false\n')
    push = [sys.executable, "-m", "bootseer_cli", "ckpt", "push", "ck", "--name", "m"]
    r = run_exec(tmp_path, env, *push)
    assert r.returncode != 0 and "pass_store_credentials = true" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
