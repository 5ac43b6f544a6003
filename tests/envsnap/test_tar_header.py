"""The restore's tar header parser (issue 28: the checksum is now summed in C by two Adler-32 halves):
it must accept exactly what the tar spec's byte sum accepts, for any header tar or tarfile writes
and for arbitrary bytes, and still refuse a header whose checksum is off by one."""

from __future__ import annotations

import io
import os
import random
import tarfile

import pytest

from bootseer_cli.envsnap import reader
from bootseer_cli.errors import IntegrityError


def spec_sum(hdr: bytes) -> int:
    """POSIX: the unsigned sum of the header's bytes with the checksum field taken as eight spaces."""
    return sum(hdr[:148]) + 8 * 32 + sum(hdr[156:512])


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.f = io.BytesIO(data)

    def read(self, n: int) -> bytes:
        return self.f.read(n)


def test_checksum_equals_the_spec_sum_on_extreme_and_random_blocks() -> None:
    rng = random.Random(28)
    blocks = [b"\xff" * 512, b"\x01" * 512, bytes(512), b"\xff" * 256 + bytes(256)]
    blocks += [bytes(rng.getrandbits(8) for _ in range(512)) for _ in range(300)]
    for b in blocks:
        assert reader._checksum(b) == spec_sum(b)
        assert reader._checksum(memoryview(bytearray(b * 2))[512:]) == spec_sum(b)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_headers_tarfile_writes_parse_and_a_wrong_checksum_is_refused(fmt: int) -> None:
    ti = tarfile.TarInfo("usr/lib/" + "ü" * 20 + ".so")
    ti.size, ti.mode, ti.mtime = 12345, 0o755, 1_700_000_000
    hdr = ti.tobuf(fmt, "utf-8", "surrogateescape")[:512]
    m, used = reader.next_member(_Bytes(hdr + bytes(12345 + (-12345 % 512))), 1 << 20)
    assert m is not None and used == 512
    assert (m.path, m.size, m.kind) == ("/" + ti.name, 12345, "f")
    bad = bytearray(hdr)
    bad[0] ^= 1  # one bit: the stored checksum no longer matches
    with pytest.raises(IntegrityError, match="bad checksum"):
        reader.next_member(_Bytes(bytes(bad)), 1 << 20)


def test_the_writers_own_headers_parse(tmp_path: object) -> None:
    from bootseer_cli.envsnap import format

    for size in (0, 1, 511, 512, os.getpid() % 100_000):
        hdr = format._tar_header("/opt/venv/x/" + "n" * 120, "f", 0o644, 1_700_000_000, size)
        m, _ = reader.next_member(_Bytes(hdr), len(hdr))
        assert m is not None and m.size == size and m.path == "/opt/venv/x/" + "n" * 120


def test_the_writers_headers_are_tarfiles_on_random_entries() -> None:
    """The writer's headers (one `struct` pack, the checksum summed beforehand) are byte for byte
    what tarfile's GNU_FORMAT writes: names and links around the 100-byte field (long-name records),
    non-ASCII and undecodable bytes (the checksum's widest sums), every kind, mode bits beyond 0o777."""
    from bootseer_cli.envsnap import format, manifest

    rng = random.Random(2028)
    alphabet = ["a", "Z", "_", ".", "é", "€", "\U0001f40d", "\udcff", "/"]
    kinds = [manifest.FILE, manifest.DIR, manifest.SYMLINK, format.HARDLINK]
    for i in range(3000):
        name = "/" + "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 20, 50, 99, 100, 101, 140])))
        link = "/" + "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 30, 99, 100, 120])))
        kind = kinds[i % 4]
        mode = rng.choice([0o644, 0o755, 0o4755, 0o100600, 0o40777, 0o7777])
        mtime = rng.choice([0, 1, 1_700_000_000, 8**11 - 1])
        size = rng.choice([0, 1, 511, 512, 4 << 20, 8**11 - 1]) if kind == manifest.FILE else 0
        args = (name, kind, mode, mtime, size, link if kind in (manifest.SYMLINK, format.HARDLINK) else "")
        assert format._tar_header(*args) == format._tarfile_header(*args), args


def test_a_header_of_the_widest_bytes_has_the_spec_checksum() -> None:
    """Names and links of 100 bytes of 0xff (as surrogate escapes): the largest sums the checksum
    can see; tar's own byte sum must match what the header stores."""
    from bootseer_cli.envsnap import format

    hdr = format._tar_header("/" + "\udcff" * 100, format.HARDLINK, 0o7777, 8**11 - 1, 0, "/" + "\udcff" * 100)
    assert len(hdr) == 512 and int(hdr[148:154], 8) == spec_sum(hdr)
    m, _ = reader.next_member(_Bytes(hdr), len(hdr))
    assert m is not None and m.kind == "h"
