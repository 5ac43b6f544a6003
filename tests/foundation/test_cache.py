from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bootseer_cli.cache import BlobCache
from bootseer_cli.store import Store


def test_fetch_then_hit_and_lru_eviction(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    blobs = [os.urandom(1000) for _ in range(4)]
    digests = [store.put_blob_bytes(b) for b in blobs]
    cache = BlobCache(tmp_path / "cache", max_bytes=2500)
    path, n = cache.fetch(store, digests[0])
    assert n == 1000 and path.read_bytes() == blobs[0]
    path, n = cache.fetch(store, digests[0])
    assert n == 0, "second fetch must come from the cache"
    old = time.time() - 100
    os.utime(path, (old, old))
    cache.fetch(store, digests[1])
    cache.get(digests[0])  # touch: now the most recent
    cache.fetch(store, digests[2])  # 3000 > 2500: the least recently used (digests[1]) goes
    assert cache.get(digests[1]) is None
    assert cache.get(digests[0]) is not None and cache.get(digests[2]) is not None
    assert cache.total_bytes() <= 2500
    assert hashlib.sha256(cache.get(digests[2]).read_bytes()).hexdigest() == digests[2]


def _bootseer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=60)


def test_cache_info_and_prune(tmp_path: Path) -> None:
    """`bootseer cache info|prune` (issue 17, item 1) on the node cache the settings name."""
    from bootseer_cli.paths import blob_cache_dir

    store = Store((tmp_path / "store").as_uri())
    cache = BlobCache(blob_cache_dir(), max_bytes=1 << 30)
    digests = [store.put_blob_bytes(os.urandom(1000)) for _ in range(3)]
    for age, digest in zip((300, 200, 100), digests, strict=True):
        path, _ = cache.fetch(store, digest)
        os.utime(path, (time.time() - age, time.time() - age))  # digests[0] is the least recently used
    doc = json.loads(_bootseer("cache", "info", "--json").stdout)
    assert doc["dir"] == str(blob_cache_dir()) and doc["blobs"] == 3 and doc["bytes"] == 3000
    assert "blobs   3" in _bootseer("cache", "info").stdout

    r = _bootseer("cache", "prune", "--max-size", "2.5kB", "--dry-run")
    assert r.returncode == 0 and "would remove 1 blob(s), 1.0 kB" in r.stdout
    assert cache.total_bytes() == 3000  # a dry run removes nothing
    doc = json.loads(_bootseer("cache", "prune", "--max-size", "2.5kB", "--json").stdout)
    assert doc["removed"] == 1 and doc["freed_bytes"] == 1000 and doc["left_bytes"] == 2000
    assert cache.get(digests[0]) is None and cache.get(digests[2]) is not None  # least recently used went
    assert "removed 2 blob(s)" in _bootseer("cache", "prune", "--max-size", "0").stdout
    assert cache.total_bytes() == 0

    r = _bootseer("cache", "prune", "--max-size", "lots")
    assert r.returncode == 2 and "expected a size" in r.stderr and "Traceback" not in r.stderr
