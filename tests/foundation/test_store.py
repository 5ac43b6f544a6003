"""One test module for every store backend: the local filesystem and a real S3 server on loopback."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from bootseer_cli.errors import IntegrityError, StoreError
from bootseer_cli.store.core import Store, blob_path

pytestmark = pytest.mark.integration


@pytest.fixture
def store(store_uri: str) -> Store:
    return Store(store_uri, settle_s=1.0)


def test_blob_roundtrip_is_verified(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "blob.bin"
    payload = bytes(range(256)) * 40_000  # ~10 MiB, several chunks
    src.write_bytes(payload)
    digest = store.put_blob_file(src)
    assert digest == hashlib.sha256(payload).hexdigest()
    assert store.has_blob(digest)
    assert store.size(blob_path(digest)) == len(payload)
    dest = tmp_path / "out" / "blob"
    seen = []
    assert store.fetch_blob(digest, dest, progress=seen.append) == len(payload)
    assert dest.read_bytes() == payload
    assert sum(seen) == len(payload)
    assert not [p for p in dest.parent.iterdir() if p.name != "blob"]


def test_corrupt_blob_is_rejected_and_nothing_written(store: Store, tmp_path: Path) -> None:
    digest = store.put_blob_bytes(b"good data" * 1000)
    store.put_bytes(blob_path(digest), b"evil data" * 1000)  # replace behind the store's back
    with pytest.raises(IntegrityError):
        store.get_blob_bytes(digest)
    dest = tmp_path / "dl" / "x"
    with pytest.raises(IntegrityError):
        store.fetch_blob(digest, dest)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_missing_blob(store: Store, tmp_path: Path) -> None:
    missing = "0" * 64
    assert not store.has_blob(missing)
    with pytest.raises(StoreError, match="not found"):
        store.fetch_blob(missing, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_refs_and_listing(store: Store) -> None:
    assert store.read_ref("env", "k1") is None
    store.write_ref("env", "k1", {"blob": "a" * 64, "size": 3})
    store.write_ref("env", "k2", {"blob": "b" * 64, "size": 4})
    assert store.read_ref("env", "k1") == {"blob": "a" * 64, "size": 3}
    assert store.list_refs("env") == ["k1", "k2"]
    store.delete_ref("env", "k1")
    assert store.list_refs("env") == ["k2"]
    store.delete_ref("env", "k2")
    assert store.list_refs("env") == []
    store.write_ref("env", "k3", {"x": 1})  # a prefix emptied by deletes stays writable
    assert store.list_refs("env") == ["k3"]
    with pytest.raises(StoreError):
        store.write_ref("env", "../escape", {})


def test_a_delete_on_s3_is_one_request_without_back_off(s3_server: object) -> None:
    """pyarrow PUTs a parent "directory" marker after each delete; rclone's S3 server refuses it and
    pyarrow retried with back-off: about 2 s per delete (gc, `env rm`, lease releases). A delete is now
    one DELETE: ten take well under a second each, and the emptied prefix stays writable."""
    store = Store(s3_server.uri(f"t-{time.monotonic_ns()}"), settle_s=1.0)  # type: ignore[attr-defined]
    for i in range(10):
        store.write_ref("env", f"k{i}", {"i": i})
    t0 = time.monotonic()
    for i in range(10):
        store.delete_ref("env", f"k{i}")
    took = time.monotonic() - t0
    assert store.list_refs("env") == []
    assert took < 5.0, f"10 deletes took {took:.1f} s"
    store.write_ref("env", "again", {"x": 1})
    assert store.list_refs("env") == ["again"]


def test_bad_ref_json(store: Store) -> None:
    store.put_bytes(store.ref_path("env", "bad"), b"{not json")
    with pytest.raises(IntegrityError):
        store.read_ref("env", "bad")


def test_lease_single_flight(store: Store) -> None:
    lease = store.try_lease("env-k", ttl_s=30)
    assert lease is not None
    assert store.try_lease("env-k", ttl_s=30) is None
    lease.release()
    again = store.try_lease("env-k", ttl_s=30)
    assert again is not None
    again.release()


def test_stale_lease_is_taken_over(store: Store) -> None:
    old = store.try_lease("env-stale", ttl_s=0.2)
    assert old is not None
    time.sleep(0.4)
    new = store.try_lease("env-stale", ttl_s=30)
    assert new is not None and new.owner != old.owner
    old.release()  # releasing a lease one no longer owns must not drop the new owner's
    assert store.read_lease("env-stale")["owner"] == new.owner
    new.release()


def test_concurrent_lease_has_exactly_one_winner(store: Store) -> None:
    winners: list[object] = []
    barrier = threading.Barrier(6)

    def contend() -> None:
        barrier.wait()
        lease = store.try_lease("env-race", ttl_s=30)
        if lease is not None:
            winners.append(lease)

    threads = [threading.Thread(target=contend) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1


def test_writable_probe(store: Store) -> None:
    store.check_writable()
    assert [p for p in store.list("leases") if ".probe" in p] == []


def test_unknown_scheme() -> None:
    with pytest.raises(StoreError, match="unknown scheme"):
        Store("ftp://example.invalid/x")


def test_unreachable_s3_is_a_store_error(s3_env: dict[str, str]) -> None:
    from tests.support.s3server import free_port

    port = free_port()
    store = Store(f"s3://b/p?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1&connect_timeout=1")
    with pytest.raises(StoreError):
        store.check_writable()
