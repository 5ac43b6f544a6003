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
        f"echo pkg > {root}/pkg.py",
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
