"""The carried document (`.bootseer-env.paths`: a row per env path, ~30 MB for 200k paths) is read once
per start: one `EnvTree` goes from the stamp check through the restore, which used to read and parse it
again in the chain's prefix and the switch (three reads on a start that found a stale tree), and a
stamp bootseer writes is kept as written (what a layer of a chain applies over), never read back.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.envsnap import stamp
from bootseer_cli.envsnap.format import ArchiveEntry
from bootseer_cli.envsnap.manifest import CARRIED_NAME
from bootseer_cli.envsnap.tree import EnvTree
from tests.envsnap.conftest import run_cli
from tests.envsnap.test_layers import Job, write_wheel
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


def _opens(log: Path) -> list[str]:
    """The opens of the carried file for reading in an `strace -e trace=openat` log (writes go by temporary)."""
    return [line for line in log.read_text().splitlines() if f'"{CARRIED_NAME}", O_RDONLY' in line]


def _traced(log: Path) -> tuple[str, ...]:
    return ("strace", "-f", "-qq", "-e", "trace=openat", "-o", str(log))


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
    argv = ["exec", "--", "true"]
    first = run_cli(argv, tmp_path, cache)
    assert first.returncode == 0 and "published 40 files" in first.stderr, first.stderr
    sentinels = json.loads((venv / ".bootseer-env.json").read_text())["sentinels"]
    victim = next(p for p in sorted(map(str, (venv / "lib" / "pkg").iterdir())) if p not in sentinels)
    Path(victim).write_text("changed by hand")
    log = tmp_path / "trace.log"
    again = run_cli(argv, tmp_path, cache, prefix=_traced(log))
    assert again.returncode == 0, again.stderr
    assert f"stale stamp: {victim} changed" in again.stderr and "restored 40 files" in again.stderr, again.stderr
    assert Path(victim).read_text() == f"v{os.path.basename(victim)[1:3]}"
    assert len(_opens(log)) == 1, _opens(log)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pkgindex.PackageIndex]:
    """Small real wheels and `bslayer` 1.0 and 1.1 (test_layers.py's project), on loopback."""
    root = tmp_path_factory.mktemp("reads-index")
    pkgindex.wheelhouse(root, pkgindex.SMALL_WHEELS)
    for v in ("1.0", "1.1"):
        files = {"bslayer/__init__.py": f"VERSION = {v!r}\n", "bslayer/core.py": f"X = {v!r}\n"}
        write_wheel(root, "bslayer", v, files)
    with pkgindex.PackageIndex(root) as idx:
        yield idx


@pytest.mark.integration
@pytest.mark.skipif(not shutil.which("strace"), reason="strace counts the opens")
def test_a_layer_is_built_and_restored_with_one_read_of_the_carried_file(
    tmp_path: Path, index: pkgindex.PackageIndex
) -> None:
    """A bump builds over the parent the tree carries (its check read the carried file three times, and
    setting it aside a fourth), then a fresh node restores the two links (the second applied over what
    the first one's stamp wrote, read back before): one read each."""
    job = Job(tmp_path, index)
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    job.reqs("bslayer==1.1", "six==1.17.0")
    check = ["exec", "--", str(job.venv / "bin" / "python"), "-c", "import bslayer; print(bslayer.VERSION)"]
    built = run_cli(check, tmp_path, tmp_path / "n1-cache", job.env, prefix=_traced(tmp_path / "built.log"))
    assert built.returncode == 0 and "(layer 1)" in built.stderr, built.stderr
    assert len(_opens(tmp_path / "built.log")) == 1, _opens(tmp_path / "built.log")
    job.fresh_node()
    fresh = run_cli(check, tmp_path, tmp_path / "n2-cache", job.env, prefix=_traced(tmp_path / "fresh.log"))
    assert fresh.returncode == 0 and fresh.stdout.strip() == "1.1" and "(layer 1" in fresh.stderr, fresh.stderr
    assert len(_opens(tmp_path / "fresh.log")) == 1, _opens(tmp_path / "fresh.log")  # none there yet: one look
