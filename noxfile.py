"""Sessions: `nox -s tests` (the whole suite), `nox -s lint`, `nox -s docs` (the docs site, built strictly, and the
generated references checked), `nox -s tests_lowest` (the CLI at the lowest typer pyproject.toml allows),
`nox -s bench` (benchmarks, on demand)."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "docs", "tests_lowest", "tests"]  # tests_lowest: ~40 s from scratch; the suite last
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """Unit and integration tests against real engines (S3 server, FUSE, Docker, libtorrent, pip/uv, torch)."""
    session.install("-e", ".[test]")
    session.install("torch==2.13.0")  # the CPU build, for checkpoints and the torchrun job
    session.run("pytest", "-ra", "--durations=15", *session.posargs)


def _floor(name: str) -> str:
    """The lowest version of `name` that pyproject.toml's dependencies allow (its `>=` bound)."""
    import re
    from pathlib import Path

    import tomllib

    deps = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        m = re.match(rf"^{re.escape(name)}\s*>=\s*([0-9][0-9.]*)", dep)
        if m:
            return m.group(1)
    raise ValueError(f"pyproject.toml has no lower bound for {name}")


@nox.session
def tests_lowest(session: nox.Session) -> None:
    """The verbs and the CLI conventions with the lowest typer the range allows (issue 17): the range's
    lower end is tested, not assumed (its own environment: ~40 s from scratch, 20 s reused)."""
    session.install("-e", ".[test]")
    session.install(f"typer=={_floor('typer')}")
    session.run("python", "-c", "import importlib.metadata as m; print('typer', m.version('typer'))")
    tests = ["tests/foundation/test_cli.py", "tests/foundation/test_conventions.py"]
    session.run("pytest", "-q", "-p", "no:cacheprovider", *tests, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, then mypy over src/ (pyproject.toml's [tool.mypy]) against the installed dependencies' own
    types: the project is installed too, so typer, cryptography, zstandard, libtorrent are checked."""
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "noxfile.py")
    session.install("-e", ".", "mypy>=1.13,<2")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site (MkDocs with Material, mkdocs.yml) built with --strict into a temporary folder: a broken
    link, a page missing from the nav or a bad anchor fails it. Then the generated references
    (docs/reference/, templates/bootseer.toml) are checked against the code they are made from."""
    import tempfile

    session.install("-e", ".")
    session.install("mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10")
    session.run("python", "-m", "bootseer_cli.reference", "--check")
    with tempfile.TemporaryDirectory(prefix="bootseer-site-") as site:
        session.run("mkdocs", "build", "--strict", "--site-dir", site, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark, or the ones named: nox -s bench -- exec stripe."""
    session.install("-e", ".[test]")
    session.install("torch==2.13.0")
    names = session.posargs or ["exec", "envsnap", "stripe", "hotblocks", "p2p", "report", "e2e"]
    for name in names:
        session.run("python", f"tests/benchmarks/bench_{name}.py")
