"""The restore decompresses each frame piece by piece (issue 28): `apply._ChunkReader`, the hash in a
forked child started before the plan (`delivery.Verifier`), and the plan's batched path checks.

A frame is no longer decompressed whole, so what the one-shot call checked (the frame holds exactly
its listed raw size, its zstd checksum) must still hold, and files that straddle the pieces must come
out byte for byte."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import struct
import tarfile
from pathlib import Path

import pytest
import zstandard

from bootseer_cli.delivery import DigestMismatch, Verifier
from bootseer_cli.envsnap import apply, extract, format, plan, reader
from bootseer_cli.errors import IntegrityError
from tests.envsnap.conftest import tree_state


def _blob(
    path: Path, members: list[tuple[str, bytes]], root: str, *, raw_delta: int = 0, bad_sum: bool = False
) -> None:
    """A blob of one frame holding `members` (files under `root`), its index claiming `raw_delta` more
    raw bytes than the frame holds; `bad_sum`: the frame's content checksum flipped."""
    buf = io.BytesIO()
    entries = [[root, "d", 0o755, 0, 0, ""]]
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        ti = tarfile.TarInfo(root.lstrip("/"))
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(ti)
        for name, data in members:
            ti = tarfile.TarInfo(f"{root.lstrip('/')}/{name}")
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(ti, io.BytesIO(data))
            entries.append([f"{root}/{name}", "f", 0o644, len(data), 1_700_000_000, ""])
    raw = buf.getvalue()
    frame = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(raw))
    if bad_sum:
        frame[-1] ^= 0xFF
    meta = {"format": 1, "roots": [root], "deletions": [], "entries": entries}
    meta["chunks"] = [[0, len(frame), len(raw) + raw_delta]]
    z = zstandard.ZstdCompressor().compress(json.dumps(meta).encode())
    payload = z + struct.pack("<Q", len(z)) + format.TRAILER_MAGIC
    path.write_bytes(bytes(frame) + struct.pack("<II", format.SKIPPABLE_MAGIC, len(payload)) + payload)


def _members(n: int, seed: int = 7) -> list[tuple[str, bytes]]:
    """Files of every size around the piece size: empty, a byte, a block, a piece ± a block, pieces."""
    rnd = random.Random(seed)
    c = apply.CHUNK
    sizes = [0, 1, 511, 512, 513, c - 512, c - 1, c, c + 1, c + 512, 3 * c + 7]
    sizes += [rnd.randrange(0, 2 * c) for _ in range(n)]
    return [(f"f{i:03d}", rnd.randbytes(s)) for i, s in enumerate(sizes)]


def test_files_across_the_pieces_come_out_byte_for_byte(tmp_path: Path) -> None:
    root = str(tmp_path / "env")
    members = _members(40)
    _blob(tmp_path / "blob", members, root)
    extract.extract(tmp_path / "blob", reader.read_meta(tmp_path / "blob"), [root], threads=1)
    for name, data in members:
        assert Path(root, name).read_bytes() == data, name


@pytest.mark.parametrize("delta", [-512, 512])
def test_a_frame_not_of_its_listed_size_is_corrupt_and_undone(tmp_path: Path, delta: int) -> None:
    """The one-shot decompress refused a frame whose size differs from its index; the pieces must too:
    larger (more than listed, nothing may be left unread) and smaller (the listing runs past it)."""
    root = tmp_path / "env"
    root.mkdir()
    (root / "keep").write_text("before\n")
    before = tree_state(tmp_path, skip=(str(tmp_path / "blob"),))
    _blob(tmp_path / "blob", _members(3), str(root), raw_delta=delta)
    with pytest.raises(IntegrityError):
        extract.extract(tmp_path / "blob", reader.read_meta(tmp_path / "blob"), [str(root)], threads=1)
    assert tree_state(tmp_path, skip=(str(tmp_path / "blob"),)) == before


def test_a_frame_whose_checksum_fails_is_corrupt_and_undone(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    before = tree_state(tmp_path)
    _blob(tmp_path / "blob", _members(3), str(root), bad_sum=True)
    with pytest.raises(IntegrityError, match="corrupt"):
        extract.extract(tmp_path / "blob", reader.read_meta(tmp_path / "blob"), [str(root)], threads=1)
    assert tree_state(tmp_path, skip=(str(tmp_path / "blob"),)) == before


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def test_the_hash_runs_in_a_child_and_says_match_or_mismatch(tmp_path: Path) -> None:
    blob = tmp_path / "b"
    blob.write_bytes(os.urandom(9 << 20))
    digest = hashlib.sha256(blob.read_bytes()).hexdigest()
    fd = _open(blob)
    try:
        good = Verifier(fd, digest)
        good.start()
        assert good._pid > 0 and good._pid != os.getpid()
        good.check()
        bad = Verifier(fd, "0" * 64)
        with pytest.raises(DigestMismatch):
            bad.check()  # started by the check itself when nobody started it
    finally:
        os.close(fd)


def test_a_hash_never_asked_for_is_stopped_and_reaped(tmp_path: Path) -> None:
    """A restore that fails before its commit never asks: closing the blob must not leave the child."""
    blob = tmp_path / "b"
    blob.write_bytes(os.urandom(1 << 20))
    fd = _open(blob)
    try:
        v = Verifier(fd, "0" * 64)
        v.start()
        pid = v._pid
        v.close()
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left
        v.close()  # twice is harmless
    finally:
        os.close(fd)


TRICKY = [
    "/r/v",
    "/r/v/a",
    "/r/v/a/b",
    "/r/v/",
    "/r/v//a",
    "/r/v/./a",
    "/r/v/..",
    "/r/v/a/.",
    "r/v/a",
    "/r/va",
    "/r/v/a\0b",
    "/r",
    "/r/v/..a",
    "/r/v/.a",
    "",
    "/r/v/a\n/r/v/b",
    "/r/v/a/..",
    "/r/v/a/../b",
    "/r/v/a\n",
]


@pytest.mark.parametrize("roots", [["/r/v"], ["/r/v", "/q"]])
def test_the_batched_path_check_agrees_with_the_one_path_check(roots: list[str]) -> None:
    for p in TRICKY:
        try:
            plan._check_path(p, roots)
            ok = True
        except format.UnsafeArchive:
            ok = False
        assert plan._paths_ok([p], roots) is ok, p
        assert plan._paths_ok(["/r/v/x", p, "/r/v/y"], roots) is ok, p
    assert plan._paths_ok([], roots)
