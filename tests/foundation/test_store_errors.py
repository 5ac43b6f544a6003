"""A store client's error in one short line (issue 46 finding 8: `gs://` and S3 warnings of ~1,300
characters). The real clients (pyarrow's Google Cloud and AWS SDKs) against a loopback port nothing
listens on: the line keeps the status and the cause, not Google's `error_info` dump, its link to the
authentication docs, or the AWS SDK's key-and-bucket preamble."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.store.fs import CLIENT_ERROR_MAX

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_an_unreachable_stores_error_is_one_short_line(tmp_path: Path, scheme: str) -> None:
    port = _closed_port()
    query = f"endpoint_override=127.0.0.1:{port}&scheme=http"
    uri = (
        f"gs://bucket/p?{query}&retry_limit_seconds=1" if scheme == "gs" else f"s3://bucket/p?{query}&region=us-east-1"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "AWS_", "GOOGLE_"))}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "cache"), "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "env", "ls", "--store", uri],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bootseer: error: "), r.stderr
    said = lines[0].split(": cannot list ", 1)[1]  # what the client said, after the store and the action
    assert len(said) <= len("refs/env: ") + CLIENT_ERROR_MAX, lines[0]
    assert "error_info" not in said and "cloud.google.com" not in said and "in bucket" not in said, said
    assert ("UNAVAILABLE" in said and "CURL error" in said) if scheme == "gs" else "NETWORK_CONNECTION" in said, said
