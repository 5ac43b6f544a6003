"""Issue 45 item 4: root's capture followed a directory swapped for a link while it read the files.

The scan lists `<root>/pkg/…` (the tree's own files); before the files are read, the tree's user swaps
`pkg` for a symlink to a root-only directory holding files of the same names. Reading each listed
file by path then published the root-only files. The capture must read every file through directory
descriptors opened without following a link at any component: the swap makes the capture fail (or
read the tree's own files), and the root-only bytes are in no blob.

The swap is made at a fixed point, not raced: after the scan (small files, the forked segment
writers) or as the scan offers the first large file to the large-file writer (which reads it at once).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zstandard

from bootseer_cli.envsnap import capture, format, manifest, reader, segments
from bootseer_cli.errors import BootseerError
from bootseer_cli.settings import StoreSettings
from bootseer_cli.store.cache import BlobCache

SECRET = b"ROOT-ONLY-SECRET-"
BIG = format.CHUNK_BYTES // 2 + 4096


def _tree(tmp_path: Path, kind: str) -> tuple[Path, Path, dict[str, bytes]]:
    """(root, root-only directory, the tree's files in pkg): same names, the secret's bytes outside."""
    root, secret = tmp_path / "env", tmp_path / "rootonly"
    (root / "pkg").mkdir(parents=True)
    secret.mkdir(mode=0o700)
    names = {"small": ["a.py"], "many": [f"m{i}.py" for i in range(4500)], "big": ["big.so"]}[kind]
    files = {}
    for n in names:
        size = BIG if kind == "big" else 64
        files[n] = os.urandom(size)
        (root / "pkg" / n).write_bytes(files[n])
        (secret / n).write_bytes((SECRET * (size // len(SECRET) + 1))[:size])
        os.chmod(secret / n, 0o600)
    return root, secret, files


def _swap(root: Path, secret: Path) -> None:
    os.rename(root / "pkg", root / "pkg.orig")
    os.symlink(secret, root / "pkg")


def _raw(blob: Path) -> bytes:
    """The blob's whole tar stream (every frame decompressed)."""
    meta = reader.read_meta(blob)
    data = blob.read_bytes()
    d = zstandard.ZstdDecompressor()
    return b"".join(d.decompress(data[f.offset : f.offset + f.length], max_output_size=f.raw) for f in meta.frames)


@pytest.mark.parametrize("kind", ["small", "many", "big"])
def test_a_directory_swapped_for_a_link_during_the_capture_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    root, secret, files = _tree(tmp_path, kind)
    baseline: manifest.Manifest = {}
    swapped: list[bool] = []
    if kind == "big":
        offer = segments.BigWriter.offer

        def swap_on_offer(self: segments.BigWriter, path: str, e: manifest.Entry) -> None:
            if not swapped and path.endswith("/pkg/big.so"):
                _swap(root, secret)
                swapped.append(True)
            offer(self, path, e)

        monkeypatch.setattr(segments.BigWriter, "offer", swap_on_offer)
    else:
        diff = manifest.diff

        def swap_after_scan(*a: object, **k: object) -> manifest.Diff:
            out = diff(*a, **k)  # type: ignore[arg-type]
            _swap(root, secret)
            swapped.append(True)
            return out

        monkeypatch.setattr(manifest, "diff", swap_after_scan)
    cache_dir = tmp_path / "cache"
    settings = StoreSettings(uri=(cache_dir / "store").as_uri(), cache_dir=cache_dir)
    try:
        cap = capture.capture(settings, [str(root)], baseline, "a" * 64, BlobCache(cache_dir, 1 << 40), warn=print)
    except BootseerError as e:  # refusing to read through the link is right: nothing is published
        assert "pkg" in str(e), e
        return
    finally:
        assert swapped, "the swap happened"
    raw = _raw(cap.blob)
    assert SECRET not in raw, "a root-only file reached the blob through the swapped directory"
    assert all(data in raw for data in files.values()), "what was read is the tree's own files"
