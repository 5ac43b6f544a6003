"""Helpers for the hot-block tests: a small tree of files (never the machine's own roots, so eviction
disturbs nothing), the `bootseer` CLI as a subprocess, and page-cache probes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bootseer_cli.hotblocks.pagecache import PAGE_SIZE, resident_runs

MiB = 1 << 20


def bootseer(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def resident_set(path: Path) -> set[int]:
    """Resident page numbers of `path`."""
    return {p for first, n in resident_runs(str(path)) for p in range(first, first + n)}


def pages(offset: int, length: int) -> set[int]:
    return set(range(offset // PAGE_SIZE, (offset + length - 1) // PAGE_SIZE + 1))


def write_config(path: Path, roots: list[Path], **image: object) -> Path:
    lines = ["[image]", f"roots = [{', '.join(repr(str(r)) for r in roots)}]"]
    for k, v in image.items():
        lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_for(pred: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# The start we record and replay: reads 200 KB in the middle of f1 and the head of f3, never f2.
PROGRAM = """
import os, sys
root = sys.argv[1]
with open(os.path.join(root, "f1.bin"), "rb") as f:
    f.seek(1 << 20)
    f.read(200_000)
with open(os.path.join(root, "f3.bin"), "rb") as f:
    f.read(50_000)
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Three 3 MiB files of random bytes."""
    root = tmp_path / "tree"
    root.mkdir()
    for i in (1, 2, 3):
        (root / f"f{i}.bin").write_bytes(os.urandom(3 * MiB))
    return root


@pytest.fixture
def program(tmp_path: Path) -> Path:
    p = tmp_path / "prog.py"
    p.write_text(PROGRAM)
    return p


# The start of the loader tests (test_loaders, test_juicefs, test_capped_loader): imports-like reads of
# 40 small files, the head of one big file, then ready.
PROG = """
import os, sys, bootseer_cli
root = sys.argv[1]
for i in range(40):
    with open(os.path.join(root, "pkg", f"m{i:03d}.py"), "rb") as f:
        f.read()
with open(os.path.join(root, "big0.bin"), "rb") as f:
    f.read(300_000)
bootseer_cli.ready()
"""


@pytest.fixture
def prog(tmp_path: Path) -> Path:
    p = tmp_path / "prog.py"
    p.write_text(PROG)
    return p
