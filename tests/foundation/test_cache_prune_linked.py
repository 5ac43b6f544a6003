"""Issue 46 finding 8: `cache prune` claimed to free the bytes of blobs hard-linked with the local store.

Removing a cache entry that is a second link to the store's copy frees no disk; only blobs whose last link
goes count as freed, and the prune says how many it removed that the store still holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bootseer_cli.paths import blob_cache_dir, default_store_uri
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store


def _bootseer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=60)


def test_prune_counts_only_the_bytes_it_frees_on_disk(tmp_path: Path) -> None:
    cache = BlobCache(blob_cache_dir(), max_bytes=1 << 30)
    linked, _ = cache.fetch(Store(default_store_uri()), Store(default_store_uri()).put_blob_bytes(os.urandom(5000)))
    other = Store((tmp_path / "elsewhere").as_uri())
    digest = other.put_blob_bytes(os.urandom(3000))
    copied, _ = cache.fetch(other, digest)
    other.delete_blob(digest)  # the cache's entry is now the only copy (as one fetched from S3 is)
    assert linked.stat().st_nlink == 2 and copied.stat().st_nlink == 1

    r = _bootseer("cache", "prune", "--max-size", "0", "--dry-run")
    assert r.returncode == 0 and "would remove 2 blob(s), 3.0 kB freed" in r.stdout, r.stdout
    assert "1 of them shared with the local store" in r.stdout, r.stdout
    doc = json.loads(_bootseer("cache", "prune", "--max-size", "0", "--json").stdout)
    assert doc["removed"] == 2 and doc["freed_bytes"] == 3000 and doc["shared"] == 1
    assert cache.total_bytes() == 0
