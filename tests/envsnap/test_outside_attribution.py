"""The warning about changes outside the roots names only what the setup wrote (issue 46).

Under load, another process ran `ldconfig` while a setup ran, and the capture reported
`/etc/ld.so.cache` as the setup's. Here another process (the test's, not a descendant of the setup)
rewrites a file in a place the capture looks (/opt) while the setup waits for it; the setup itself
writes a file beside it, and a background child of the setup another."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.envsnap.conftest import run_cli
from tests.support.nobody import NOBODY, as_nobody

pytestmark = pytest.mark.integration


@pytest.fixture
def opt_dir(tmp_path: Path) -> Iterator[Path]:
    d = Path(f"/opt/bootseer-attribution-{os.getpid()}-{tmp_path.name}")
    d.mkdir(parents=True)
    (d / "theirs.cache").write_text("before\n")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_another_process_writing_outside_the_roots_during_the_setup_is_not_blamed(
    tmp_path: Path, opt_dir: Path
) -> None:
    root, go, done = tmp_path / "env", tmp_path / "go", tmp_path / "done"
    root.mkdir()
    wait = f"for i in $(seq 1200); do [ -e {done} ] && break; sleep 0.05; done; [ -e {done} ]"
    setup = [
        f"echo pkg > {root}/pkg.py && ls -l /proc/$$/fd > {tmp_path}/fds",
        f"echo mine > {opt_dir}/mine.conf && (echo kid > {opt_dir}/child.conf &) && touch {go} && {wait}",
    ]
    import json

    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{(tmp_path / "store").as_uri()}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{root}"]\nwait_s = 30\nsetup = {json.dumps(setup)}\n'
    )
    # the node's other work: a process that is no descendant of the setup rewrites a file in /opt
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "go, done, f = sys.argv[1:]\n"
            "end = time.monotonic() + 120\n"
            "while not os.path.exists(go) and time.monotonic() < end: time.sleep(0.02)\n"
            "tmp = f + '~'\n"
            "open(tmp, 'w').write('after\\n'); os.replace(tmp, f)\n"  # as ldconfig writes ld.so.cache
            "open(done, 'w').close()\n",
            str(go),
            str(done),
            str(opt_dir / "theirs.cache"),
        ]
    )
    try:
        r = run_cli(["exec", "--", "true"], tmp_path, tmp_path / "cache")
    finally:
        other.wait(timeout=150)
    assert r.returncode == 0, r.stderr
    assert (opt_dir / "theirs.cache").read_text() == "after\n", "the other process did not write during the setup"
    warning = next((line for line in r.stderr.splitlines() if "outside [env] roots" in line), "")
    assert f"{opt_dir}/mine.conf" in warning and f"{opt_dir}/child.conf" in warning, r.stderr
    assert "theirs.cache" not in warning, "another process's write was blamed on the setup"
    assert "2 file(s)" in warning, warning
    assert "fanotify" not in (tmp_path / "fds").read_text(), "the setup holds bootseer's fanotify group"


# a plain user (read and search everywhere, so the interpreter under /root starts; no write anywhere)
AS_NOBODY = as_nobody("dac_read_search")


def test_a_plain_users_setup_is_not_blamed_for_a_file_it_could_not_write(tmp_path: Path) -> None:
    """No fanotify for a plain user: a file it may not write (nor its directory) is not its setup's."""
    import json

    work = tmp_path / "work"
    home, root, done = work / "home", work / "env", work / "done"
    for d in (work, home, root):
        d.mkdir()
        os.chown(d, NOBODY, NOBODY)
    system = home / "sys"  # root's, inside the home the capture looks in (as /etc is for ld.so.cache)
    system.mkdir(mode=0o755)
    (system / "theirs.conf").write_text("before\n")
    go = work / "go"
    wait = f"for i in $(seq 1200); do [ -e {done} ] && break; sleep 0.05; done; [ -e {done} ]"
    setup = [f"echo pkg > {root}/pkg.py", f"echo mine > {home}/mine.conf && touch {go} && {wait}"]
    (work / "bootseer.toml").write_text(
        f'[store]\nuri = "{(work / "store").as_uri()}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{root}"]\nwait_s = 30\nsetup = {json.dumps(setup)}\n'
    )
    other = subprocess.Popen(  # root, no descendant of the setup
        [
            "sh",
            "-c",
            f"for i in $(seq 2400); do [ -e {go} ] && break; sleep 0.05; done;"
            f" echo after > {system}/theirs.conf~ && mv {system}/theirs.conf~ {system}/theirs.conf; touch {done}",
        ]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(work / "cache"), BOOTSEER_EXEC_AGENT="0")
    try:
        r = subprocess.run(
            [*AS_NOBODY, sys.executable, "-m", "bootseer_cli", "exec", "--", "true"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        other.wait(timeout=150)
    assert r.returncode == 0, r.stderr
    assert (system / "theirs.conf").read_text() == "after\n"
    warning = next((line for line in r.stderr.splitlines() if "outside [env] roots" in line), "")
    assert f"{home}/mine.conf" in warning, r.stderr
    assert "theirs.conf" not in warning, "a file the user could not write was blamed on its setup"
