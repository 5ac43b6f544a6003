"""Issue 46 finding 8: `report --since` showed `0 B saved` for env restores from the node cache.

A restore from the node cache delivered the whole blob without the store, but its stage result said it
delivered 0 bytes (only the store's and the peers' bytes were counted), so the report's saving
(delivered minus what the store sent) was zero exactly when the cache saved the most.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

from bootseer_cli.envsnap.stage import _restored_result
from bootseer_cli.report.analysis import _cache_tally
from bootseer_cli.store.cache import BlobCache
from tests.envsnap.test_streamed import make_world, restore


def test_a_restore_from_the_node_cache_counts_its_bytes_as_saved(tmp_path: Path) -> None:
    w = make_world(tmp_path, (tmp_path / "store").as_uri())
    cache = BlobCache(tmp_path / "node2", 1 << 40)
    first = restore(w, cache)  # read in place from the file:// store, then linked into the node cache
    assert first.source == "store"
    shutil.rmtree(w["root"])
    w["root"].mkdir()
    again = restore(w, cache)
    assert again.source == "cache"
    blob = (tmp_path / "store").joinpath(*_blob_parts(w["digest"]))
    result = _restored_result(again)
    assert result.bytes == blob.stat().st_size and result.bytes_from_store == 0
    event = {"stage": "env", "cache": result.cache, "bytes": result.bytes, "bytes_from_store": result.bytes_from_store}
    hits, misses, saved = _cache_tally([SimpleNamespace(events=[event])])
    assert (hits, misses, saved) == (1, 0, blob.stat().st_size)


def _blob_parts(digest: str) -> tuple[str, ...]:
    from bootseer_cli.store.core import blob_path

    return tuple(blob_path(digest).split("/"))
