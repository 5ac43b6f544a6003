"""Issue 45 item 10: the swarm's copy-out and `_keep_torrent` wrote into the node cache by path.

The node cache may be a directory its user can write while root (the Slurm prolog, `exec`) fetches
into it. Every other writer there enters the fan-out directories without following links
(`store/cachedir.py`); these two made `sha256/<xx>` by path and wrote their temporaries below it, so a
user's `sha256/<xx> -> /etc/cron.d` made root write a file of the swarm's bytes into /etc/cron.d.
A link planted at the destination's directory must be refused, never followed, and the fetch goes on.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.p2p.copyout import keep_torrent
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.cachedir import UnsafeCacheDir
from tests.p2p.test_helper import _download, helper  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _plant(cache: BlobCache, digest: str, outside: Path) -> None:
    """`sha256/<first two>` of `digest` made a link to `outside` (a directory that is not the cache's)."""
    fan = cache.path(digest).parent
    fan.parent.mkdir(parents=True, exist_ok=True)
    fan.symlink_to(outside, target_is_directory=True)


def test_keep_torrent_does_not_write_through_a_linked_fanout_directory(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    outside = tmp_path / "cron.d"
    outside.mkdir(mode=0o700)
    torrent = b"d8:announce0:e" * 10
    tdigest = hashlib.sha256(torrent).hexdigest()
    _plant(cache, tdigest, outside)
    keep_torrent(cache, tdigest, torrent)  # a torrent not kept is only a store read later: no error
    assert os.listdir(outside) == []
    assert os.path.islink(cache.path(tdigest).parent)


def test_keep_torrent_keeps_it_where_the_cache_is_sound(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    torrent = b"d8:announce0:e"
    tdigest = hashlib.sha256(torrent).hexdigest()
    keep_torrent(cache, tdigest, torrent)
    path = cache.get(tdigest)
    assert path is not None and path.read_bytes() == torrent
    assert [n for n in os.listdir(path.parent) if n.startswith(".")] == []


def test_the_copy_out_does_not_write_through_a_linked_fanout_directory(
    helper: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    from bootseer_cli.p2p.copyout import PrefixCopier

    cache = BlobCache(tmp_path / "cache", 1 << 30)
    handle, digest, real = _download(helper, tmp_path)
    (helper.work / handle.dir / handle.digest).write_bytes(real)
    outside = tmp_path / "cron.d"
    outside.mkdir(mode=0o700)
    _plant(cache, digest, outside)
    with pytest.raises(UnsafeCacheDir):
        copier = PrefixCopier(helper, handle, cache, digest)
        copier.start()
        copier.finish()
        copier.adopt()
    assert os.listdir(outside) == []
    os.unlink(cache.path(digest).parent)
    good = PrefixCopier(helper, handle, cache, digest)
    good.start()
    assert good.finish() == digest
    path = good.adopt()
    assert path.read_bytes() == real and [n for n in os.listdir(path.parent) if n.startswith(".")] == []
