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
