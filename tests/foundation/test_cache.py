from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store


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
    # linked with the local store: removing the cache's link frees no disk (issue 46)
    assert r.returncode == 0 and "would remove 1 blob(s), 0 B freed (1 of them shared" in r.stdout
    assert cache.total_bytes() == 3000  # a dry run removes nothing
    doc = json.loads(_bootseer("cache", "prune", "--max-size", "2.5kB", "--json").stdout)
    assert doc["removed"] == 1 and doc["freed_bytes"] == 0 and doc["left_bytes"] == 2000
    assert cache.get(digests[0]) is None and cache.get(digests[2]) is not None  # least recently used went
    assert "removed 2 blob(s)" in _bootseer("cache", "prune", "--max-size", "0").stdout
    assert cache.total_bytes() == 0

    r = _bootseer("cache", "prune", "--max-size", "lots")
    assert r.returncode == 2 and "expected a size" in r.stderr and "Traceback" not in r.stderr


def test_local_store_and_cache_share_one_copy(tmp_path: Path) -> None:
    """Issue 17, item 1: with a local store the cache hard-links the stored blob (verified), not a copy."""
    store = Store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(os.urandom(5000))
    stored = Path(store.path(f"blobs/sha256/{digest[:2]}/{digest}"))
    cache = BlobCache(tmp_path / "cache", max_bytes=1 << 30)
    path, n = cache.fetch(store, digest)
    assert n == 5000 and path.stat().st_ino == stored.stat().st_ino and stored.stat().st_nlink == 2
    assert cache.linked() == (1, 5000)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    # adopt (a snapshot just uploaded): the cache links the stored copy and the built file goes
    built = tmp_path / "built.bin"
    built.write_bytes(os.urandom(3000))
    d2 = store.put_blob_file(built)
    adopted = cache.adopt(built, d2, store)
    assert not built.exists() and adopted.stat().st_nlink == 2


def test_a_corrupt_local_blob_is_not_linked(tmp_path: Path) -> None:
    from bootseer_cli.errors import IntegrityError

    store = Store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(os.urandom(1000))
    store.put_bytes(f"blobs/sha256/{digest[:2]}/{digest}", os.urandom(1000))
    cache = BlobCache(tmp_path / "cache", max_bytes=1 << 30)
    try:
        cache.fetch(store, digest)
    except IntegrityError:
        pass
    else:
        raise AssertionError("a blob that does not match its digest was linked")
    assert cache.entries() == [] and not any(p.name.startswith(".") for p in (tmp_path / "cache").rglob("*"))


def test_across_filesystems_the_cache_copies(tmp_path: Path) -> None:
    import tempfile

    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        import pytest

        pytest.skip("/dev/shm is on the same filesystem as the store here")
    store = Store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(os.urandom(1000))
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        path, n = BlobCache(Path(other), max_bytes=1 << 30).fetch(store, digest)
        assert n == 1000 and path.stat().st_nlink == 1
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_restore_on_the_default_store_keeps_one_copy(tmp_path: Path) -> None:
    """An env snapshot and a restore (after the cache was emptied) on the default store: one inode each."""
    from bootseer_cli.paths import blob_cache_dir, default_store_uri

    root = tmp_path / "env"
    (root / "lib").mkdir(parents=True)
    (tmp_path / "bootseer.toml").write_text(f'[exec]\nagent = false\n[env]\nroots = ["{root}"]\n')
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    bs = [sys.executable, "-m", "bootseer_cli"]
    assert subprocess.run([*bs, "baseline"], **run).returncode == 0
    (root / "lib" / "mod.py").write_text("X = 1\n" * 1000)
    r = subprocess.run([*bs, "snapshot", "--json"], **run)
    assert r.returncode == 0, r.stderr
    blobs = list(Path(default_store_uri().removeprefix("file://")).glob("blobs/sha256/*/*"))
    assert len(blobs) == 1 and blobs[0].stat().st_nlink == 2, "the snapshot's cache entry is the store's copy"
    assert subprocess.run([*bs, "cache", "prune", "--max-size", "0"], **run).returncode == 0
    assert blobs[0].stat().st_nlink == 1
    (root / "lib" / "mod.py").unlink()
    r = subprocess.run([*bs, "restore"], **run)
    assert r.returncode == 0, r.stderr
    assert (root / "lib" / "mod.py").exists() and blobs[0].stat().st_nlink == 2, "restored by link, not a copy"
    cached = next(blob_cache_dir().glob("sha256/*/*"))
    assert cached.stat().st_ino == blobs[0].stat().st_ino
    info = json.loads(subprocess.run([*bs, "cache", "info", "--json"], **run).stdout)
    assert info["linked"] == 1 and info["disk_bytes"] == 0
