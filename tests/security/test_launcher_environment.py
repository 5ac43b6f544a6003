"""The launcher's environment (issue 45, item 7): no signing key and no store credential of any kind, be it a
key pair, a credentials or config file, a profile, a web identity or a container credentials endpoint,
unless the job says `[exec] pass_store_credentials = true`. The signing key and the AWS files, profile and
web-identity variables used to reach the training job, which runs whatever code its dependencies brought."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.trust import keygen
from tests.support.s3server import S3Server

pytestmark = pytest.mark.integration

DUMP = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


@pytest.fixture
def s3(tmp_path: Path, s3_env: dict[str, str]) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "s3").start()
    yield server
    server.stop()


def _secrets(tmp_path: Path) -> dict[str, str]:
    """Every way a process can hold the store's credentials, or sign in the domain's name."""
    keygen(str(tmp_path / "me.key"), str(tmp_path / "me.pub"), "me")
    creds = tmp_path / "aws-credentials"
    creds.write_text("[bootseer-test]\naws_access_key_id = x\naws_secret_access_key = y\n")
    (tmp_path / "web-token").write_text("a-web-identity-token\n")
    return {
        "BOOTSEER_TRUST_SIGNING_KEY": str(tmp_path / "me.key"),
        "AWS_SHARED_CREDENTIALS_FILE": str(creds),
        "AWS_CONFIG_FILE": str(creds),
        "AWS_PROFILE": "bootseer-test",
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "web-token"),
        "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/trainer",
        "AWS_ROLE_SESSION_NAME": "bootseer",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://127.0.0.1:1/creds",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN": "a-container-token",
    }


def launcher_env(cwd: Path, env: dict[str, str]) -> dict[str, str]:
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", *DUMP]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stages", [True, False], ids=["with-stages", "no-stage"])
def test_no_key_and_no_credential_reaches_the_launcher(
    tmp_path: Path, s3: S3Server, s3_env: dict[str, str], stages: bool
) -> None:
    secrets = _secrets(tmp_path)
    env = {**os.environ, **s3_env, **secrets, "BOOTSEER_STORE": s3.uri("jobs")}
    work = tmp_path / "work"
    work.mkdir()
    (work / "bootseer.toml").write_text(
        "[exec]\nagent = false\n" + (f'[env]\nroots = ["{work}"]\nsetup = ["true"]\n' if stages else "")
    )
    seen = launcher_env(work, env)
    leaked = sorted(set(secrets) & set(seen)) + [n for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if n in seen]
    assert not leaked, leaked
    assert seen["BOOTSEER_STORE_WITHHELD"] == "1"
    (work / "bootseer.toml").write_text("[exec]\nagent = false\npass_store_credentials = true\n")
    seen = launcher_env(work, env)
    assert {n: seen.get(n) for n in secrets} == secrets  # a job that pushes checkpoints itself asked for them
