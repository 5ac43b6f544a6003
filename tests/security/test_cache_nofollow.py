"""Issue 26 case 1: the node cache's fan-out directories are never followed when they are links.

The prolog's root fetches into a cache directory its user can write. A user who links
`sha256/86 -> /etc/cron.d` and publishes a blob whose digest starts with 86 must not get a
root-owned file there; a tiny `cache_max` must not make the eviction delete through a link; an
entry linked to /dev/zero must not keep the verifier reading forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.errors import StoreError
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store

pytestmark = pytest.mark.integration


def _planted(tmp_path: Path, digest: str) -> tuple[BlobCache, Path]:
    """A cache whose fan-out directory for `digest` is a user's link to a directory elsewhere."""
    root = tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    (root / "sha256").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "sha256" / digest[:2]).symlink_to(elsewhere)
    return BlobCache(root, max_bytes=1 << 30), elsewhere


def test_fetch_never_writes_through_a_linked_fanout_dir(store_uri: str, tmp_path: Path) -> None:
    store = Store(store_uri, settle_s=0.2)
    payload = b"* * * * * root touch /tmp/pwned\n"
    digest = store.put_blob_bytes(payload)
    cache, elsewhere = _planted(tmp_path, digest)
    assert cache.get(digest) is None  # a miss, not a read through the link
    with pytest.raises(StoreError, match="link or not a directory"):
        cache.fetch(store, digest)
    assert list(elsewhere.iterdir()) == []  # nothing written there, not even a temporary file


def test_delivery_falls_back_cleanly(tmp_path: Path) -> None:
    """Through the path every stage uses: one clean StoreError (a stage turns it into a miss)."""
    from bootseer_cli.delivery import fetch_blob
    from bootseer_cli.settings import P2PSettings

    store = Store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(os.urandom(5000))
    cache, elsewhere = _planted(tmp_path, digest)
    with pytest.raises(StoreError):
        fetch_blob(P2PSettings(), store, digest, cache=cache)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another uid owns")
def test_fanout_dir_of_another_uid_is_refused(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(os.urandom(5000))
    root = tmp_path / "cache"
    fan = root / "sha256" / digest[:2]
    fan.mkdir(parents=True)
    os.chown(fan, 65534, 65534)  # a directory its owner can swap at will: root does not write there
    with pytest.raises(StoreError, match="belongs to uid 65534"):
        BlobCache(root, 1 << 30).fetch(store, digest)
    assert list(fan.iterdir()) == []


def test_eviction_never_deletes_through_a_linked_dir(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    root = tmp_path / "cache"
    cache = BlobCache(root, max_bytes=1 << 30)
    digests = [store.put_blob_bytes(os.urandom(1000)) for _ in range(3)]
    for d in digests:
        cache.fetch(store, d)
    victim = tmp_path / "victim"  # any directory: /etc, another user's home
    victim.mkdir()
    for name in ("passwd", "a" * 64, ".hidden"):
        (victim / name).write_text("precious\n")
    old = time.time() - 10_000
    for p in victim.iterdir():
        os.utime(p, (old, old))  # older than every real entry: first in line for eviction
    (root / "sha256" / "zz").symlink_to(victim)
    (root / "sha256" / "zy").mkdir()
    (root / "sha256" / "zy" / ("b" * 64)).symlink_to(victim / "passwd")  # an entry that is a link
    tiny = BlobCache(root, max_bytes=1)  # cache_max_gb = 0.00000001
    tiny.evict()
    assert sorted(p.name for p in victim.iterdir()) == sorted([".hidden", "passwd", "a" * 64])
    assert (victim / "passwd").read_text() == "precious\n"
    assert tiny.total_bytes() == 0  # the cache's own blobs did go


def test_entry_linked_to_dev_zero_is_not_read(tmp_path: Path) -> None:
    """`sha256/xx/<digest> -> /dev/zero` must be a miss at once, not an endless hash."""
    code = f"""
import sys
from pathlib import Path
from bootseer_cli.store.cache import BlobCache
c = BlobCache(Path({str(tmp_path / "cache")!r}), 1 << 30)
d = "86" + "0" * 62
p = c.path(d)
p.parent.mkdir(parents=True)
p.symlink_to("/dev/zero")
assert c.get(d) is None and c.peek(d) is None
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_streamed_restore_download_never_writes_through_a_linked_fanout_dir(s3_server: object, tmp_path: Path) -> None:
    """The env restore's download from a remote store (`delivery.Download`) writes its part file in the
    fan-out directory too: refused there, and the in-place link of a local store is skipped."""
    from bootseer_cli.delivery import Blob, Download, Fetched, Verifier, link_into_cache

    store = Store(s3_server.uri(f"t-{os.urandom(6).hex()}"), settle_s=0.2)  # type: ignore[attr-defined]
    digest = store.put_blob_bytes(os.urandom(5000))
    cache, elsewhere = _planted(tmp_path, digest)
    with pytest.raises(StoreError, match="link or not a directory"):
        Download(store, cache, digest)
    assert list(elsewhere.iterdir()) == []

    local = Store((tmp_path / "store").as_uri())
    digest = local.put_blob_bytes(os.urandom(5000))
    cache, elsewhere = _planted(tmp_path / "b", digest)
    path = Path(local.path(f"blobs/sha256/{digest[:2]}/{digest}"))
    fd = os.open(path, os.O_RDONLY)
    try:
        link_into_cache(cache, Blob(fd, Fetched(path, "store"), Verifier(fd, digest), store_path=path), digest)
    finally:
        os.close(fd)
    assert list(elsewhere.iterdir()) == []
