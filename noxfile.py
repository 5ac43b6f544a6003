"""Sessions: `nox -s tests` (the whole suite), `nox -s lint`, `nox -s bench` (benchmarks, on demand)."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """Unit and integration tests against real engines (S3 server, FUSE, Docker, libtorrent, pip/uv, torch)."""
    session.install("-e", ".[test]")
    session.install("torch==2.13.0")  # the CPU build, for checkpoints and the torchrun job
    session.run("pytest", "-ra", "--durations=15", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "noxfile.py")


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark, or the ones named: nox -s bench -- exec stripe."""
    session.install("-e", ".[test]")
    session.install("torch==2.13.0")
    names = session.posargs or ["exec", "envsnap", "stripe", "hotblocks", "p2p", "report", "e2e"]
    for name in names:
        session.run("python", f"tests/benchmarks/bench_{name}.py")
