"""Item 3 of issue 14: caches heal themselves.

A node-cache hit is verified before use; one flipped byte in a cached stripe (or a cached hot-block
record) is dropped and fetched again from the store, so the next pull succeeds and the entry is
repaired. A corrupt object of the right size already in the store is replaced by `ckpt push`, so
the tag it publishes can be pulled. Real file:// and loopback-S3 stores, the real pull engine and
the real `bootseer ckpt push|pull` processes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.delivery import fetch_blob
from bootseer_cli.hotblocks import record
from bootseer_cli.settings import P2PSettings
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store, blob_path
from bootseer_cli.stripe.catalog import Targets
from bootseer_cli.stripe.pull import pull
from bootseer_cli.stripe.push import push

pytestmark = pytest.mark.integration

CELL = 64 << 10


def _flip(path: Path, offset: int = 100) -> None:
    """One byte changed in place: same inode, same size (what a bad disk or a stray write leaves)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture
def own_copy_cache() -> Iterator[Path]:
    """A cache directory on another filesystem than the store (tmpfs), so the cache holds its own copy
    of each blob, as it does for every store but a local one on the same filesystem (where it hard-links
    the store's blob: one copy on disk, see test_a_linked_cache_never_serves_a_flipped_byte)."""
    d = Path(tempfile.mkdtemp(prefix="bootseer-cache-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(5 * CELL + 17))
    return src


def test_flipped_byte_in_a_cached_stripe_is_refetched_and_repaired(tmp_path: Path, own_copy_cache: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    m = push(store, _src(tmp_path), "job", "t1", stripes=2, cell_size=CELL)
    cache = BlobCache(own_copy_cache, 1 << 30)
    targets = Targets(store)
    pull(m, targets, tmp_path / "d1", p2p=P2PSettings(), cache=cache, whole_stripes=True)
    cached = cache.path(m.stripes[0].digest)
    assert cached.exists()
    _flip(cached)
    r = pull(m, targets, tmp_path / "d2", p2p=P2PSettings(), cache=cache, whole_stripes=True)
    assert r.bytes_from_store > 0  # the bad stripe came from the store again
    assert (tmp_path / "d2" / "w.bin").read_bytes() == (tmp_path / "src" / "w.bin").read_bytes()
    assert _digest(cached) == m.stripes[0].digest, "the cache entry was not repaired"


def test_fetch_blob_drops_a_corrupt_hit(tmp_path: Path, own_copy_cache: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    data = os.urandom(300_000)
    digest = store.put_blob_bytes(data)
    cache = BlobCache(own_copy_cache, 1 << 30)
    assert fetch_blob(P2PSettings(), store, digest, cache=cache).source == "store"
    _flip(cache.path(digest))
    got = fetch_blob(P2PSettings(), store, digest, cache=cache)
    assert got.source == "store" and got.path.read_bytes() == data
    assert fetch_blob(P2PSettings(), store, digest, cache=cache).source == "cache"  # healed: a hit again


def test_corrupt_cached_hot_record_is_refetched(tmp_path: Path, own_copy_cache: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    f = tmp_path / "lib.so"
    f.write_bytes(os.urandom(10_000))
    st = f.stat()
    rec = record.Record("k" * 64, [str(tmp_path)], files={str(f): (st.st_size, st.st_mtime_ns)})
    rec.extents = [(str(f), 0, 4096)]
    doc = record.publish(store, rec)
    cache = BlobCache(own_copy_cache, 1 << 30)
    assert record.load(P2PSettings(), store, cache, rec.image_key, [str(tmp_path)]) is not None
    _flip(cache.path(doc["blob"]), offset=doc["size"] // 2)
    got = record.load(P2PSettings(), store, cache, rec.image_key, [str(tmp_path)])
    assert got is not None and got[0].extents == rec.extents and got[1]["_source"] == "store"


def test_a_linked_cache_never_serves_a_flipped_byte(tmp_path: Path) -> None:
    """On the default local store the cache hard-links the store's blob (one copy on disk): a flipped
    byte is in both, so there is no good copy to fetch again. It is caught by the digest (never served)
    and the next publish of the same bytes mends the store (test_a_republish_mends_a_corrupt_local_blob)."""
    from bootseer_cli.errors import IntegrityError

    store = Store((tmp_path / "store").as_uri())
    data = os.urandom(300_000)
    digest = store.put_blob_bytes(data)
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    got = fetch_blob(P2PSettings(), store, digest, cache=cache)
    assert got.path.stat().st_nlink == 2, "one copy on disk: the cache links the store's blob"
    _flip(cache.path(digest))
    with pytest.raises(IntegrityError):
        fetch_blob(P2PSettings(), store, digest, cache=cache)
    assert store.put_blob_bytes(data) == digest
    assert fetch_blob(P2PSettings(), store, digest, cache=cache).path.read_bytes() == data


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_push_replaces_a_corrupt_object_of_the_right_size(tmp_path: Path, kind: str, request) -> None:  # type: ignore[no-untyped-def]
    if kind == "file":
        uri = (tmp_path / "store").as_uri()
    else:
        uri = request.getfixturevalue("s3_server").uri(f"heal-{os.urandom(4).hex()}")
    store = Store(uri)
    src = _src(tmp_path)
    m = push(store, src, "job", "t1", stripes=1, cell_size=CELL)
    digest = m.stripes[0].digest
    good = store.get_blob_bytes(digest)
    bad = bytearray(good)
    bad[1234] ^= 0x01
    store.put_bytes(blob_path(digest), bytes(bad))  # a corrupt object, the right size, the right name
    r = _cli(
        "ckpt", "push", str(src), "-n", "job", "-t", "t2", "--stripes", "1", "--cell-size", str(CELL), "--store", uri
    )
    assert r.returncode == 0, r.stderr
    assert store.get_blob_bytes(digest) == good  # replaced (get_blob_bytes verifies)
    r = _cli("ckpt", "pull", "job:t2", str(tmp_path / "out"), "--store", uri)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "w.bin").read_bytes() == (src / "w.bin").read_bytes()


def test_a_republish_mends_a_corrupt_local_blob(tmp_path: Path) -> None:
    """The node cache hard-links the local store's blobs: a byte flipped in one is flipped in both, so a
    blob already present with the right size must be checked by digest before a republish skips it."""
    from bootseer_cli.store.core import blob_path, open_store

    store = open_store((tmp_path / "store").as_uri())
    src = tmp_path / "blob"
    src.write_bytes(b"x" * 10000)
    digest = store.put_blob_file(src)
    stored = Path(store.path(blob_path(digest)))
    data = bytearray(stored.read_bytes())
    data[5] ^= 1
    stored.write_bytes(bytes(data))
    assert store.put_blob_file(src) == digest
    assert stored.read_bytes() == src.read_bytes()
