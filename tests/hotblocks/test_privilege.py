"""Unprivileged recording is refused: mincore lies about files one neither owns nor may write.

The unprivileged side runs as `nobody` through setpriv, keeping only CAP_DAC_READ_SEARCH (read and
search everywhere, so the interpreter under /root can start; it grants no write, so mincore still
lies), which is exactly the situation of a job that runs as a user over a root-owned image.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.hotblocks.pagecache import evict, walk_files
from tests.support.nobody import NOBODY, as_nobody

from .conftest import write_config

AS_NOBODY = as_nobody("dac_read_search")


# The start, as a shell command (os.access() drops capabilities, so the launcher must be executable
# by nobody itself): 200 KB from the middle of f1, the head of f3, never f2.
def _start(tree: Path) -> list[str]:
    return [
        "/bin/sh",
        "-c",
        f"dd if={tree}/f1.bin of=/dev/null bs=4096 skip=256 count=49 status=none;"
        f" head -c 50000 {tree}/f3.bin >/dev/null",
    ]


def _as_nobody(args: list[str], home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(home), HOME=str(home))
    return subprocess.run([*AS_NOBODY, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def nobody_home(tmp_path: Path) -> Path:
    home = tmp_path / "nobody"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    return home


@pytest.mark.integration
def test_mincore_lies_to_nobody_about_root_files(tree: Path, nobody_home: Path) -> None:
    """The reason for the refusal: as nobody, an evicted root-owned file looks wholly resident."""
    evict(list(walk_files([tree])))
    probe = (
        "from bootseer_cli.hotblocks.pagecache import PAGE_SIZE, resident_runs; import sys; "
        "print(sum(n for _, n in resident_runs(sys.argv[1])) * PAGE_SIZE)"
    )
    r = _as_nobody([sys.executable, "-c", probe, str(tree / "f2.bin")], nobody_home, nobody_home)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == 3 << 20  # every page, though none is cached


@pytest.mark.integration
def test_unprivileged_recording_is_refused_with_a_clear_message(tree: Path, nobody_home: Path) -> None:
    r = _as_nobody(
        [
            sys.executable,
            "-m",
            "bootseer_cli",
            "hot",
            "record",
            "--root",
            str(tree),
            "--",
            *_start(tree),
        ],
        nobody_home,
        nobody_home,
    )
    assert r.returncode == 1
    assert "not recording hot blocks as uid 65534" in r.stderr and "mincore" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list(nobody_home.rglob("refs/hot/*.json"))

    # through exec: a warning, no record, and the job still runs
    write_config(nobody_home / "bootseer.toml", [tree], ready="quiet")  # found in the working directory
    r = _as_nobody(
        [sys.executable, "-m", "bootseer_cli", "exec", "--", "/bin/echo", "ran"],
        nobody_home,
        nobody_home,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran"
    assert "warning: image: not recording hot blocks" in r.stderr
    assert not list(nobody_home.rglob("refs/hot/*.json"))


@pytest.mark.integration
def test_an_owner_may_record_without_root(tree: Path, nobody_home: Path) -> None:
    for f in [tree, *tree.iterdir()]:
        os.chown(f, NOBODY, NOBODY)
    r = _as_nobody(
        [
            sys.executable,
            "-m",
            "bootseer_cli",
            "hot",
            "record",
            "--root",
            str(tree),
            "--",
            *_start(tree),
        ],
        nobody_home,
        nobody_home,
    )
    assert r.returncode == 0, r.stderr
    assert "recorded 2 files" in r.stderr  # the truth: f1 and f3, not every page of every file
