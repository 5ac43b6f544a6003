"""A secret in a client's error text (issue 45, item 8). bootseer redacted the store URI, but pyarrow,
having split `s3://KEY:abc/Secret@bucket/p` at the "/" of the secret, said `key 'Secret@bucket/p…'` in
the same message. Every message, warning and event passes `redact_text`, which now masks every secret
the process knows of (the URI's, with its "/"-separated pieces, and the environment's) wherever it is."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.redact import redact, redact_text
from tests.support.s3server import ACCESS_KEY, S3Server

pytestmark = pytest.mark.integration

# An AWS-like secret key: base64, with the "/" that real ones often hold, not percent-encoded.
SECRET = "Wz9kQ2/SuperSecretPart7Hq"


@pytest.fixture
def s3(tmp_path: Path, s3_env: dict[str, str]) -> Iterator[S3Server]:
    server = S3Server(tmp_path / "s3").start()
    yield server
    server.stop()


def test_pyarrow_echoing_the_secret_is_masked_everywhere(tmp_path: Path, s3: S3Server) -> None:
    uri = s3.uri("jobs").replace("s3://", f"s3://{ACCESS_KEY}:{SECRET}@", 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_ACCESS_KEY", "AWS_SECRET"))}
    env["BOOTSEER_STORE"] = uri
    work = tmp_path / "work"
    work.mkdir()
    (work / "bootseer.toml").write_text(f'[exec]\nagent = false\n[env]\nroots = ["{work}"]\nsetup = ["true"]\n')
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"],
        capture_output=True, text=True, cwd=work, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr  # an unreachable store never stops the job
    # premise: the client's own error is shown (since issue 46 its AWS part only: the "key '…' in bucket"
    # preamble, where pyarrow echoed the secret, is cut by store.fs.client_error, after redaction)
    assert "store unreachable" in r.stderr and "AWS Error" in r.stderr, r.stderr
    pieces = [SECRET, *SECRET.split("/")]
    assert not [p for p in pieces if p in r.stderr], r.stderr
    cache = Path(os.environ["XDG_CACHE_HOME"])
    events = list(cache.rglob("events.jsonl"))
    assert events, "no events file to check"
    for f in (p for p in cache.rglob("*") if p.is_file()):
        data = f.read_bytes()
        assert not [p for p in pieces if p.encode() in data], f


def test_redact_text_masks_what_redact_saw_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    redact("s3://AKIAEXAMPLE:abc/Another0Secret@bkt/p?session_token=Tok%2Fen0123456")
    text = redact_text("key 'Another0Secret@bkt/p' in bucket 'akiaexample'; token Tok/en0123456")
    assert "key '***@bkt/p' in bucket" in text and text.endswith("token ***"), text
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value-1")
    assert "env-secret-value-1" not in redact_text("signature for env-secret-value-1 failed")
    redact("hdfs://alice@namenode:8020/p")  # a user name is no secret: ordinary words stay readable
    assert redact_text("alice's job") == "alice's job"
