"""Issue 45 item 6: signed documents had no freshness.

A store writer without the key kept the bytes of an old signed `latest` (checkpoint `m` -> v1) and,
after CI moved it to v2, wrote them back: the signature still verified, and every verifying reader
pulled the old checkpoint. A signed pointer now carries a sequence (its signing time, and above the
one it replaces); a reader keeps the highest it has seen per store, domain and name in its node cache
and refuses an older one, with one line, falling back to the newest tag it can list.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bootseer_cli.settings import Settings, StoreSettings, TrustSettings
from bootseer_cli.store.core import open_store_for
from bootseer_cli.stripe import catalog
from bootseer_cli.stripe.layout import latest_rel, manifest_rel
from bootseer_cli.stripe.push import push
from bootseer_cli.trust import keygen

CELL = 64 << 10


def _settings(tmp_path: Path, node: str, *, key: bool) -> Settings:
    keygen(str(tmp_path / "ci.key"), str(tmp_path / "ci.pub"), "ci") if not (tmp_path / "ci.key").exists() else None
    return Settings(
        store=StoreSettings(uri=(tmp_path / "store").as_uri(), cache_dir=tmp_path / f"cache-{node}", domain="ci"),
        trust=TrustSettings(signing_key=tmp_path / "ci.key" if key else None, verify_keys=(str(tmp_path / "ci.pub"),)),
    )


def _push(tmp_path: Path, tag: str) -> None:
    src = tmp_path / f"src-{tag}"
    src.mkdir()
    (src / "weights.bin").write_bytes(tag.encode() * 1000)
    push(open_store_for(_settings(tmp_path, "ci", key=True)), src, "m", tag, stripes=2, cell_size=CELL)


def test_a_replayed_older_latest_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _push(tmp_path, "v1")
    reader = open_store_for(_settings(tmp_path, "reader", key=False))
    assert catalog.resolve_latest(reader, "m") == "v1"
    writer = open_store_for(_settings(tmp_path, "ci", key=True))
    old_latest = writer.get_bytes(latest_rel("m"))
    assert old_latest is not None and b"_sig" in old_latest

    _push(tmp_path, "v2")
    assert catalog.resolve_latest(reader, "m") == "v2"

    writer.put_bytes(latest_rel("m"), old_latest)  # the replay: v1's signed bytes, verbatim
    assert json.loads(reader.get_bytes(latest_rel("m")))["tag"] == "v1"
    capsys.readouterr()
    assert catalog.resolve_latest(reader, "m") == "v2", "the reader pulled the older checkpoint"
    assert catalog.load_manifest(reader, "m").tag == "v2"
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "latest" in ln]
    assert len(lines) == 1 and "older" in lines[0], err

    # a node that never saw v2 cannot tell, but once it has, the same holds there
    fresh = open_store_for(_settings(tmp_path, "fresh", key=False))
    assert reader.get_doc(manifest_rel("m", "v2")) is not None
    assert catalog.resolve_latest(fresh, "m") == "v1"


def test_a_pointer_written_again_is_newer_than_the_one_it_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-to-back writes, and a writer whose clock is an hour behind the last one's, still move
    forward: the sequence is above the replaced document's, so a reader never refuses the real newest."""
    writer = open_store_for(_settings(tmp_path, "ci", key=True))
    reader = open_store_for(_settings(tmp_path, "reader", key=False))
    for i in range(5):
        writer.put_doc("ckpt/x/latest.json", {"tag": f"t{i}"})
        assert (reader.get_doc("ckpt/x/latest.json") or {}).get("tag") == f"t{i}"
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now - 3600)
    writer.put_doc("ckpt/x/latest.json", {"tag": "behind"})
    assert (reader.get_doc("ckpt/x/latest.json") or {}).get("tag") == "behind"
