"""A snapshot's tar headers are the store's word: a size in one never decides how much memory is taken.

A long-name record (GNU "L"/"K") is read whole into memory; one claiming 1.2 GB in a 19 kB frame made
the restorer allocate 1.2 GB. Now it is corrupt (IntegrityError) before anything is read."""

from __future__ import annotations

import io
import tarfile

import pytest

from bootseer_cli.envsnap.reader import LONG_NAME_MAX, next_member
from bootseer_cli.errors import IntegrityError


class _Watched:
    """A reader over bytes that remembers the largest read asked of it."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.largest = data, 0, 0

    def read(self, n: int) -> bytes:
        self.largest = max(self.largest, n)
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


def _archive(name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    return buf.getvalue()


def _claim(data: bytes, size: int) -> bytes:
    """`data` with its first header's size field set to `size` (base-256) and its checksum redone."""
    hdr = bytearray(data[:512])
    assert hdr[156:157] == b"L"
    hdr[124:136] = bytes([0x80]) + size.to_bytes(11, "big")
    hdr[148:156] = b" " * 8
    hdr[148:156] = f"{sum(hdr):06o}\0 ".encode()
    return bytes(hdr) + data[512:]


def test_a_long_name_is_read() -> None:
    name = "d/" + "n" * 300
    data = _archive(name)
    m, _ = next_member(_Watched(data), len(data))
    assert m is not None and m.path == "/" + name and m.size == 3


@pytest.mark.parametrize("size", [1_200_000_000, LONG_NAME_MAX + 1])
def test_a_long_name_record_claiming_too_much_is_corrupt_and_not_read(size: int) -> None:
    data = _claim(_archive("d/" + "n" * 300), size)
    assert len(data) < 19_000  # the whole frame
    r = _Watched(data + b"\0" * 1024)
    with pytest.raises(IntegrityError, match="long-name record"):
        next_member(r, 1 << 40)  # even where the frame claims to be that long
    assert r.largest <= 512


def test_a_long_name_record_beyond_its_frame_is_corrupt() -> None:
    data = _archive("d/" + "n" * 300)
    r = _Watched(data)
    with pytest.raises(IntegrityError):
        next_member(r, 512)  # the frame ends after the record's header
    assert r.largest <= 512
