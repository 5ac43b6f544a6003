"""No secret leaves memory: a store URI with credentials in it runs a whole `exec` whose stages hit
errors, and then every byte bootseer wrote is searched for the secret and the key id.

The credentials are given only in the URI (the AWS_* variables are removed from bootseer's
environment), so the job can only work against the loopback S3 server if they are really used.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, S3Server, free_port

pytestmark = pytest.mark.integration

BOOTSEER = [sys.executable, "-m", "bootseer_cli"]
SECRETS = (SECRET_KEY, ACCESS_KEY, quote(SECRET_KEY, safe=""), quote(ACCESS_KEY, safe=""))
QUERY_SECRET = "made-up-session-token-0451"


def _environ(uri: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env.update({"BOOTSEER_STORE": uri, "BOOTSEER_JOB_ID": f"sec-{os.urandom(4).hex()}", "HOME": str(tmp_path)})
    return env


def _job_dir(tmp_path: Path) -> Path:
    """A job whose env stage snapshots a small tree and whose checkpoint does not exist (an error)."""
    job = tmp_path / "job"
    root = tmp_path / "envroot"
    root.mkdir(parents=True)
    job.mkdir()
    (job / "bootseer.toml").write_text(
        f'[env]\nsetup = ["echo hi > {root}/made-by-setup"]\nroots = ["{root}"]\nwait_s = 5\n'
        '[checkpoint]\nname = "no-such-model"\n'
    )
    return job


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*BOOTSEER, *args], env=env, cwd=cwd, capture_output=True, timeout=timeout, check=False)


def _run_all(argvs: list[list[str]], env: dict[str, str], cwd: Path, timeout: float = 180) -> list[tuple[str, bytes]]:
    """Each `bootseer ARGS` at once (none writes what another reads; against a dead store each spends
    seconds in the client's retries, which need not be paid one after the other): (args, stdout+stderr)."""
    procs = [
        (args, subprocess.Popen([*BOOTSEER, *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for args in argvs
    ]
    out = []
    for args, p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append((" ".join(args), stdout + stderr))
    return out


def _wait_agent_done(runs: Path, timeout: float = 60) -> None:
    """The agent uploads the events at the end; wait until every agent of the run has said so."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        logs = list(runs.glob("*/agent.log"))
        if logs and all("agent done" in p.read_text(errors="replace") for p in logs):
            return
        time.sleep(0.2)
    raise AssertionError(
        f"the agent did not finish: {[p.read_text(errors='replace') for p in runs.glob('*/agent.log')]}"
    )


def _store_bytes(server: S3Server, prefix: str) -> list[tuple[str, bytes]]:
    """Every object under the store's prefix, and for Parquet files also their decoded values."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs = pafs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=server.endpoint,
        scheme="http",
        region="us-east-1",
    )
    out = []
    for info in fs.get_file_info(pafs.FileSelector(f"{server.bucket}/{prefix}", recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        with fs.open_input_stream(info.path) as f:
            data = f.read()
        out.append((info.path, data))
        if info.path.endswith(".parquet"):
            out.append((f"{info.path} (decoded)", repr(pq.read_table(info.path, filesystem=fs).to_pylist()).encode()))
    return out


def _local_bytes(*dirs: Path) -> list[tuple[str, bytes]]:
    out = []
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file() and not p.is_symlink():
                out.append((str(p), p.read_bytes()))
    return out


def _assert_clean(found: list[tuple[str, bytes]]) -> None:
    leaks = [(where, s) for where, data in found for s in (*SECRETS, QUERY_SECRET) if s.encode() in data]
    assert not leaks, f"secrets found in: {leaks}"


def _secret_uri(endpoint: str, prefix: str) -> str:
    return (
        f"s3://{ACCESS_KEY}:{SECRET_KEY}@bootseer/{prefix}?endpoint_override={endpoint}"
        f"&scheme=http&region=us-east-1&session_token={QUERY_SECRET}&connect_timeout=2&request_timeout=5"
    )


def test_no_secret_in_anything_bootseer_writes(s3_server: S3Server, tmp_path: Path, isolated_cache: Path) -> None:
    # rclone checks the access key and signature; a session token it ignores, so the job really works.
    prefix = f"sec-{os.urandom(6).hex()}"
    uri = _secret_uri(s3_server.endpoint, prefix)
    env = _environ(uri, tmp_path)
    job = _job_dir(tmp_path)
    found: list[tuple[str, bytes]] = []

    r = _run(["exec", "-v", "--", "sh", "-c", "exit 0"], env, job)
    assert r.returncode == 0, r.stderr.decode()
    assert b"no-such-model" in r.stderr  # the checkpoint stage did hit its error and warn about it
    found.append(("exec stderr", r.stdout + r.stderr))
    runs = isolated_cache / "bootseer" / "runs"
    _wait_agent_done(runs)

    found += _run_all(
        [["report", "--json"], ["report"], ["config"], ["config", "--json"], ["doctor"], ["doctor", "--json"]], env, job
    )
    html = tmp_path / "report.html"
    res = _run(["report", "--html", str(html)], env, job)
    assert res.returncode == 0 and html.is_file(), res.stderr.decode()
    # The events did reach the store (the report found them), through the secret URI alone.
    assert any(rel.endswith(".parquet") for rel, _ in _store_bytes(s3_server, prefix))

    found += _local_bytes(isolated_cache, tmp_path / "report.html")
    found += _store_bytes(s3_server, prefix)
    _assert_clean(found)
    for d in runs.iterdir():
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        for name in ("agent.json", "agent.log", "events.jsonl"):
            assert stat.S_IMODE((d / name).stat().st_mode) == 0o600, d / name


def test_no_secret_when_the_store_is_unreachable(tmp_path: Path, isolated_cache: Path) -> None:
    """Every stage fails against a dead endpoint: warnings, reasons and agent logs carry no secret."""
    uri = _secret_uri(f"127.0.0.1:{free_port()}", "dead")
    env = _environ(uri, tmp_path)
    job = _job_dir(tmp_path)
    r = _run(["exec", "-v", "--", "sh", "-c", "exit 0"], env, job)
    assert r.returncode == 0, r.stderr.decode()
    assert b"warning" in r.stderr
    found = [("exec stderr", r.stdout + r.stderr)]
    _wait_agent_done(isolated_cache / "bootseer" / "runs")
    found += _run_all([["config", "--json"], ["doctor", "--json"], ["doctor"], ["report", "--json"]], env, job)
    found += _local_bytes(isolated_cache)
    _assert_clean(found)
