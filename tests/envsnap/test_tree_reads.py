"""The carried document (`.bootseer-env.paths`: a row per env path, ~30 MB for 200k paths) is read once
per start: one `EnvTree` goes from the stamp check through the restore, which used to read and parse it
again in the chain's prefix and the switch (three reads on a start that found a stale tree), and a
stamp bootseer writes is kept as written (what a layer of a chain applies over), never read back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.envsnap import stamp
from bootseer_cli.envsnap.format import ArchiveEntry
from bootseer_cli.envsnap.manifest import CARRIED_NAME
from bootseer_cli.envsnap.tree import EnvTree
from tests.support import pkgindex


def _files(root: Path, n: int) -> list[ArchiveEntry]:
    (root / "lib").mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = root / "lib" / f"m{i}.py"
        p.write_text(f"v{i}\n")
        out.append(ArchiveEntry(str(p), "f", 0o644, p.stat().st_size, int(p.stat().st_mtime), ""))
    return out


def test_a_written_stamp_is_kept_as_it_would_be_read_back(tmp_path: Path) -> None:
    """What `write_stamp` keeps is what a fresh tree parses from the file; removing the file drops it."""
    tree = EnvTree([str(tmp_path)])
    stamp.write_stamp(tree, ["k"], "b" * 64, _files(tmp_path, 3), [f"{tmp_path}/gone"])
    kept = tree.carried()
    assert tree.carried_reads == 0, "the document just written was read back"
    fresh = EnvTree([str(tmp_path)])
    assert kept == fresh.carried() and fresh.carried_reads == 1
    assert stamp.stamped_blob(tree, "k") == "b" * 64 and tree.carried_reads == 0
    stamp.strip_carried(tree, lambda m: None)
    assert not (tmp_path / CARRIED_NAME).exists() and not (tmp_path / "lib" / "m0.py").exists()
    assert tree.carried() is None and tree.carried_reads == 1, "what was kept outlived the file"


def test_the_checks_of_one_start_read_the_carried_file_once(tmp_path: Path) -> None:
    """Stamp check, the chain's prefix (`stamped_blob`), the switch's removable paths: one read."""
    stamp.write_stamp(EnvTree([str(tmp_path)]), ["k"], "b" * 64, _files(tmp_path, 40))
    victim = tmp_path / "lib" / "m1.py"
    sentinels = json.loads((tmp_path / ".bootseer-env.json").read_text())["sentinels"]
    assert str(victim) not in sentinels  # found stale through the carried rows, not the stamp's sentinels
    victim.write_text("changed by hand\n")
    tree = EnvTree([str(tmp_path)])
    assert stamp.stamp_state(tree, "k") == (False, f"stale stamp: {victim} changed")
    assert stamp.stamped_blob(tree, "k") is None
    assert stamp.carried_note(tree).endswith("that bootseer wrote there")
    gone = stamp.removable(tree, tree.carried() or {})
    assert str(victim) not in gone.paths and gone.kept == 1
    assert tree.carried_reads == 1


@pytest.mark.integration
@pytest.mark.skipif(not shutil.which("strace"), reason="strace counts the opens")
def test_a_restart_over_a_stale_tree_opens_the_carried_file_once(tmp_path: Path) -> None:
    """A real `bootseer exec` restart on a node whose env file was changed by hand (not one of the
    stamp's sentinels): it restores again, and opens the carried file for reading once (it was three)."""
    venv, store, cache = tmp_path / "venv", tmp_path / "store", tmp_path / "cache"
    venv.mkdir()
    store.mkdir()
    make = f"mkdir -p {venv}/lib/pkg && for i in $(seq 10 49); do printf v$i > {venv}/lib/pkg/m$i.py; done"
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store.as_uri()}"\n[exec]\nagent = false\n[env]\nroots = ["{venv}"]\nsetup = ["{make}"]\n'
    )
    env = {k: v for k, v in pkgindex.clean_env().items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(cache), "BOOTSEER_EXEC_AGENT": "0"})
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"]
    first = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0 and "published 40 files" in first.stderr, first.stderr
    sentinels = json.loads((venv / ".bootseer-env.json").read_text())["sentinels"]
    victim = next(p for p in sorted(map(str, (venv / "lib" / "pkg").iterdir())) if p not in sentinels)
    Path(victim).write_text("changed by hand")
    log = tmp_path / "trace.log"
    traced = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(log), *argv]
    again = subprocess.run(traced, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    assert f"stale stamp: {victim} changed" in again.stderr and "restored 40 files" in again.stderr, again.stderr
    assert Path(victim).read_text() == f"v{os.path.basename(victim)[1:3]}"
    opens = [line for line in log.read_text().splitlines() if f'"{CARRIED_NAME}", O_RDONLY' in line]
    assert len(opens) == 1, opens
