"""Reading a snapshot blob: its metadata trailer (typed at the read boundary) and its tar member headers.

The format itself, its typed records and the writer are `format.py`; this side is what a restore
needs before and while it extracts (`extract.py`), kept apart so the writer's machinery is not in
the way of reading it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from zlib import adler32

from ..errors import IntegrityError
from .format import (
    BLOCK,
    FORMAT,
    HARDLINK,
    META_FLOOR,
    META_PER_ENTRY,
    TRAILER_MAGIC,
    ArchiveEntry,
    Frame,
    Meta,
)
from .manifest import DIR, FILE, SYMLINK

# ---- reading the metadata ----------------------------------------------------------------------


def meta_cap(entries: int) -> int:
    """The most metadata bytes a snapshot of `entries` entries (and deletions) may have."""
    return META_FLOOR + META_PER_ENTRY * max(0, entries)


ReadAt = Callable[[int, int], bytes]  # (length, offset) -> bytes: a random-access read


def _trailer_doc(
    blob: Path | int | tuple[ReadAt, int], cap: int, read: Callable[[], None] | None = None
) -> tuple[Any, int]:
    """The decoded JSON of the trailer and its size (IntegrityError when there is none, it is corrupt,
    or it decompresses to more than `cap` bytes). `blob` is a path or an open descriptor (the restore
    reads, hashes and extracts one descriptor, so all three see the same file)."""
    if isinstance(blob, tuple):  # a blob read remotely by ranges (its end, before the rest arrives)
        return _trailer_from(blob[0], blob[1], "snapshot", cap, read)
    if isinstance(blob, int):
        return _trailer_from(lambda n, off: os.pread(blob, n, off), os.fstat(blob).st_size, "snapshot", cap, read)
    fd = os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _trailer_from(lambda n, off: os.pread(fd, n, off), os.fstat(fd).st_size, blob.name, cap, read)
    finally:
        os.close(fd)


def _trailer_from(read_at: ReadAt, end: int, name: str, cap: int, read: Callable[[], None] | None) -> tuple[Any, int]:
    import zstandard

    try:
        if end < 16 + 8:
            raise IntegrityError(f"{name}: too short to be a snapshot")
        tail = read_at(16, end - 16)
        if tail[8:] != TRAILER_MAGIC:
            raise IntegrityError(f"{name}: not a bootseer snapshot (no trailer)")
        (n,) = struct.unpack("<Q", tail[:8])
        if n > end - 24:
            raise IntegrityError(f"{name}: corrupt snapshot trailer")
        comp = read_at(n, end - 16 - n)
        if read is not None:
            read()
        reader = zstandard.ZstdDecompressor().stream_reader(comp)
        raw = reader.read(cap + 1)
        if len(raw) > cap:
            raise IntegrityError(f"{name}: snapshot metadata is larger than {cap} bytes")
        return json.loads(raw), len(raw)
    except (ValueError, RecursionError, zstandard.ZstdError) as e:
        raise IntegrityError(f"{name}: corrupt snapshot metadata: {type(e).__name__}: {e}"[:300]) from None


_new_entry = partial(tuple.__new__, ArchiveEntry)  # a row as an entry, all in C (`map` calls it per row)


def entries_from_rows(rows: list[Any]) -> tuple[ArchiveEntry, ...]:
    """The typed entries of metadata rows read back from a blob, each checked as `from_row` checks it.

    Column by column, in C (`map`, `zip`, `set`): ~18 ms for a 21k-entry restore, where one Python call
    per row took ~23 ms of its serial start. Any row that fails goes through `from_row`, which says
    which and why."""
    if rows and set(map(type, rows)) == {list} and set(map(len, rows)) == {6}:
        paths, kinds, modes, sizes, mtimes, extras = zip(*rows, strict=True)
        texts = set(map(type, paths)) | set(map(type, kinds)) | set(map(type, extras))
        numbers = set(map(type, modes)) | set(map(type, sizes)) | set(map(type, mtimes))
        if texts == {str} and numbers == {int} and min(sizes) >= 0:  # `type`, so a bool is no int here
            return tuple(map(_new_entry, rows))
    return tuple(ArchiveEntry.from_row(r) for r in rows)


def _frames(rows: list[Any]) -> tuple[Frame, ...]:
    """The frame index, which must tile the blob from offset 0 without gaps or overlaps."""
    frames = tuple(Frame.from_row(r) for r in rows)
    expect = 0
    for f in frames:
        if f.offset != expect:
            raise IntegrityError("snapshot frame index is not contiguous")
        expect = f.offset + f.length
    return frames


def read_meta(
    blob: Path | int | tuple[ReadAt, int], entries_hint: int | None = None, read: Callable[[], None] | None = None
) -> Meta:
    """The typed metadata of a snapshot blob (checked for shape, not yet for safety: see plan.plan).

    `entries_hint` (from the ref) bounds how far the metadata is decompressed; once parsed, its size
    must be proportional to the entries it lists (`meta_cap`), so a small blob cannot claim a huge
    amount of memory. `read` is called once the trailer's bytes are in, before they are decoded (the
    restore then starts hashing the blob: earlier, the hash's reads queued ahead of the trailer's).
    """
    cap = meta_cap(entries_hint or 0)
    doc, size = _trailer_doc(blob, cap, read)
    name = blob.name if isinstance(blob, Path) else "snapshot"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        fmt = doc.get("format") if isinstance(doc, dict) else None
        raise IntegrityError(f"{name}: unsupported snapshot format {str(fmt)[:40]}")
    for key in ("roots", "deletions", "entries", "chunks"):
        if not isinstance(doc.get(key), list):
            raise IntegrityError(f"{name}: snapshot metadata lacks {key!r}")
    for key in ("roots", "deletions"):
        if not all(isinstance(x, str) for x in doc[key]):
            raise IntegrityError(f"{name}: snapshot metadata {key!r} are not all paths")
    count = len(doc["entries"]) + len(doc["deletions"]) + len(doc["chunks"]) + len(doc["roots"])
    if size > meta_cap(count):
        raise IntegrityError(f"{name}: snapshot metadata of {size} bytes is too large for {count} entries")
    info = {k: v for k, v in doc.items() if k not in ("roots", "deletions", "entries", "chunks", "format")}
    return Meta(
        roots=tuple(doc["roots"]),
        deletions=tuple(doc["deletions"]),
        entries=entries_from_rows(doc["entries"]),
        frames=_frames(doc["chunks"]),
        info=info,
    )


# ---- reading the tar stream --------------------------------------------------------------------

_KINDS = {b"0": FILE, b"\0": FILE, b"5": DIR, b"2": SYMLINK, b"1": HARDLINK}


class Reader(Protocol):
    """What the tar parser reads members from: a frame's tar bytes, decompressed as they are read.

    A view it returns may be overwritten by the next read: the parser copies what it keeps."""

    def read(self, n: int) -> bytes | memoryview: ...


class TarMember(NamedTuple):
    """A member header: its absolute path, kind (None: a type bootseer never restores), size, link.

    A named tuple: built once per member in the restore's workers, at a third of a frozen dataclass's cost."""

    path: str
    kind: str | None
    typeflag: bytes
    size: int
    link: str

    @property
    def padded(self) -> int:
        """The size of its data in the stream (whole 512-byte blocks)."""
        return self.size + (-self.size % BLOCK)


def _octal(b: bytes) -> int:
    if b and b[0] & 0x80:  # GNU base-256 for large numbers
        return int.from_bytes(b[1:], "big")
    b = b.rstrip(b"\0 ").strip()
    try:
        return int(b, 8) if b else 0
    except ValueError:
        raise IntegrityError("snapshot has a tar header with a malformed number") from None


def _cstr(b: bytes) -> str:
    i = b.find(b"\0")
    return (b if i < 0 else b[:i]).decode("utf-8", "surrogateescape")


_ZERO_BLOCK = bytes(BLOCK)
# The header fields a restore reads, in one call: name, size, checksum, typeflag, linkname, magic,
# prefix (mode, owner and mtime are the metadata's, never the header's)
_FIELDS = struct.Struct("100s24x12s12x8sc100s6s82x155s12x")


def _checksum(hdr: bytes | memoryview) -> int:
    """The tar header checksum: the sum of its 512 bytes, its own 8-byte field counted as spaces.

    In C: Adler-32's low half is 1 + the byte sum mod 65521, exact for 256 bytes (at most 65,280),
    so two halves give the exact sum. Python's `sum` over the block cost ~10 µs a header, ~0.3 s of
    CPU across a 20k-file restore."""
    total = (adler32(hdr[:256]) & 0xFFFF) + (adler32(hdr[256:]) & 0xFFFF) - 2
    return total - sum(hdr[148:156]) + 8 * 32


# A GNU long name or long link holds one path (PATH_MAX is 4096): a record claiming more is corrupt.
# Checked before it is read, since it is read whole into memory: a 19 kB frame whose long-name record
# claimed 1.2 GB made the restorer allocate that much (the disk is bounded, memory was not).
LONG_NAME_MAX = 1 << 20


def next_member(r: Reader, limit: int) -> tuple[TarMember | None, int]:
    """Read the next member's header (GNU long-name/long-link records included) from at most `limit` bytes.

    Returns the member (None when only zero blocks or dangling long-name records fitted) and the
    bytes consumed. The member's data is left for the caller to read. Each header is copied once out
    of the reader's buffer and its fields taken in one `struct` call (this runs once per member in
    the restore's workers: slicing field by field cost about twice as much).
    """
    pos = 0
    longname: str | None = None
    longlink: str | None = None
    while pos < limit:
        hdr = bytes(r.read(BLOCK))
        pos += BLOCK
        if len(hdr) < BLOCK:
            raise IntegrityError("snapshot ends inside a tar header")
        if hdr == _ZERO_BLOCK:
            continue  # end-of-archive blocks
        name_f, size_f, sum_f, flag, link_f, magic, prefix_f = _FIELDS.unpack(hdr)
        if _octal(sum_f) != _checksum(hdr):
            raise IntegrityError("snapshot has a tar header with a bad checksum")
        size = _octal(size_f)
        if flag in (b"L", b"K"):
            padded = size + (-size % BLOCK)
            if size > LONG_NAME_MAX or padded > limit - pos:
                raise IntegrityError(f"snapshot has a tar long-name record of {size} bytes (corrupt)")
            val = bytes(r.read(padded))[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            pos += padded
            longname, longlink = (val, longlink) if flag == b"L" else (longname, val)
            continue
        name = longname if longname is not None else _cstr(name_f)
        if longname is None and magic == b"ustar\x00" and prefix_f[0]:
            name = _cstr(prefix_f) + "/" + name
        link = longlink if longlink is not None else _cstr(link_f) if link_f[0] else ""
        return TarMember("/" + name.rstrip("/"), _KINDS.get(flag), flag, size, link), pos
    return None, pos
