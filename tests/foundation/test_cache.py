from __future__ import annotations

import hashlib
import os
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
