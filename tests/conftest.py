"""Shared fixtures: an isolated bootseer cache per test, real S3 servers on loopback, and the CI rule
that a skipped test fails the run (a skip there means a real engine was not exercised)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.s3server import S3_ENV, S3Server

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The suite's Ctrl-C tests signal the bootseer processes they start. A suite started as a background job
# of a shell without job control (`(nohup bash .ci/run &)`, a cron or CI wrapper) inherits SIGINT ignored,
# and an ignored disposition survives exec: every process a test started ignored Ctrl-C, and those tests
# failed for a reason that is not bootseer's (issue 46, an under-load run started that way). Python's
# own handler, set here, is reset to the default in every child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own node cache and local store (platformdirs honours XDG_CACHE_HOME)."""
    cache = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    for name in list(os.environ):
        if name.startswith("BOOTSEER_"):
            monkeypatch.delenv(name)
    return cache


@pytest.fixture(scope="session")
def s3_env() -> Iterator[dict[str, str]]:
    """The AWS_* variables the S3 servers below expect, set for the whole session."""
    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    yield dict(S3_ENV)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> Iterator[S3Server]:
    """One `rclone serve s3` on loopback for the session; tests use distinct prefixes."""
    server = S3Server(tmp_path_factory.mktemp("s3") / "data").start()
    yield server
    server.stop()


@pytest.fixture
def s3_factory(tmp_path: Path, s3_env: dict[str, str]) -> Iterator[callable]:
    """Start extra S3 servers (e.g. one per stripe target, or one to kill) for one test."""
    servers: list[S3Server] = []

    def make(**kwargs: object) -> S3Server:
        server = S3Server(tmp_path / f"s3-{len(servers)}" / "data", **kwargs).start()  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(params=["file", "s3"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store on the local filesystem and on the loopback S3 server."""
    if request.param == "file":
        return (tmp_path / "store").as_uri()
    server: S3Server = request.getfixturevalue("s3_server")
    return server.uri(f"t-{os.urandom(6).hex()}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skip is a failure: the point of the integration tests is that the real thing ran."""
    if not IN_CI:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        if reporter:
            reporter.write_line(f"CI: {len(skipped)} test(s) skipped; a skip fails the run in CI", red=True)
            for rep in skipped:
                reporter.write_line(f"  skipped: {rep.nodeid}: {rep.longrepr}")
        session.exitstatus = 1
