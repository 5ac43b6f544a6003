"""Issue 45 item 3: root acting by path on bootseer's own files inside a tree a plain user can write.

The env roots (a venv) may be writable by the training user while root restores into them. Planted
at the names bootseer keeps there, the user's files made root: `rmtree` a directory outside the roots
(a journal naming `<root>/link/x`), unlink a file outside them (a paths file naming one), overwrite its
own files (links at the predictable `.tmp-<pid>` temporaries), hang (a FIFO stamp) and grow past 5 GB
(a stamp linked to /dev/zero). Each file is planted in the tree (the user owns it), then root runs.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.envsnap import journal
from bootseer_cli.envsnap.format import ArchiveEntry
from bootseer_cli.envsnap.manifest import CARRIED_NAME, JOURNAL_NAME, STAMP_NAME
from bootseer_cli.envsnap.stamp import stamp_state, strip_carried, write_stamp
from bootseer_cli.envsnap.tree import EnvTree
from tests.envsnap.conftest import run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks are on root (CI runs as root)")

USER = 65534  # who plants: owns the tree and everything in it


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """(root of a user-owned, user-writable env tree, a root-only directory outside it with a file)."""
    root = tmp_path / "env"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "mod.py").write_text("x = 1\n")
    for p in (root, root / "lib", root / "lib" / "mod.py"):
        os.chown(p, USER, USER)
    outside = tmp_path / "secret"
    (outside / "victim_dir").mkdir(parents=True)
    (outside / "victim_dir" / "data").write_text("root's\n")
    (outside / "victim_file").write_text("root's file\n")
    (outside / "pkg" / "__pycache__").mkdir(parents=True)
    (outside / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    outside.chmod(0o700)
    return root, outside


def _plant(path: Path, text: str | None = None, link: str | None = None) -> None:
    if link is not None:
        os.symlink(link, path)
    else:
        path.write_text(text or "")
    os.chown(path, USER, USER, follow_symlinks=False)


def _config(tmp_path: Path, root: Path) -> None:
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "file://{tmp_path}/store"\n[exec]\nagent = false\n[env]\nroots = ["{root}"]\n'
    )


def _everything(outside: Path) -> list[str]:
    return sorted(str(p.relative_to(outside)) for p in outside.rglob("*"))


def test_a_planted_journal_removes_nothing_outside_the_roots(tmp_path: Path) -> None:
    """The journal names undo directories, new paths and moves through `link` -> outside, and `..`:
    root's `bootseer baseline` recovers the "interrupted restore" and must leave outside as it was."""
    root, outside = _tree(tmp_path)
    before = _everything(outside)
    _plant(root / "link", link=str(outside))
    doc = {
        "v": 1,
        "committed": False,
        "undo_dirs": [f"{root}/link/victim_dir"],
        "new": [f"{root}/link/victim_file", f"{root}/link/victim_dir", f"{root}/../secret/pkg"],
        "moves": [[f"{root}/link/pkg", f"{root}/lib/moved"]],
    }
    _plant(root / JOURNAL_NAME, json.dumps(doc))
    _config(tmp_path, root)
    r = run_cli(["baseline", "--config", str(tmp_path / "bootseer.toml")], tmp_path, tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert _everything(outside) == before
    assert (outside / "victim_dir" / "data").read_text() == "root's\n"
    assert not (root / "lib" / "moved").exists()


def test_a_planted_paths_file_removes_nothing_outside_the_roots(tmp_path: Path) -> None:
    """The paths file lists an outside file (size and mtime matching: "as bootseer wrote it") and an
    outside package directory holding only bytecode, both through `link`: switching envs removes neither."""
    root, outside = _tree(tmp_path)
    before = _everything(outside)
    _plant(root / "link", link=str(outside))
    st = os.stat(outside / "victim_file")
    rows = [
        [f"{root}/link/victim_file", "f", st.st_size, int(st.st_mtime), ""],
        [f"{root}/link/pkg", "d", 0, 0, ""],
        [f"{root}/lib/mod.py", "f", 6, int(os.stat(root / "lib" / "mod.py").st_mtime), ""],
    ]
    _plant(root / CARRIED_NAME, json.dumps({"blob": "b" * 64, "entries": rows, "deletions": []}))
    said: list[str] = []
    strip_carried(EnvTree([str(root)]), said.append)
    assert _everything(outside) == before
    assert not (root / "lib" / "mod.py").exists(), "the tree's own listed file still goes"
    assert not (root / CARRIED_NAME).exists()


@pytest.mark.parametrize("target", ["file", "dir"])
def test_links_at_the_temporary_names_are_not_followed(tmp_path: Path, target: str) -> None:
    """Links at every temporary name the old writers used (`<name>.tmp-<pid>`) point at root's file
    (or a directory): writing the journal, the paths file and the stamp neither follows nor fails on them."""
    root, outside = _tree(tmp_path)
    victim = outside / ("victim_file" if target == "file" else "victim_dir")
    for name in (STAMP_NAME, CARRIED_NAME, JOURNAL_NAME):
        _plant(root / f"{name}.tmp-{os.getpid()}", link=str(victim))
        _plant(root / f".{name}.tmp-{os.getpid()}", link=str(victim))
    before = _everything(outside)
    roots = [str(root)]
    journal.write(roots, {"v": 1, "committed": False, "new": [], "moves": []})
    journal.remove(roots)
    entry = ArchiveEntry(f"{root}/lib/mod.py", "f", 0o644, 6, int(os.stat(root / "lib" / "mod.py").st_mtime), "")
    write_stamp(EnvTree(roots), ["k" * 64], "b" * 64, [entry])
    assert _everything(outside) == before
    assert (outside / "victim_file").read_text() == "root's file\n"
    assert EnvTree(roots).carried() is not None and stamp_state(EnvTree(roots), "k" * 64) == (True, "")


@pytest.mark.timeout(120)
def test_a_fifo_stamp_does_not_hang_the_start(tmp_path: Path) -> None:
    """A FIFO at the stamp's and the paths file's names (nobody ever writes to them): root's
    `bootseer baseline` and `restore` read neither, and go on (pytest-timeout bounds the hang)."""
    root, _ = _tree(tmp_path)
    for name in (STAMP_NAME, CARRIED_NAME, JOURNAL_NAME):
        os.mkfifo(root / name)
        os.chown(root / name, USER, USER)
    assert stamp_state(EnvTree([str(root)]), "k" * 64)[0] is False
    _config(tmp_path, root)
    r = run_cli(["baseline", "--config", str(tmp_path / "bootseer.toml")], tmp_path, tmp_path / "cache")
    assert r.returncode == 0, r.stderr


def _capped() -> None:
    """The child's address space is capped at 2 GiB: reading /dev/zero into memory fails there
    instead of taking the machine's memory (it grew past 5 GB)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.timeout(300)
def test_a_stamp_linked_to_dev_zero_is_not_read(tmp_path: Path) -> None:
    """Stamp and paths file linked to /dev/zero, and a sparse 4 GiB stamp: root's stamp check and
    `carried_note` read none of them (the child, capped at 2 GiB, would die of MemoryError)."""
    root, _ = _tree(tmp_path)
    _plant(root / STAMP_NAME, link="/dev/zero")
    _plant(root / CARRIED_NAME, link="/dev/zero")
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    with open(sparse / STAMP_NAME, "wb") as f:
        f.truncate(4 << 30)
    code = (
        "import sys\n"
        "from bootseer_cli.envsnap.stamp import stamp_state, carried_note\n"
        "from bootseer_cli.envsnap.tree import EnvTree\n"
        "for r in sys.argv[1:]:\n"
        "    t = EnvTree([r])\n"
        "    print(stamp_state(t, 'k' * 64), repr(carried_note(t)), t.carried())\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(root), str(sparse)],
        capture_output=True,
        text=True,
        preexec_fn=_capped,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("(False, 'unreadable stamp') '' None") == 2, r.stdout


def test_a_link_at_the_checkpoint_markers_old_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """The pull's marker beside a job's checkpoint directory (root's checkpoint stage writes it there)
    was written through `<marker>.<pid>.tmp`: a link planted at that name made root overwrite its target."""
    from bootseer_cli.stripe.layout import Manifest
    from bootseer_cli.stripe.pull import marker_path, write_marker

    job = tmp_path / "job"
    (job / "ckpt").mkdir(parents=True)
    os.chown(job, USER, USER)
    victim = tmp_path / "root-file"
    victim.write_text("root's\n")
    _plant(marker_path(job / "ckpt").with_suffix(f".{os.getpid()}.tmp"), link=str(victim))
    write_marker(job / "ckpt", Manifest("m", "v1", 1 << 16, [], [], []))
    assert victim.read_text() == "root's\n"
    assert json.loads(marker_path(job / "ckpt").read_text())["tag"] == "v1"
