"""Recording as a plain user (issue 44): no fanotify without root, so the image stage records by a bounded
eviction walk of the roots the user owns; the agent publishes the record. Run for real as `bsuser`
(runuser), with a `bootseer` that user can execute (tests/slurm/plainuser.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.slurm.plainuser import plain_user, user_bin, world_dir

from .conftest import MiB, wait_for, write_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="making and becoming a plain user needs root"),
]

# 200 KB from the middle of f1, the head of f3, never f2 (shell tools: nothing else under the roots)
START = "dd if={t}/f1.bin of=/dev/null bs=4096 skip=256 count=49 status=none; head -c 50000 {t}/f3.bin >/dev/null"


def test_a_plain_user_records_through_exec() -> None:
    user = plain_user()
    with world_dir() as d:
        tree, home = d / "tree", d / "home"
        tree.mkdir()
        home.mkdir()
        for i in (1, 2, 3):
            (tree / f"f{i}.bin").write_bytes(os.urandom(3 * MiB))
        for p in (tree, home, *tree.iterdir()):
            os.chown(p, user.uid, user.gid)
        cfg = write_config(home / "bootseer.toml", [tree], ready=1)
        os.chown(cfg, user.uid, user.gid)
        bin_dir = user_bin(user, d)
        env = ["env", f"HOME={home}", f"XDG_CACHE_HOME={home / 'cache'}", f"PATH={bin_dir}:/usr/bin:/bin"]
        r = user.run(
            *env, "bootseer", "exec", "-c", str(cfg), "--", "/bin/sh", "-c", START.format(t=tree), cwd=home, timeout=120
        )
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr and "TypeError" not in r.stderr, r.stderr
        assert "recording this start" in r.stderr, r.stderr
        wait_for(lambda: list((home / "cache").rglob("refs/hot/*.json")), timeout=60, what="the record")
        shown = user.run(*env, "bootseer", "hot", "show", "--json", "-c", str(cfg), cwd=home, timeout=120)
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert {Path(f["path"]).name for f in doc["top_files"]} == {"f1.bin", "f3.bin"}, doc
