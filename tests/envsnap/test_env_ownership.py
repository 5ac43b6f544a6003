"""Nothing a user installed is deleted without their say (issue 29, item 1), with real pip on a venv.

A venv that carries project A's env (restored by bootseer) and a package the user pip-installed on
top: `bootseer baseline` removes nothing; project B's exec removes only A's files that nobody changed
(said in one line, with a count); `snapshot` after a baseline over such a tree refuses to publish the
increment under the whole setup's key; a stamp whose files changed is a miss, never "env present".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.envsnap.conftest import run_cli, tree_state
from tests.support import pkgindex

pytestmark = pytest.mark.integration

PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def make_venv(venv: Path) -> Path:
    """A bare venv (the "image"); returns its site-packages."""
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "lib" / PY / "site-packages"


def pip_install(venv: Path, index: pkgindex.PackageIndex, *pkgs: str) -> None:
    """What a user does by hand, without bootseer."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", *pkgs],
        env=index.pip_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def project(d: Path, venv: Path, store: str, pkg: str) -> Path:
    """A project whose setup pip-installs `pkg` into `venv`."""
    d.mkdir(parents=True, exist_ok=True)
    install = f"{sys.executable} -m pip --python {venv}/bin/python install {pkg}"
    (d / "bootseer.toml").write_text(
        f'[store]\nuri = "{store}"\n[exec]\nagent = false\n[env]\nroots = ["{venv}"]\nwait_s = 30\n'
        f"setup = {json.dumps([install])}\n"
    )
    return d


def exec_in(d: Path, node: str, index: pkgindex.PackageIndex) -> subprocess.CompletedProcess[str]:
    r = run_cli(["exec", "--", "true"], d, d.parent / f"{node}-cache", index.pip_env())
    assert r.returncode == 0, r.stderr
    return r


def bare_cli(args: list[str], cwd: Path, venv: Path, store: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """`bootseer ARGS` in a directory with no bootseer.toml: the roots are the venv (as the default,
    the running interpreter's prefix, would be when bootseer runs from it)."""
    env = pkgindex.clean_env()
    for k in [k for k in env if k.startswith("BOOTSEER_")]:
        del env[k]
    env.update({"BOOTSEER_ENV_ROOTS": str(venv), "BOOTSEER_STORE_URI": store, "XDG_CACHE_HOME": str(cache)})
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def carrying_a(tmp_path: Path, index: pkgindex.PackageIndex) -> tuple[Path, Path, str]:
    """A venv into which bootseer restored project A's env (six, packaging), built first on another node."""
    venv, store = tmp_path / "venv", (tmp_path / "store").as_uri()
    a = project(tmp_path / "a", venv, store, "six packaging")
    make_venv(venv)
    assert "published" in exec_in(a, "builder", index).stderr
    site = make_venv(venv)
    assert "restored" in exec_in(a, "node", index).stderr
    assert (site / "six.py").exists()
    return venv, site, store


def test_baseline_removes_nothing(tmp_path: Path, pkg_index: pkgindex.PackageIndex) -> None:
    # a venv the user filled with pip alone
    plain = tmp_path / "plain"
    make_venv(plain)
    pip_install(plain, pkg_index, "idna")
    nocfg = tmp_path / "nocfg"
    nocfg.mkdir()
    before = tree_state(plain)
    r = bare_cli(["baseline"], nocfg, plain, (tmp_path / "store").as_uri(), tmp_path / "c0")
    assert r.returncode == 0, r.stderr
    assert tree_state(plain) == before and "remov" not in r.stderr
    assert "stamp" not in r.stdout, r.stdout  # no stamp there: nothing to say (issue 46 finding 8)

    # a venv carrying A's env, plus the user's own package on top (the reported case)
    venv, site, store = carrying_a(tmp_path, pkg_index)
    pip_install(venv, pkg_index, "idna")
    before = tree_state(venv)
    r = bare_cli(["baseline"], nocfg, venv, store, tmp_path / "c1")
    assert r.returncode == 0, r.stderr
    assert "removed" not in r.stderr and "removing" not in r.stderr, r.stderr
    # the stamp goes (the tree is about to change), and the verb says so rather than "only recording"
    assert "the tree's stamp was removed" in r.stdout, r.stdout
    assert tree_state(venv) == before, "baseline removed files"
    assert (site / "six.py").exists() and (site / "idna").is_dir()


def test_another_projects_exec_removes_only_the_old_envs_unchanged_files(
    tmp_path: Path, pkg_index: pkgindex.PackageIndex
) -> None:
    venv, site, store = carrying_a(tmp_path, pkg_index)
    b = project(tmp_path / "b", venv, store, "iniconfig")  # not in the store: this node sets it up
    pip_install(venv, pkg_index, "idna")  # the user's own package, on top of A
    six_dist = next(site.glob("six-*.dist-info"))
    (six_dist / "INSTALLER").write_text("edited by hand\n")  # a file of A's the user changed
    r = exec_in(b, "node", pkg_index)
    m = re.search(r"removing (\d+) path\(s\) bootseer wrote there and nobody changed since", r.stderr)
    assert m and int(m.group(1)) > 0, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if "removing" in ln]) == 1, r.stderr
    assert re.search(r"; \d+ path\(s\) changed since or holding other files stay", r.stderr), r.stderr
    assert not (site / "six.py").exists(), "A's unchanged file is left behind"
    assert (six_dist / "INSTALLER").read_text() == "edited by hand\n", "a file the user changed was removed"
    assert (site / "idna" / "__init__.py").exists(), "the user's package was removed"
    assert (site / "iniconfig").is_dir()
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import idna, iniconfig"], capture_output=True)
    assert check.returncode == 0, check.stderr


def test_switch_by_restore_keeps_the_users_package(tmp_path: Path, pkg_index: pkgindex.PackageIndex) -> None:
    venv, site, store = carrying_a(tmp_path, pkg_index)
    # project B, same venv path, built on another node (a fresh venv): the node carrying A restores it
    b = project(tmp_path / "b", venv, store, "iniconfig")
    saved = tmp_path / "saved-venv"
    shutil.move(str(venv), saved)
    make_venv(venv)
    assert "published" in exec_in(b, "builder-b", pkg_index).stderr
    shutil.rmtree(venv)
    shutil.move(str(saved), venv)
    pip_install(venv, pkg_index, "idna")
    r = exec_in(b, "node", pkg_index)
    assert "restored" in r.stderr, r.stderr
    assert re.search(r"switching envs: removing [1-9]\d* path\(s\)", r.stderr), r.stderr
    assert not (site / "six.py").exists()
    assert (site / "idna" / "__init__.py").exists(), "the user's package was removed"
    assert (site / "iniconfig").is_dir()


def test_snapshot_refuses_an_increment_over_a_carried_env(tmp_path: Path, pkg_index: pkgindex.PackageIndex) -> None:
    venv, _site, store = carrying_a(tmp_path, pkg_index)
    nocfg = tmp_path / "nocfg"
    nocfg.mkdir()
    cache = tmp_path / "manual-cache"

    def refs() -> list[str]:
        return sorted(
            r["env_key"] for r in json.loads(bare_cli(["env", "ls", "--json"], nocfg, venv, store, cache).stdout)
        )

    refs_before = refs()
    base = bare_cli(["baseline"], nocfg, venv, store, cache)
    assert base.returncode == 0 and "will refuse" in base.stderr, base.stderr
    pip_install(venv, pkg_index, "idna")  # the README's manual flow: an incremental install …
    snap = bare_cli(["snapshot"], nocfg, venv, store, cache)  # … and a snapshot of it
    assert snap.returncode != 0, snap.stdout + snap.stderr
    lines = snap.stderr.strip().splitlines()
    assert len(lines) == 1 and "not published" in lines[0] and "fresh venv" in lines[0], snap.stderr
    assert "Traceback" not in snap.stderr
    assert refs() == refs_before, "something was published"


def test_a_stamp_whose_files_changed_is_a_miss(tmp_path: Path, pkg_index: pkgindex.PackageIndex) -> None:
    venv, site, _store = carrying_a(tmp_path, pkg_index)
    a = tmp_path / "a"
    assert "env present" in exec_in(a, "node", pkg_index).stderr
    stamp = json.loads((venv / ".bootseer-env.json").read_text())
    victim = next(str(f) for f in sorted((site / "packaging").glob("*.py")) if str(f) not in stamp["sentinels"])
    os.unlink(victim)
    r = exec_in(a, "node", pkg_index)
    assert "env present" not in r.stderr, r.stderr
    assert "restored" in r.stderr and "stale stamp" in r.stderr, r.stderr
    assert os.path.exists(victim)
