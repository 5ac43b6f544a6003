"""Bad input gets one clear line with the fix and a non-zero exit, never a traceback or a JVM dump."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.s3server import free_port

BOOTSEER = [sys.executable, "-m", "bootseer_cli"]
JDKS = sorted(p for p in Path("/usr/lib/jvm").glob("*") if (p / "lib" / "server" / "libjvm.so").is_file())


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "ARROW_LIBHDFS_DIR", "HADOOP_HOME")}
    environ.update(env)
    return subprocess.run([*BOOTSEER, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("verb", [["config"], ["exec", "--", "true"], ["doctor"]])
def test_a_config_that_is_not_utf8_is_one_line_exit_2(tmp_path: Path, verb: list[str]) -> None:
    (tmp_path / "bootseer.toml").write_bytes(b'[checkpoint]\nname = "caf\xe9"\n')
    r = _run(verb, tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bootseer: error: ") and "bootseer.toml: not UTF-8 text (" in lines[0], lines[0]


def _hdfs_uri() -> str:
    return f"hdfs://127.0.0.1:{free_port()}/bootseer"


@pytest.mark.parametrize("java_home", [None, *JDKS[:1]], ids=lambda j: "no-jvm" if j is None else "jvm")
def test_hdfs_without_libhdfs_is_one_line_with_the_fix(tmp_path: Path, java_home: Path | None) -> None:
    env = {"JAVA_HOME": str(java_home)} if java_home else {}
    r = _run(["report", "--store", _hdfs_uri()], tmp_path, **env)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bootseer: error: store 'hdfs://") and "ARROW_LIBHDFS_DIR" in lines[0], lines[0]
    assert ("libjvm" if java_home is None else "libhdfs") in lines[0]


def test_hdfs_without_libhdfs_warns_in_one_line_and_the_job_starts(tmp_path: Path) -> None:
    (tmp_path / "bootseer.toml").write_text('[checkpoint]\nname = "m"\n[exec]\nagent = false\n')
    r = _run(["exec", "--", "sh", "-c", "echo started"], tmp_path, BOOTSEER_STORE=_hdfs_uri())
    assert r.returncode == 0 and r.stdout == "started\n", r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("bootseer: warning:")]
    assert warnings and all("ARROW_LIBHDFS_DIR" in w for w in warnings), r.stderr
    assert "dlopen" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) <= len(warnings) + 1, r.stderr  # the warnings and the summary line
