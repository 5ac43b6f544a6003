"""Hostile and broken snapshots: tar-slip (`..`, absolute, symlink escape, device node), bad metadata,
a failure half way. Each must be refused with nothing written outside the roots and the tree whole."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
import tarfile
from pathlib import Path

import pytest
import zstandard

from bootseer_cli.envsnap import extract, format, reader
from bootseer_cli.errors import IntegrityError
from tests.envsnap.conftest import tree_state


def craft(
    blob: Path,
    members: list[tuple[tarfile.TarInfo, bytes]],
    entries: list[list],
    roots: list[str],
    deletions: list[str] | None = None,
    cut: int | None = None,
) -> format.Meta:
    """A blob in the snapshot format with arbitrary tar members and an arbitrary entry list."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    data = raw.getvalue()[:cut]
    frame = zstandard.ZstdCompressor().compress(data)
    meta = {
        "format": 1,
        "roots": roots,
        "deletions": deletions or [],
        "entries": entries,
        "chunks": [[0, len(frame), len(data)]],
    }
    z = zstandard.ZstdCompressor().compress(json.dumps(meta).encode())
    payload = z + struct.pack("<Q", len(z)) + format.TRAILER_MAGIC
    blob.write_bytes(frame + struct.pack("<II", format.SKIPPABLE_MAGIC, len(payload)) + payload)
    return reader.read_meta(blob)


def reg(name: str, data: bytes = b"payload") -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = 0o644
    return ti, data


@pytest.fixture
def world(tmp_path: Path) -> dict:
    """A root with content, and a neighbour directory outside it that must never change."""
    root = tmp_path / "env"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "ok.py").write_text("ok\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("untouched\n")
    os.symlink(str(outside), root / "escape")  # a symlink on disk that points outside the root
    os.symlink(str(outside / "secret"), root / "lib" / "link_to_secret")
    before = tree_state(tmp_path, skip=(str(tmp_path / "blob"),))
    return {"tmp": tmp_path, "root": root, "outside": outside, "before": before}


def assert_untouched(w: dict) -> None:
    after = tree_state(w["tmp"], skip=(str(w["tmp"] / "blob"),))
    assert after == w["before"], "the failed restore changed the tree or wrote outside the roots"
    assert (w["outside"] / "secret").read_text() == "untouched\n"


def rel(p: Path) -> str:
    return str(p).lstrip("/")


def test_dotdot_in_the_entry_list_is_refused(world: dict) -> None:
    root = world["root"]
    evil = f"{root}/lib/../../outside/evil"
    meta = craft(world["tmp"] / "blob", [reg(evil.lstrip("/"))], [[evil, "f", 0o644, 7, 0, ""]], [str(root)])
    with pytest.raises(format.UnsafeArchive, match="not a normal path"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)


def test_absolute_path_outside_the_roots_is_refused(world: dict) -> None:
    root, outside = world["root"], world["outside"]
    meta = craft(
        world["tmp"] / "blob",
        [reg(rel(outside / "evil"))],
        [[str(outside / "evil"), "f", 0o644, 7, 0, ""]],
        [str(root)],
    )
    with pytest.raises(format.UnsafeArchive, match="outside the roots"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)


def test_tar_member_not_in_the_list_is_refused_and_undone(world: dict) -> None:
    """The list is clean but the tar stream smuggles `..` after a legitimate file: undo the legit one."""
    root = world["root"]
    good = f"{root}/lib/new.py"
    members = [reg(good.lstrip("/")), reg(f"{rel(root)}/../outside/evil")]
    meta = craft(
        world["tmp"] / "blob",
        members,
        [[good, "f", 0o644, 7, 0, ""], [f"{root}/lib/other.py", "f", 0o644, 7, 0, ""]],
        [str(root)],
    )
    with pytest.raises(format.UnsafeArchive, match="not in the snapshot's list"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)


def test_writing_through_a_symlink_on_disk_is_refused(world: dict) -> None:
    root = world["root"]
    evil = f"{root}/escape/evil"  # root/escape -> outside
    meta = craft(world["tmp"] / "blob", [reg(evil.lstrip("/"))], [[evil, "f", 0o644, 7, 0, ""]], [str(root)])
    with pytest.raises(format.UnsafeArchive, match="outside"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)


def test_symlink_of_the_snapshot_cannot_be_a_parent(world: dict) -> None:
    root = world["root"]
    link = tarfile.TarInfo(f"{rel(root)}/lib/sneaky")
    link.type, link.linkname = tarfile.SYMTYPE, str(world["outside"])
    evil = f"{root}/lib/sneaky/evil"
    meta = craft(
        world["tmp"] / "blob",
        [(link, b""), reg(evil.lstrip("/"))],
        [[f"{root}/lib/sneaky", "l", 0o777, 0, 0, str(world["outside"])], [evil, "f", 0o644, 7, 0, ""]],
        [str(root)],
    )
    with pytest.raises(format.UnsafeArchive, match="below the snapshot's symlink"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)


def test_replacing_a_symlink_never_writes_through_it(world: dict) -> None:
    """A file member where a symlink to an outside file stands replaces the link, not the target."""
    root = world["root"]
    p = f"{root}/lib/link_to_secret"
    meta = craft(world["tmp"] / "blob", [reg(p.lstrip("/"), b"mine")], [[p, "f", 0o644, 4, 0, ""]], [str(root)])
    extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert not os.path.islink(p) and Path(p).read_bytes() == b"mine"
    assert (world["outside"] / "secret").read_text() == "untouched\n"


@pytest.mark.parametrize("devtype", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_device_nodes_are_refused(world: dict, devtype: bytes) -> None:
    root = world["root"]
    dev = tarfile.TarInfo(f"{rel(root)}/lib/dev")
    dev.type, dev.devmajor, dev.devminor = devtype, 1, 3
    good = f"{root}/lib/new.py"
    # listed as a file so the list check passes; the tar header says device: the parser refuses it
    meta = craft(
        world["tmp"] / "blob",
        [reg(good.lstrip("/")), (dev, b"")],
        [[good, "f", 0o644, 7, 0, ""], [f"{root}/lib/dev", "f", 0o644, 0, 0, ""]],
        [str(root)],
    )
    with pytest.raises(format.UnsafeArchive, match="device node"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)
    # and listed as a device: refused before anything is written
    device = meta.entries[1]._replace(kind="c")
    meta = dataclasses.replace(meta, entries=(meta.entries[0], device))
    with pytest.raises(format.UnsafeArchive, match="cannot be restored"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)


def test_deleting_outside_or_a_root_is_refused(world: dict) -> None:
    root = world["root"]
    for bad in (str(world["outside"] / "secret"), str(root)):
        meta = craft(world["tmp"] / "blob", [], [], [str(root)], deletions=[bad])
        with pytest.raises(format.UnsafeArchive):
            extract.extract(world["tmp"] / "blob", meta, [str(root)])
        assert_untouched(world)


def test_failure_half_way_puts_back_replaced_and_deleted_files(world: dict) -> None:
    """Replace ok.py, delete lib/link_to_secret, then hit a bad member: everything comes back."""
    root = world["root"]
    ok = f"{root}/lib/ok.py"
    members = [
        reg(ok.lstrip("/"), b"replaced"),
        reg(f"{rel(root)}/lib/a.py"),
        reg(f"{rel(root)}/lib/zz.py", b"z" * 5000),
    ]
    meta = craft(
        world["tmp"] / "blob",
        members,
        [
            [ok, "f", 0o644, 8, 0, ""],
            [f"{root}/lib/a.py", "f", 0o644, 7, 0, ""],
            [f"{root}/lib/zz.py", "f", 0o644, 7, 0, ""],
        ],
        [str(root)],
        deletions=[f"{root}/lib/link_to_secret"],
        cut=5 * 512 + 2048,
    )  # ends inside zz.py
    with pytest.raises(IntegrityError, match="put back"):
        extract.extract(world["tmp"] / "blob", meta, [str(root)])
    assert_untouched(world)


def test_truncated_and_garbage_blobs_are_refused(world: dict) -> None:
    root = world["root"]
    blob = world["tmp"] / "blob"
    good = f"{root}/lib/new.py"
    craft(blob, [reg(good.lstrip("/"))], [[good, "f", 0o644, 7, 0, ""]], [str(root)])
    data = blob.read_bytes()
    blob.write_bytes(data[: len(data) // 2])
    with pytest.raises(IntegrityError):
        reader.read_meta(blob)
    blob.write_bytes(os.urandom(4096))
    with pytest.raises(IntegrityError):
        reader.read_meta(blob)
    # a frame that does not decompress
    blob.write_bytes(data)
    meta = reader.read_meta(blob)
    bad = bytearray(data)
    bad[10] ^= 0xFF
    blob.write_bytes(bytes(bad))
    with pytest.raises(IntegrityError):
        extract.extract(blob, meta, [str(root)])
    blob.unlink()
    assert_untouched(world)
