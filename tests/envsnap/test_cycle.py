"""The whole cycle with real installers: `bootseer exec` runs a real pip/uv setup (wheels and a C-extension
sdist from a loopback index), captures and publishes it; "another node" (a fresh venv at the same path,
an empty node cache) restores it instead of installing, and ends up with the same environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envsnap.conftest import run_cli, tree_state
from tests.support import pkgindex

pytestmark = pytest.mark.integration

PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def make_venv(venv: Path) -> None:
    """A bare venv (the "image"), with a package of its own that the setup will remove."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    old = venv / "lib" / PY / "site-packages" / "old_pkg"
    old.mkdir()
    (old / "__init__.py").write_text("OLD = True\n")


def pip(venv: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args],
        env=env,
        capture_output=True,
        text=True,
    )


def test_capture_then_restore_on_a_fresh_node(tmp_path: Path, store_uri: str, pkg_index: pkgindex.PackageIndex) -> None:
    venv = tmp_path / "venv"
    make_venv(venv)
    site = venv / "lib" / PY / "site-packages"
    marker = tmp_path / "setup-runs"
    pkgs = "six idna bsdemo-cext"
    if store_uri.startswith("s3"):  # both installers, one per store, to keep the suite short
        install = f"{shutil.which('uv')} pip install --python {venv}/bin/python --compile-bytecode {pkgs}"
    else:
        install = f"{sys.executable} -m pip --python {venv}/bin/python install {pkgs}"
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store_uri}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{venv}"]\nwait_s = 30\n'
        f'setup = ["echo run >> {marker}", "{install}", "rm --recursive --force {site}/old_pkg"]\n'
    )
    check = "import bsdemo_cext, six, idna; print(bsdemo_cext.fnv(b'bootseer'))"
    argv = ["exec", "--", str(venv / "bin" / "python"), "-c", check]
    env = pkg_index.pip_env()

    first = run_cli(argv, tmp_path, tmp_path / "node1-cache", env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == str(pkgindex.fnv(b"bootseer"))
    assert "published" in first.stderr
    # what another node gets: modes without group/other write or setuid/setgid/sticky (pip's 0o666 .lock
    # comes back 0o644: a snapshot from a store never makes a root-restored tree writable by others)
    built = {p: (v[0], v[1] & 0o755, *v[2:]) if v[0] != "l" else v for p, v in tree_state(venv).items()}
    assert any(p.endswith(".pyc") for p in built), "bytecode is part of the snapshot"
    assert not (site / "old_pkg").exists()
    freeze = pip(venv, "freeze", env=env).stdout
    assert "bsdemo-cext==1.0" in freeze and "six==" in freeze

    shutil.rmtree(venv)  # another node: the same image (bare venv at the same path), an empty cache
    make_venv(venv)
    second = run_cli(argv, tmp_path, tmp_path / "node2-cache", env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == str(pkgindex.fnv(b"bootseer"))
    assert "restored" in second.stderr and "from store" in second.stderr
    assert marker.read_text().count("run") == 1, "the second node did not run the setup"
    assert tree_state(venv) == built, "the restored venv differs from the built one"
    assert pip(venv, "freeze", env=env).stdout == freeze
    checked = pip(venv, "check", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # a third start on the same node: the stamp says it is all there
    third = run_cli(argv, tmp_path, tmp_path / "node2-cache", env)
    assert third.returncode == 0 and "env present" in third.stderr, third.stderr
