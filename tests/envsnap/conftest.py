"""Fixtures for the env-snapshot tests: a loopback package index (session), tree helpers, a CLI runner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import pkgindex
from tests.support.s3server import S3_ENV


@pytest.fixture(scope="session")
def pkg_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pkgindex.PackageIndex]:
    """Small real wheels, setuptools (for the sdist's isolated build) and the C-extension sdist, on loopback."""
    root = tmp_path_factory.mktemp("index")
    pkgindex.wheelhouse(root, pkgindex.SMALL_WHEELS + pkgindex.BUILD_WHEELS)
    pkgindex.write_c_sdist(root)
    with pkgindex.PackageIndex(root) as index:
        yield index


def tree_state(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Everything under `root` (kind, mode, size, content or link target), to compare trees exactly."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if p in skip or name in (".bootseer-env.json", ".bootseer-env.paths"):
                continue
            st = os.lstat(p)
            if os.path.islink(p):
                out[p] = ("l", os.readlink(p))
            elif os.path.isdir(p):
                out[p] = ("d", st.st_mode & 0o7777)
            else:
                out[p] = ("f", st.st_mode & 0o7777, Path(p).read_bytes())
    return out


def run_cli(
    args: list[str],
    cwd: Path,
    cache: Path,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`bootseer ARGS` in a subprocess with its own node cache (XDG_CACHE_HOME), as a node would run it
    (under `prefix`: `strace …`, say)."""
    full = pkgindex.clean_env({**S3_ENV, **(env or {})})
    for k in [k for k in full if k.startswith("BOOTSEER_")]:
        del full[k]
    full.update({"XDG_CACHE_HOME": str(cache), "BOOTSEER_EXEC_AGENT": "0"})
    return subprocess.run(
        [*prefix, sys.executable, "-m", "bootseer_cli", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def killed_restore(cwd: Path, cache: Path, point: str) -> subprocess.CompletedProcess[str]:
    """`bootseer restore` killed (SIGKILL to its whole process group) at the fault point `point`."""
    env = {k: v for k, v in pkgindex.clean_env().items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(cache), "BOOTSEER_TEST_RESTORE_FAULT": point})
    killed = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "restore"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # its own process group: the fault kills the restore and its workers only
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    return killed
