"""Issue 26, case 5: the tree lock belongs to the tree, and recovery never undoes a live restore.

Before: the lock lived under the node cache (`XDG_CACHE_HOME`), so two restores of one tree with
different caches did not wait for each other; the second "recovered" (undid) the first's live
restore from its journal, the first's rollback removed the second's files, and the tree ended empty
but stamped as restored. Now the lock is keyed by the roots' real paths, and a journal is recovered
only when its writer's flock is free (the writer is gone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.envsnap import journal
from bootseer_cli.envsnap.lock import lock_path, tree_key, tree_lock
from tests.envsnap.conftest import tree_state
from tests.envsnap.test_cli import make_base
from tests.envsnap.test_trust import capture_many, many_files_project
from tests.support import pkgindex

pytestmark = pytest.mark.integration


def _start(tmp_path: Path, node: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in pkgindex.clean_env().items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(tmp_path / f"{node}-cache"), "BOOTSEER_EXEC_AGENT": "0"})
    return subprocess.Popen(
        [sys.executable, "-m", "bootseer_cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_lock_is_keyed_by_the_tree_not_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    roots = [str(tmp_path / "a"), str(tmp_path / "b")]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c1"))
    first = lock_path(roots)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c2"))
    assert lock_path(roots) == first  # another cache: the same lock
    assert tree_key([str(tmp_path / "b"), str(tmp_path / "link")]) == tree_key(roots)  # order, links
    if os.geteuid() == 0:
        assert first.startswith(("/run/lock/bootseer/", "/run/bootseer/locks/")), first
    # a plain user's lock is inside the tree, where every user who can restore it finds it
    assert lock_path(roots, euid=1000) == str(tmp_path / "a" / ".bootseer-env.journal.lock")


def test_two_restores_with_different_caches_serialise(tmp_path: Path) -> None:
    root = many_files_project(tmp_path, (tmp_path / "store").as_uri())
    capture_many(tmp_path)
    want = tree_state(root)

    # deterministic: while the tree lock is held (here, by this process), a restore waits for it
    make_base(root)
    said: list[str] = []
    with tree_lock([str(root)], said.append, said.append):
        waiting = _start(tmp_path, "node-b", "restore")
        time.sleep(3)
        assert waiting.poll() is None, waiting.communicate()
        assert not (root / ".bootseer-env.json").exists(), "the restore did not wait for the tree lock"
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and "restored env" in out, err
    assert "waiting for it" in err, err
    assert tree_state(root) == want

    # two real restores of one tree with different XDG_CACHE_HOME: one restores, the other waits and
    # finds the env present; the tree ends as the snapshot says
    make_base(root)
    procs = [_start(tmp_path, "node-a", "restore"), _start(tmp_path, "node-b", "restore")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said_all = " ".join(o for o, _ in outs)
    assert said_all.count("restored env") == 1 and said_all.count("already present") == 1, outs
    assert tree_state(root) == want


_WRITER = """
import os, sys, time
from bootseer_cli.envsnap import journal
root = sys.argv[1]
os.makedirs(os.path.join(root, "new-dir"))
open(os.path.join(root, "new-dir", "f"), "w").write("x")
doc = {"v": 1, "committed": False, "undo_dirs": [], "moves": [], "new": [os.path.join(root, "new-dir")]}
journal.write([root], doc)
print("written", flush=True)
time.sleep(600)
"""


def test_a_live_journal_is_never_recovered_a_dead_one_is(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
        said: list[str] = []
        journal.recover([str(root)], said.append)
        assert (root / "new-dir" / "f").read_text() == "x", "a live restore's files were undone"
        assert (root / ".bootseer-env.journal").exists()
        assert any("journal is live" in s for s in said), said
        with pytest.raises(journal.LiveJournal):  # nor does a second restore start over it
            journal.write([str(root)], {"v": 1, "committed": False, "undo_dirs": [], "moves": [], "new": []})
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    said = []
    journal.recover([str(root)], said.append)  # the writer died: its restore is undone
    assert not (root / "new-dir").exists() and not (root / ".bootseer-env.journal").exists()
    assert any("interrupted restore was undone" in s for s in said), said
