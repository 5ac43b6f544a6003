"""Issue 46 finding 8: `bootseer gc` cut names at 48 characters and did not list the refs a policy keeps.

An env key is 64 hex digits and a checkpoint tag `name:tag` can be longer still: a name cut short cannot
be pasted into `bootseer env ls` or `ckpt ls`. And a dry run that says "would free 0 B" must also show
what it keeps and why, so that the user sees which policy holds each ref.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bootseer_cli.store.core import Store, blob_path

DAY = 86400.0


def _bootseer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=60)


def _env(store: Store, key: str, created: float) -> str:
    digest = store.put_blob_bytes(os.urandom(500))
    store.write_ref("env", key, {"blob": digest, "size": 500, "created": created})
    return digest


def test_gc_prints_whole_names_and_lists_the_refs_it_keeps(isolated_cache: Path) -> None:
    from bootseer_cli.paths import default_store_uri

    store = Store(default_store_uri())
    old = time.time() - 40 * DAY
    gone, kept = "a" * 63 + "1", "b" * 63 + "2"
    digest = _env(store, gone, old)
    for rel in (blob_path(digest), store.ref_path("env", gone)):
        os.utime(store.path(rel), (old, old))
    _env(store, kept, time.time())

    r = _bootseer("gc", "--dry-run")
    assert r.returncode == 0, r.stderr
    removed = next(line for line in r.stdout.splitlines() if line.startswith("would remove env"))
    assert gone in removed, r.stdout  # the whole key, not its first 48 characters
    keeps = [line for line in r.stdout.splitlines() if line.startswith("keep")]
    assert len(keeps) == 1 and kept in keeps[0] and "used within 30 days" in keeps[0], r.stdout
    doc = json.loads(_bootseer("gc", "--dry-run", "--json").stdout)
    assert [(k["kind"], k["name"], k["why"]) for k in doc["kept_refs"]] == [("env", kept, "used within 30 days")]
