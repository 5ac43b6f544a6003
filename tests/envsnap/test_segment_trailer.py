"""The trailer of a blob assembled from segments (issue 28): the segments' entries go into it as
the JSON text their writers made, not encoded again; the trailer must still be exactly the compact
JSON of every entry's row, in the blob's order, whatever mix of own entries and segments made it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import zstandard

from bootseer_cli.envsnap import format, manifest, reader


def _tree(root: Path) -> None:
    for d in ("a", "b", "c"):
        (root / d).mkdir(parents=True)
        for i in range(5):
            (root / d / f"f{i}-é.py").write_text(f"{d}{i}\n" * (i + 1))
    os.symlink("a/f0-é.py", root / "link")


def _trailer_text(blob: Path) -> str:
    data = blob.read_bytes()
    assert data[-8:] == format.TRAILER_MAGIC
    (n,) = struct.unpack("<Q", data[-16:-8])
    return zstandard.ZstdDecompressor().decompress(data[-16 - n : -16]).decode()


def test_a_trailer_of_own_entries_and_segments_is_the_compact_json_of_all_rows(tmp_path: Path) -> None:
    root = tmp_path / "env"
    _tree(root)
    after = manifest.scan([root])
    paths = sorted(after)
    cut = [paths[:4], paths[4:9], paths[9:12], paths[12:]]  # own, segment, own, segment
    blob = tmp_path / "blob.tar.zst"
    w = format.ArchiveWriter(blob)
    for k, run in enumerate(cut):
        if k % 2 == 0:
            for p in run:
                w.add(p, after[p])
            continue
        part = tmp_path / f"part{k}"
        sw = format.ArchiveWriter(part, segment=True)
        for p in run:
            sw.add(p, after[p])
        doc, rows_json = sw.end_segment()
        assert json.loads(rows_json) == [list(e) for e in sw.entries]
        w.append_segment(part, doc, rows_json)
    meta = {"roots": [str(root)], "deletions": ["/gone/é"]}
    w.finish(meta)

    assert [e.path for e in w.entries] == paths
    text = _trailer_text(blob)
    doc = json.loads(text)
    want = dict(meta, format=format.FORMAT, chunks=doc["chunks"], entries=[e.row() for e in w.entries])
    assert text == json.dumps(want, separators=(",", ":"))  # byte for byte what the writer always wrote
    assert reader.read_meta(blob, 1 << 20).entries == tuple(w.entries)
    listed = subprocess.run(["tar", "-I", "zstd", "-tf", str(blob)], capture_output=True, text=True, check=True)
    assert len(listed.stdout.splitlines()) == len(paths)


def test_a_segment_of_no_entries_adds_nothing_to_the_trailer(tmp_path: Path) -> None:
    blob = tmp_path / "blob.tar.zst"
    w = format.ArchiveWriter(blob)
    sw = format.ArchiveWriter(tmp_path / "part", segment=True)
    doc, rows_json = sw.end_segment()
    assert rows_json == "[]"
    w.append_segment(tmp_path / "part", doc, rows_json)
    w.finish({"roots": ["/r"], "deletions": []})
    assert json.loads(_trailer_text(blob))["entries"] == []
