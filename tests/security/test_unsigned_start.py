"""Downgrades are not silent (issue 45, item 5). Without keys, `exec` used unsigned env and compile refs with
no word (only `doctor` warned), and the Slurm batch script quietly ran unsigned where its keys directory
was missing or unreadable. Now a start that uses a code-bearing ref unverified says so once, on one line,
with how to turn signing on, unless the configuration says `[trust] verify = "off"`; and the batch script
fails closed when its keys directory yields no readable key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.templates import render

NOTICE = "running unsigned"
PINNED = "registry.example:5000/team/train@sha256:" + "ab" * 32


def run_exec(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _job(tmp_path: Path, trust: str = "") -> tuple[Path, dict[str, str]]:
    work, tree = tmp_path / "work", tmp_path / "tree"
    work.mkdir(exist_ok=True)
    (work / "bootseer.toml").write_text(
        f'[exec]\nagent = false\n[env]\nroots = ["{tree}"]\nsetup = ["mkdir -p {tree} && echo hi > {tree}/f"]\n' + trust
    )
    return work, {**os.environ, "BOOTSEER_STORE": (tmp_path / "store").as_uri()}


def test_an_unsigned_restore_says_so_once(tmp_path: Path) -> None:
    work, env = _job(tmp_path)
    first = run_exec(work, env)
    assert first.returncode == 0 and "published" in first.stderr, first.stderr
    (tmp_path / "tree" / "f").unlink()  # another node: the env comes from the store's unsigned ref
    second = run_exec(work, env)
    assert second.returncode == 0 and "restored" in second.stderr, second.stderr
    lines = [line for line in second.stderr.splitlines() if NOTICE in line]
    assert len(lines) == 1, second.stderr
    assert "bootseer trust keygen" in lines[0] and "verify_keys" in lines[0]


def test_verify_off_is_said_by_the_config_and_stays_quiet(tmp_path: Path) -> None:
    work, env = _job(tmp_path, '[trust]\nverify = "off"\n')
    assert run_exec(work, env).returncode == 0
    (tmp_path / "tree" / "f").unlink()
    second = run_exec(work, env)
    assert second.returncode == 0 and "restored" in second.stderr, second.stderr
    assert NOTICE not in second.stderr


def _batch(tmp_path: Path, keys_dir: str) -> subprocess.CompletedProcess[str]:
    """The rendered batch script under bash, with stand-ins for srun and scontrol that record srun's env."""
    bin_dir, job = tmp_path / "bin", tmp_path / "job"
    bin_dir.mkdir(exist_ok=True)
    job.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text('#!/bin/sh\nenv > "$SRUN_ENV"\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "train.sbatch"
    script.write_text(render("slurm-job.sbatch", {"IMAGE": PINNED, "STORE": "s3://b/p", "KEYS_DIR": keys_dir}))
    (tmp_path / "srun.env").unlink(missing_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SRUN_ENV": str(tmp_path / "srun.env"), "SLURM_SUBMIT_DIR": str(job)}
    return subprocess.run(["bash", str(script)], env=env | {"USER": "u"}, capture_output=True, text=True, cwd=job)


@pytest.mark.parametrize("state", ["missing", "empty", "empty-key"])
def test_the_batch_script_fails_closed_without_a_readable_key(tmp_path: Path, state: str) -> None:
    keys = tmp_path / "keys"
    if state != "missing":
        keys.mkdir()
    if state == "empty-key":
        (keys / "ci.pub").write_text("")
    r = _batch(tmp_path, str(keys))
    assert r.returncode != 0 and not (tmp_path / "srun.env").exists(), r.stderr  # the job never started
    assert f"KEYS_DIR {keys}" in r.stderr and "--set KEYS_DIR=" in r.stderr
    # Unsigned on purpose, said at render time: the job runs (and exec says once that it is unsigned).
    r = _batch(tmp_path, "")
    assert r.returncode == 0, r.stderr
    assert "BOOTSEER_TRUST_VERIFY_KEYS" not in (tmp_path / "srun.env").read_text()
