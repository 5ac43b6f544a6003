"""Ctrl-C during an env restore (issue 29 item 4): the first press says that the tree is being put
back, before putting it back; a second press during that undo is held off with one line saying so;
the tree ends exactly as it was before the restore, with nothing of ours left in it. The restore's
forked workers ignore Ctrl-C: the restore alone answers it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bootseer_cli.errors import DEFERRED_LINE
from tests.envsnap.conftest import run_cli, tree_state
from tests.envsnap.test_cli import SITE, make_base, project
from tests.support import pkgindex

pytestmark = pytest.mark.integration

FILES = 20000  # enough that neither the restore nor its undo is over before the signals land


def _many_files(tmp_path: Path, root: Path) -> None:
    """The setup, by hand: the project's replace-and-delete script, then FILES small files in 200 packages."""
    s = root / SITE
    (tmp_path / "many.py").write_text(
        "import os, sys\n"
        f"for d in range({FILES // 100}):\n"
        f"    p = os.path.join({str(s)!r}, f'many_{{d}}', 'sub')\n"
        "    os.makedirs(p)\n"
        "    for f in range(100):\n"
        "        open(os.path.join(p, f'f{f}.py'), 'w').write(f'{d}-{f}\\n')\n"
    )
    subprocess.run(["sh", "setup.sh"], cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "many.py"], cwd=tmp_path, check=True)


def _workers_of(pid: int) -> list[int]:
    """The restore's forked workers: children of `pid` running its own command line."""
    mine = Path(f"/proc/{pid}/cmdline").read_bytes()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{name}/stat").read_bytes().rpartition(b")")[2].split()[1])
            if ppid == pid and Path(f"/proc/{name}/cmdline").read_bytes() == mine:
                out.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The project and its store after one snapshot of FILES files, made once for both cases: each case
    starts from `make_base` (the image again, as a fresh node has it) with a node cache of its own, and
    asserts that it leaves the tree as it found it; neither writes to the store."""
    tmp_path = tmp_path_factory.mktemp("interrupt")
    root = project(tmp_path, (tmp_path / "store").as_uri())
    (root / SITE / "pkg_a" / "big.bin").write_bytes(os.urandom(1 << 20))  # an image file the setup deletes
    assert run_cli(["baseline"], tmp_path, tmp_path / "c0").returncode == 0
    _many_files(tmp_path, root)
    r = run_cli(["snapshot"], tmp_path, tmp_path / "c0")
    assert r.returncode == 0 and "published" in r.stdout, r.stderr
    return tmp_path, root


@pytest.mark.parametrize("verb", [["restore"], ["exec", "--", "true"]], ids=["restore", "exec"])
def test_ctrl_c_twice_during_a_restore_leaves_the_tree_whole(
    published: tuple[Path, Path], tmp_path: Path, verb: list[str]
) -> None:
    project_dir, root = published
    make_base(root)  # the image again, as a fresh node has it
    (root / SITE / "pkg_a" / "big.bin").write_bytes(b"image bytes\n" * 1000)
    before = tree_state(root)

    env = {k: v for k, v in pkgindex.clean_env().items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "node-cache"), "BOOTSEER_EXEC_AGENT": "0"})
    p = subprocess.Popen(
        [sys.executable, "-m", "bootseer_cli", *verb],
        cwd=project_dir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: Ctrl-C reaches the restore and its workers
    )
    lines: list[str] = []
    undoing = threading.Event()

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line.rstrip("\n"))
            if "putting the tree back" in line:
                undoing.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        journal = root / ".bootseer-env.journal"
        deadline = time.monotonic() + 120
        while not (journal.exists() and _workers_of(p.pid)) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert journal.exists(), f"the restore never began: {lines}"
        assert p.poll() is None, f"the restore ended before Ctrl-C: {lines}"
        os.killpg(p.pid, signal.SIGINT)  # the extraction's workers are writing
        assert undoing.wait(60), f"no word of the undo after Ctrl-C: {lines}"
        os.killpg(p.pid, signal.SIGINT)  # the second press, while the tree is being put back
        rc = p.wait(timeout=120)
        reader.join(10)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert rc == 130, lines
    assert "bootseer: interrupted: putting the tree back…" in lines, lines
    assert DEFERRED_LINE in lines, f"the second Ctrl-C was not held off during the undo: {lines}"
    assert "Traceback" not in "\n".join(lines), lines
    ours = [n for n in os.listdir(root) if n.startswith((".bootseer-undo-", ".bootseer-env.journal"))]
    assert ours == [], f"left behind: {ours}"
    assert tree_state(root) == before, "the tree is not as it was before the restore"


def test_sigint_to_the_restore_workers_alone_is_ignored(published: tuple[Path, Path], tmp_path: Path) -> None:
    """Ctrl-C reaches the restore and its forked workers at once. A worker that acted on it first ended
    as a failed restore before the restore heard of it (CI: the tree was put back without a word, exit
    1, and "no word of the undo within 5 s"). The workers ignore SIGINT (the restore alone is
    interrupted, and stops them); here only the workers get it, and the restore finishes whole."""
    project_dir, root = published
    make_base(root)
    env = {k: v for k, v in pkgindex.clean_env().items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "node-cache"), "BOOTSEER_EXEC_AGENT": "0"})
    p = subprocess.Popen(
        [sys.executable, "-m", "bootseer_cli", "restore"],
        cwd=project_dir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    signalled: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline:  # every worker, as each is forked
            for w in set(_workers_of(p.pid)) - signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w, signal.SIGINT)
                signalled.add(w)
            time.sleep(0.002)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert signalled, "no forked restore worker was seen"
    assert p.returncode == 0, err
    assert "interrupted" not in err and "error" not in err, err
    made = sorted(n for n in os.listdir(root / SITE) if n.startswith("many_"))
    assert len(made) == FILES // 100, "the restore did not make the whole tree"
    assert all(len(os.listdir(root / SITE / n / "sub")) == 100 for n in made)
    assert [n for n in os.listdir(root) if n.startswith((".bootseer-undo-", ".bootseer-env.journal"))] == []
