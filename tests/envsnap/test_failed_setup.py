"""A failed setup keeps the env the tree carried (issue 46 finding 4).

The tree carries env A (built and stamped by a start). The config changes to a setup that fails
(`false`, a command that does not exist): the start fails with the setup's status, as before, and
afterwards the tree still holds A's files and A's stamp, so the next start with config A finds its env
present (no restore, no setup). A failed setup that did change the tree is named, path by path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.envsnap.conftest import run_cli, tree_state

pytestmark = pytest.mark.integration


def _config(tmp: Path, setup: list[str], layers: bool) -> None:
    root, store = tmp / "env", tmp / "store"
    (tmp / "bootseer.toml").write_text(
        f'[store]\nuri = "{store.as_uri()}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{root}"]\nwait_s = 30\nlayers = {str(layers).lower()}\n'
        f"setup = {json.dumps(setup)}\n"
    )


def _env_a(tmp: Path) -> list[str]:
    root = tmp / "env"
    return [
        f"echo run >> {tmp}/runs",
        f"mkdir -p {root}/pkg/sub && echo A > {root}/pkg/a.py && echo B > {root}/pkg/sub/b.py",
        f"ln -sf pkg/a.py {root}/alias.py",
    ]


def _start(tmp: Path) -> tuple[int, str]:
    r = run_cli(["exec", "--", "true"], tmp, tmp / "cache")
    return r.returncode, r.stderr


@pytest.mark.parametrize(
    ("failing", "status", "layers", "restored"),
    [
        ("false", 1, False, False),
        ("no-such-command-bootseer-46", 127, False, False),
        ("no-such-command-bootseer-46", 127, True, False),
        ("false", 1, True, True),
    ],
)
def test_a_failed_setup_leaves_the_previous_env_and_its_stamp(
    tmp_path: Path, failing: str, status: int, layers: bool, restored: bool
) -> None:
    (tmp_path / "env").mkdir()
    _config(tmp_path, _env_a(tmp_path), layers)
    rc, err = _start(tmp_path)
    assert rc == 0 and "published" in err, err
    if restored:  # env A as a fresh node gets it: restored from the store into an empty tree
        shutil.rmtree(tmp_path / "env")
        shutil.rmtree(tmp_path / "cache")
        (tmp_path / "env").mkdir()
        rc, err = _start(tmp_path)
        assert rc == 0 and "restored" in err, err
    built = tree_state(tmp_path / "env")
    stamp = (tmp_path / "env" / ".bootseer-env.json").read_bytes()
    assert (tmp_path / "runs").read_text().count("run") == 1

    _config(tmp_path, [f"echo other >> {tmp_path}/runs", failing], layers)
    rc, err = _start(tmp_path)
    assert rc == status, err
    assert "[env] setup command failed" in err, err
    assert tree_state(tmp_path / "env") == built, "the failed setup stripped the previous env"
    assert (tmp_path / "env" / ".bootseer-env.json").read_bytes() == stamp, "the previous env's stamp is gone"
    assert not list((tmp_path / "env").glob(".bootseer-undo-*"))
    assert not (tmp_path / "env" / ".bootseer-env.journal").exists()

    _config(tmp_path, _env_a(tmp_path), layers)
    rc, err = _start(tmp_path)
    assert rc == 0 and "env present (stamp)" in err, err
    assert "restored" not in err and (tmp_path / "runs").read_text().count("run") == 1, err


def test_a_failed_setup_that_changed_the_tree_says_what_and_keeps_the_env_files(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()
    _config(tmp_path, _env_a(tmp_path), layers=False)
    rc, err = _start(tmp_path)
    assert rc == 0, err
    a = (tmp_path / "env" / "pkg" / "a.py").read_text()

    root = tmp_path / "env"
    _config(tmp_path, [f"mkdir -p {root}/half && echo x > {root}/half/new.py", "exit 3"], layers=False)
    rc, err = _start(tmp_path)
    assert rc == 3, err
    assert "the failed setup changed 2 path(s) under the roots" in err and f"{root}/half/new.py" in err, err
    assert (root / "pkg" / "a.py").read_text() == a and (root / "pkg" / "sub" / "b.py").exists()
    assert not (root / ".bootseer-env.json").exists(), "a stamp for a tree the setup changed"
    assert (root / ".bootseer-env.paths").exists(), "the previous env's files would be a user's"

    # the next start with config A switches back: the previous env's files go (they are bootseer's),
    # the failed setup's leftovers stay (nobody knows whose they are), and A is restored
    _config(tmp_path, _env_a(tmp_path), layers=False)
    rc, err = _start(tmp_path)
    assert rc == 0 and "restored" in err, err
    assert (root / "pkg" / "a.py").read_text() == a
