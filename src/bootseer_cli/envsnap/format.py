"""The snapshot blob format: a tar stream in independent zstd frames, with a metadata trailer.

Format (version 1). The blob is a plain `.tar.zst`: `zstd -d | tar -x` (or `tar -I zstd -xf`)
reads it, which keeps it inspectable with standard tools. Inside, the tar stream (GNU format,
member names relative to `/`) is cut at member boundaries into chunks of a few MiB, each compressed
as its own zstd frame, in parallel. A trailing zstd *skippable* frame, which zstd and tar ignore,
holds the metadata: roots, deletions, every entry (a file's sha256 only when the writer was asked
for it: `file_digests`), and the offset of each frame. Independent frames are what make the
restore fast: each worker decompresses its own frames (zstandard releases the GIL), where a single
zstd stream would serialise everything behind one decompressor, as `tar -I zstd` does.

This module holds the format's constants, its typed records (`ArchiveEntry`, `Frame`, `Meta`) and
the writer. The reading side (the metadata reader, which types the JSON rows on disk, and the tar
member parser) is `reader.py`; what is done with a blob's contents, safely, is `extract.py`."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from zlib import adler32

from ..errors import BootseerError, IntegrityError
from .manifest import DIR, FILE, SYMLINK, Entry, open_regular_stat
from .sink import Sink
from .unsafe import UnsafeArchive

if TYPE_CHECKING:
    from concurrent.futures import Future

    import zstandard

FORMAT = 1
TRAILER_MAGIC = b"BSEESNP1"
SKIPPABLE_MAGIC = 0x184D2A5B  # one of the sixteen skippable-frame magics zstd reserves
HARDLINK = "h"
CHUNK_BYTES = 4 << 20  # tar bytes per frame: big enough to compress well, small enough to spread
BIG_JOB_MIN = 1 << 20  # a large file's zstd job: no smaller (the ratio and per-job costs), see `_big_compressor`
BIG_JOB_DEFAULT = 8 << 20  # zstd's own job size at level 3 (window 2 MiB, times 4)
BLOCK = 512
CHUNK_ROOM = CHUNK_BYTES + CHUNK_BYTES // 2 + (64 << 10)  # a chunk's buffer: cut at CHUNK_BYTES, plus one file
META_FLOOR = 4 << 20  # metadata bytes any snapshot may have, however few its entries
META_PER_ENTRY = 640  # and per entry beyond that (about 6 MiB per 10,000 entries)

Progress = Callable[[int], None]


# ---- typed metadata ----------------------------------------------------------------------------


class ArchiveEntry(NamedTuple):
    """One listed entry of a snapshot. On disk it is the JSON row `[path, kind, mode, size, mtime, extra]`.

    `extra` depends on the kind: a file's sha256, a symlink's target, the earlier path a hardlink
    links to, "" for a directory.

    A NamedTuple, not a frozen dataclass: built once per entry by a capture and a restore (21k for a
    torch env), it costs ~0.4 µs where the dataclass cost ~1 µs; as immutable, and `json` writes it
    as its row."""

    path: str
    kind: str  # FILE, DIR, SYMLINK or HARDLINK (anything else is refused by the extraction plan)
    mode: int
    size: int
    mtime: int  # whole seconds
    extra: str = ""

    @classmethod
    def from_row(cls, row: object) -> ArchiveEntry:
        """The typed entry of one metadata row; its shape is checked here, its safety by the plan."""
        if type(row) is not list or len(row) != 6:
            raise UnsafeArchive(f"malformed snapshot entry {str(row)[:200]}")
        path, kind, mode, size, mtime, extra = row
        # exact type tests (JSON yields only int and bool here; bool is refused): ~3× cheaper per row
        # than generator expressions, which counts at 20k+ rows per restore
        if (
            type(mode) is not int
            or type(size) is not int
            or type(mtime) is not int
            or type(path) is not str
            or type(kind) is not str
            or type(extra) is not str
            or size < 0
        ):
            raise UnsafeArchive(f"malformed snapshot entry {str(row)[:200]}")
        return _tuple_new(cls, row)

    def row(self) -> list[Any]:
        """The row as written on disk (and shown by `bootseer env show --json`)."""
        return list(self)


_tuple_new = tuple.__new__


def entries_of_rows(rows: list[list[Any]]) -> list[ArchiveEntry]:
    """Entries of rows this capture's own forked writers made (not a blob read back): no shape checks."""
    return [_tuple_new(ArchiveEntry, r) for r in rows]


@dataclass(frozen=True, slots=True)
class Frame:
    """One zstd frame of the blob: where it starts, its compressed and its raw (tar) length."""

    offset: int
    length: int
    raw: int

    @classmethod
    def from_row(cls, row: object) -> Frame:
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(x, int) and x >= 0 for x in row)):
            raise IntegrityError(f"malformed snapshot frame index {row!r}")
        return cls(row[0], row[1], row[2])


@dataclass(frozen=True)
class Meta:
    """The metadata trailer of a blob, typed (checked for shape, not yet for safety)."""

    roots: tuple[str, ...]
    deletions: tuple[str, ...]
    entries: tuple[ArchiveEntry, ...]
    frames: tuple[Frame, ...]
    info: dict[str, Any] = field(default_factory=dict)  # env_key, created, creator: shown, never trusted


# ---- writing -----------------------------------------------------------------------------------


@dataclass
class Written:
    digest: str
    size: int
    files: int
    raw_bytes: int


_TYPEFLAG = {FILE: b"0", DIR: b"5", SYMLINK: b"2", HARDLINK: b"1"}
_GNU_MAGIC = b"ustar  \0"
_OCTAL_MAX = {8: 8**7, 12: 8**11}
# A header laid out as tarfile's GNU_FORMAT writes it (owner 0, no owner names): name; mode, uid,
# gid, size, mtime (48 bytes, one `%` format); the checksum; typeflag; link; magic; NULs to 512.
_HEAD = struct.Struct("100s48s8sc100s8s247x")
_NUMS = b"%07o\x000000000\x000000000\x00%011o\x00%011o\x00"
_HEAD_CONST = 8 * 32 + sum(_GNU_MAGIC)  # the byte sum of the checksum field (as spaces) and the magic


def _raw_header(name: bytes, typeflag: bytes, mode: int, mtime: int, size: int, link: bytes) -> bytes:
    """One 512-byte header block, laid out as tarfile's GNU_FORMAT writes it (owner 0, no names).

    One `struct` pack, its checksum (the byte sum, its own field as spaces) summed beforehand: name,
    numbers and link by Adler-32 in C (whose low half is 1 + the byte sum below 65,521; here at most
    2 × 100 × 255 + 48 × 55 = 53,640), plus the constant parts. ~1.3 µs a header, was ~2.6 µs."""
    if len(name) > 100:
        name = name[:100]
    if len(link) > 100:
        link = link[:100]
    nums = _NUMS % (mode, size, mtime)
    total = (adler32(link, adler32(nums, adler32(name))) & 0xFFFF) - 1 + typeflag[0] + _HEAD_CONST
    return _HEAD.pack(name, nums, b"%06o\0 " % total, typeflag, link, _GNU_MAGIC)


def _long_record(value: bytes, typeflag: bytes) -> bytes:
    """A GNU long-name (L) or long-link (K) record: a header, then the NUL-terminated value in blocks."""
    data = value + b"\0"
    return _raw_header(b"././@LongLink", typeflag, 0, 0, len(data), b"") + data + b"\0" * (-len(data) % BLOCK)


def _tar_header(name: str, kind: str, mode: int, mtime: int, size: int = 0, link: str = "") -> bytes:
    """One GNU tar header (long names become GNU long-name records), owner root, name relative to /.

    Built by hand: tarfile's TarInfo.tobuf cost ~0.1 ms per entry, 2 s of a 23k-entry capture.
    Numbers beyond the octal fields (files of 8 GiB and more, mtimes before 1970) go to tarfile."""
    if not (0 <= size < _OCTAL_11 and 0 <= mtime < _OCTAL_11):
        return _tarfile_header(name, kind, mode, mtime, size, link)
    bname = name.lstrip("/").encode("utf-8", "surrogateescape")
    if kind == FILE:  # most entries: no link, no trailing slash
        if len(bname) > 100:
            return _long_record(bname, b"L") + _raw_header(bname, b"0", mode & 0o7777, mtime, size, b"")
        return _raw_header(bname, b"0", mode & 0o7777, mtime, size, b"")
    if kind == DIR and not bname.endswith(b"/"):
        bname += b"/"
    blink = (link.lstrip("/") if kind == HARDLINK else link).encode("utf-8", "surrogateescape")
    out = b""
    if len(blink) > 100:
        out += _long_record(blink, b"K")
    if len(bname) > 100:
        out += _long_record(bname, b"L")
    return out + _raw_header(bname, _TYPEFLAG[kind], mode & 0o7777, mtime, 0, blink)


_OCTAL_11 = _OCTAL_MAX[12]


def _dumps(obj: object) -> str:
    """Compact JSON, as the trailer has always been written (an entry is written as its row)."""
    return json.dumps(obj, separators=(",", ":"))


_ZEROS = bytes(BLOCK)


def _tarfile_header(name: str, kind: str, mode: int, mtime: int, size: int = 0, link: str = "") -> bytes:
    """The same header by tarfile (GNU base-256 numbers for what octal cannot hold)."""
    import tarfile  # rare (files of 8 GiB and more): not on every capture's import path

    ti = tarfile.TarInfo(name.lstrip("/"))
    ti.mode = mode & 0o7777
    ti.mtime = mtime
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    if kind == FILE:
        ti.type, ti.size = tarfile.REGTYPE, size
    elif kind == DIR:
        ti.type = tarfile.DIRTYPE
    elif kind == SYMLINK:
        ti.type, ti.linkname = tarfile.SYMTYPE, link
    else:
        ti.type, ti.linkname = tarfile.LNKTYPE, link.lstrip("/")
    return ti.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


class ArchiveWriter:
    """Build a snapshot blob at `path`: `add()` entries in order (parents first), then `finish()`.

    `progress` is called with the size of each regular file once it is in the stream."""

    def __init__(
        self,
        path: Path,
        level: int = 3,
        threads: int | None = None,
        progress: Progress | None = None,
        file_digests: bool = False,
        segment: bool = False,
        roots: list[str] | None = None,
    ) -> None:
        """`segment`: this writer makes one part of a blob another writer assembles (`end_segment`,
        `append_segment`): its bytes are hashed once, by the assembling writer, not here too.
        `roots`: the files are read through no-follow descriptors from these (`dirfd.TreeOpener`)."""
        import zstandard

        from .dirfd import TreeOpener

        self.roots = roots
        self._tree = TreeOpener(roots) if roots is not None else None

        # Per-file sha256 in the metadata: off by default. No reader checks them (the blob's own
        # sha256 and each frame's zstd checksum are what a restore verifies) and on a 2-core machine
        # they cost ~1.3 CPU-s per GB, a third of a capture's time: a torch env captured 40 % slower
        # than `tar -I 'zstd -T0' -cf` with them, as fast without.
        self.file_digests = file_digests

        self._zstd = zstandard
        self.path = path
        self.level = level
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._sink = Sink(path, digest=not segment)
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="bootseer-zstd")
        self._pending: deque[tuple[Future[tuple[bytes, list[str]]], int, list[int], bytearray]] = deque()
        # The chunk being built: `_n` bytes of `_buf`, a buffer of CHUNK_ROOM that files are read
        # straight into (no bytes object per read, no copy into the chunk) and that is used again
        # once its frame is written (`_free`): no fresh pages to fault in for every 4 MiB.
        self._buf = bytearray(CHUNK_ROOM)
        self._n = 0
        self._free: list[bytearray] = []
        self._spans: list[tuple[int, int, int]] = []  # (entry index, offset, size) of the chunk's files
        self._deferred: dict[str, None] = {}  # large files, added at the end (see `add`), in order
        self._local = threading.local()
        self._big_cctx: dict[int, zstandard.ZstdCompressor] = {}  # job size -> compressor (`_big_compressor`)
        self.frames: list[Frame] = []
        self.entries: list[ArchiveEntry] = []
        self._encoded: list[tuple[int, int, str]] = []  # entries[start:end] appended with their JSON text
        self.raw_bytes = 0
        self._progress = progress
        self._told = (0, 0, 0, 0)  # frames, entries, raw bytes, offset in the part already reported (`report`)

    def _compressor(self) -> zstandard.ZstdCompressor:
        """This pool thread's compressor (compressors are not shareable between threads)."""
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:
            z = self._zstd.ZstdCompressor(level=self.level, write_content_size=True, write_checksum=True)
            cctx = self._local.cctx = z
        return cctx

    def _compress(self, data: memoryview, spans: list[tuple[int, int, int]]) -> tuple[bytes, list[str]]:
        """In a pool thread: the sha256 of each file in the chunk, then the chunk's frame. Both release
        the GIL, so the reading thread goes on meanwhile."""
        with data:
            digests = [hashlib.sha256(data[off : off + size]).hexdigest() for _, off, size in spans]
            return self._compressor().compress(data), digests

    def _drain(self, keep: int) -> None:
        """Write finished frames in order until at most `keep` are still compressing."""
        while len(self._pending) > keep:
            fut, raw, indexes, buf = self._pending.popleft()
            data, digests = fut.result()
            self._free.append(buf)  # its frame is made: the buffer takes another chunk
            for i, digest in zip(indexes, digests, strict=True):
                e = self.entries[i]
                self.entries[i] = ArchiveEntry(e.path, e.kind, e.mode, e.size, e.mtime, digest)
            self.frames.append(Frame(self._sink.offset, len(data), raw))
            self._sink.write(data)

    def _cut(self) -> None:
        """End the current chunk at a member boundary and hand it to the pool."""
        if not self._n:
            return
        buf, n = self._buf, self._n
        self._buf, self._n = (self._free.pop() if self._free else bytearray(CHUNK_ROOM)), 0
        spans, self._spans = self._spans, []
        fut = self._pool.submit(self._compress, memoryview(buf)[:n], spans)  # handed over whole: no copy
        self._pending.append((fut, n, [i for i, _, _ in spans], buf))
        self._drain(keep=self.threads * 2)

    def _room(self, end: int) -> None:
        """Make the chunk's buffer hold `end` bytes (more than CHUNK_ROOM only for very long names)."""
        if end > len(self._buf):
            self._buf = self._buf[: self._n] + bytearray(end - self._n)  # a new buffer: none of it is lent

    def _put(self, data: bytes) -> None:
        end = self._n + len(data)
        self._room(end)
        self._buf[self._n : end] = data
        self._n = end

    def add(self, path: str, e: Entry, link_to: str | None = None) -> bool:
        """Add one entry (`link_to`: an earlier path this file is a hardlink of). False if it vanished.

        Large files (more than half a chunk) are deferred to the end of the stream: each is compressed
        by zstd's own threads on every core, and the pool must be idle for that; deferred, they cost one
        such pause instead of one per large file in the middle of the small ones (a hardlink to one
        brings it forward, so a link never precedes its target)."""
        if link_to is None:
            if e.kind == FILE:  # most entries: straight to the file's own path
                if e.size > CHUNK_BYTES // 2:
                    self._deferred[path] = None
                    return True
                return self._add_file(path)
        elif link_to in self._deferred:
            del self._deferred[link_to]
            self._add_file(link_to)
        mtime = e.mtime_ns // 1_000_000_000
        if link_to is not None:
            self._put(_tar_header(path, HARDLINK, e.mode, mtime, link=link_to))
            self.entries.append(ArchiveEntry(path, HARDLINK, e.mode, 0, mtime, link_to))
        elif e.kind == DIR:
            self._put(_tar_header(path, DIR, e.mode, mtime))
            self.entries.append(ArchiveEntry(path, DIR, e.mode, 0, mtime, ""))
        elif e.kind == SYMLINK:
            self._put(_tar_header(path, SYMLINK, e.mode, mtime, link=e.target))
            self.entries.append(ArchiveEntry(path, SYMLINK, 0o777, 0, mtime, e.target))
        else:
            raise BootseerError(f"cannot snapshot {path}: not a file, directory or symlink")
        if self._n >= CHUNK_BYTES:
            self._cut()
        return True

    def add_now(self, path: str) -> bool:
        """Add the regular file at `path` at this point of the stream, large or not (no deferral): the
        large-file writer's way in, which gets each file as the scan finds it. False if it vanished."""
        return self._add_file(path)

    def _add_file(self, path: str) -> bool:
        """A regular file, as it is now (its size and mode from the open descriptor, not the scan)."""
        try:  # no-follow (each component, with roots), non-blocking: a FIFO swapped in is an error, not a hang
            fd, st = self._tree.open(path) if self._tree is not None else open_regular_stat(path)
        except FileNotFoundError:
            return False  # vanished since the scan: it is not part of the tree
        except UnsafeArchive as e:  # a directory on the way is a link now: never read through it
            raise BootseerError(f"cannot snapshot {path}: {e}; nothing was published") from None
        except OSError as e:  # unreadable (permissions …), not a file now: a snapshot without it would be wrong
            raise BootseerError(f"cannot snapshot {path}: {e.strerror or e}; nothing was published") from None
        try:
            size, mode, mtime = st.st_size, st.st_mode & 0o7777, st.st_mtime_ns // 1_000_000_000
            header = _tar_header(path, FILE, mode, mtime, size)
            if size > CHUNK_BYTES // 2 and size + len(header) + self._n > CHUNK_BYTES:
                digest = self._add_big(fd, header, size)
                self.entries.append(ArchiveEntry(path, FILE, mode, size, mtime, digest))
            else:
                self.entries.append(ArchiveEntry(path, FILE, mode, size, mtime, ""))  # digest: by the pool
                self._add_small(fd, header, size, path)
        finally:
            os.close(fd)
        self.raw_bytes += size
        if self._progress:
            self._progress(size)
        return True

    def _add_small(self, fd: int, header: bytes, size: int, path: str) -> None:
        """A file that fits the current chunk: into the buffer; its sha256 is taken by the pool thread
        that compresses the chunk (see `_compress`)."""
        n = self._n
        start = n + len(header)
        end = start + size + (-size % BLOCK)
        if end > len(self._buf):
            self._room(end)
        buf = self._buf
        buf[n:start] = header
        if size:
            with memoryview(buf) as mv:
                got = os.readv(fd, [mv[start : start + size]])  # all of it, but for a file that shrinks
                while got < size:
                    k = os.readv(fd, [mv[start + got : start + size]])
                    if not k:
                        raise BootseerError(f"cannot snapshot {path}: it shrank while being read")
                    got += k
        if self.file_digests:
            self._spans.append((len(self.entries) - 1, start, size))
        if end > start + size:  # the buffer held another chunk before: zero the padding
            buf[start + size : end] = _ZEROS[: end - start - size]
        self._n = end
        if end >= CHUNK_BYTES:
            self._cut()

    def _add_big(self, fd: int, header: bytes, size: int) -> str:
        """A large file gets frames of its own, compressed by zstd's own worker threads."""
        self._cut()
        self._drain(keep=0)
        h = hashlib.sha256() if self.file_digests else None
        start = self._sink.offset
        raw = len(header) + size + (-size % BLOCK)
        cctx = self._big_compressor(raw)
        with cctx.stream_writer(self._sink, size=raw, closefd=False) as w:  # type: ignore[arg-type]  # it writes only
            w.write(header)
            # one buffer read into again and again: a fresh 8 MiB bytes per read cost 2,048 page
            # faults each (zstd has consumed the input when `write` returns, so reuse is safe)
            view = memoryview(bytearray(min(size, 8 << 20)))
            got = 0
            while got < size:
                n = os.readv(fd, [view[: min(size - got, len(view))]])
                if not n:
                    raise BootseerError("a file shrank while being read")
                if h is not None:
                    h.update(view[:n])
                w.write(view[:n])
                got += n
            w.write(b"\0" * (-size % BLOCK))
        self.frames.append(Frame(start, self._sink.offset - start, raw))
        return h.hexdigest() if h is not None else ""

    def _big_compressor(self, raw: int) -> zstandard.ZstdCompressor:
        """A compressor that spreads one large file over every thread: zstd's own job size (8 MiB at
        level 3) leaves a file of a few MiB to one thread, and each file's frame ends with every job
        done, so a tree of 2-30 MiB libraries (CUDA's, Triton's) was compressed about one core at a
        time while tar's one stream kept them all busy. Jobs of `raw / threads` (a power of two, at
        least 1 MiB; zstd's own size where that is larger) give each file all of them. Compressors
        are kept per job size: a multi-threaded one starts its threads once, not for every file."""
        job = 0
        if self.threads > 1:
            per_thread = -(-raw // self.threads)
            job = max(BIG_JOB_MIN, 1 << (per_thread - 1).bit_length())
            if job >= BIG_JOB_DEFAULT:
                job = 0  # zstd's own choice
        cctx = self._big_cctx.get(job)
        if cctx is None:
            params = self._zstd.ZstdCompressionParameters.from_level(
                self.level, threads=self.threads, job_size=job, write_checksum=1
            )
            cctx = self._big_cctx[job] = self._zstd.ZstdCompressor(compression_params=params)
        return cctx

    def end_segment(self) -> tuple[dict[str, Any], str]:
        """End this writer as one segment of a blob written by several processes (no end blocks, no
        trailer): its deferred files, every frame, closed. Returns what `append_segment` takes: the
        rest of the segment since the last `report` (all of it where none was made)."""
        for path in list(self._deferred):
            self._add_file(path)
        self._deferred.clear()
        self._close_tree()
        self._cut()
        self._drain(keep=0)
        self._pool.shutdown()
        self._big_cctx.clear()  # their zstd threads end with them
        self._sink.close()
        return self._since_told()

    def report(self) -> tuple[dict[str, Any], str]:
        """What this segment writer has written since its last report, for the assembler to append
        while this writer goes on (a large-file writer's part went in whole after its last file, on
        the capture's critical path): the chunk being built is cut, every frame is in the part's
        file; then as `end_segment`, for the bytes so far."""
        self._cut()
        self._drain(keep=0)
        self._sink.settle()
        return self._since_told()

    def unreported(self) -> int:
        """Bytes of the part written (or being compressed) since the last report."""
        return self._sink.offset - self._told[3] + self._n

    def _since_told(self) -> tuple[dict[str, Any], str]:
        frames0, entries0, raw0, start = self._told
        self._told = (len(self.frames), len(self.entries), self.raw_bytes, self._sink.offset)
        frames = [[f.offset, f.length, f.raw] for f in self.frames[frames0:]]
        doc = {"frames": frames, "raw": self.raw_bytes - raw0, "start": start, "end": self._sink.offset}
        return doc, _dumps(self.entries[entries0:])

    def append_segment(self, part: Path, doc: dict[str, Any], rows_json: str) -> None:
        """Append a segment another process wrote (`end_segment` or `report`: `doc`, and its entries
        as a JSON array of rows): its bytes `start`..`end` of `part` through the sink (so the blob's
        digest covers them), its frames shifted to where they now lie, its entries (whose JSON text
        the trailer reuses as it is)."""
        self._cut()
        self._drain(keep=0)
        base = self._sink.offset - doc["start"]
        self._sink.append_file(part, doc["start"], doc["end"])
        self.frames.extend(Frame(base + o, n, raw) for o, n, raw in doc["frames"])
        # rows of this capture's own forked writer, not of a blob read back: built without the
        # reader's shape checks (`from_row`: 0.12 s of a 21k-entry capture, on the critical path)
        rows = json.loads(rows_json)
        self._encoded.append((len(self.entries), len(self.entries) + len(rows), rows_json))
        self.entries.extend(entries_of_rows(rows))
        self.raw_bytes += doc["raw"]

    def _entries_json(self) -> str:
        """The JSON array of every entry's row: the segments' own texts where they have one (encoding
        21k rows again cost ~40 ms of the capture's serial tail), the rest encoded here."""
        pieces: list[str] = []
        at = 0
        for start, end, text in [*self._encoded, (len(self.entries), len(self.entries), "[]")]:
            if start > at:
                pieces.append(_dumps(self.entries[at:start])[1:-1])
            if end > start:
                pieces.append(text[1:-1])
            at = end
        return "[" + ",".join(pieces) + "]"

    def finish(self, meta: dict[str, Any]) -> Written:
        """End the tar stream, write the metadata trailer, close; returns the blob's digest and size."""
        for path in list(self._deferred):
            self._add_file(path)
        self._deferred.clear()
        self._close_tree()
        self._put(b"\0" * (2 * BLOCK))
        self._cut()
        self._drain(keep=0)
        self._pool.shutdown()
        self._big_cctx.clear()  # their zstd threads end with them
        chunks = [[f.offset, f.length, f.raw] for f in self.frames]
        head = _dumps(dict(meta, format=FORMAT, chunks=chunks))  # then the entries, last, as they always were
        doc = f'{head[:-1]},"entries":{self._entries_json()}}}'
        z = self._zstd.ZstdCompressor(level=3).compress(doc.encode())
        payload = z + struct.pack("<Q", len(z)) + TRAILER_MAGIC
        self._sink.write(struct.pack("<II", SKIPPABLE_MAGIC, len(payload)) + payload)
        digest = self._sink.close()
        files = sum(1 for e in self.entries if e.kind in (FILE, HARDLINK, SYMLINK))
        return Written(digest, self._sink.offset, files, self.raw_bytes)

    def _close_tree(self) -> None:
        if self._tree is not None:
            self._tree.close()

    def abort(self) -> None:
        """Stop, and remove the partial blob."""
        self._close_tree()
        self._pool.shutdown(cancel_futures=True)
        self._big_cctx.clear()
        self._sink.abort()
        self.path.unlink(missing_ok=True)
