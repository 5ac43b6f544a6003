"""The snapshot blob: a tar stream in independent zstd frames, and a safe parallel extractor.

Format (version 1). The blob is a plain `.tar.zst`: `zstd -d | tar -x` (or `tar -I zstd -xf`)
reads it, which keeps it inspectable with standard tools. Inside, the tar stream (GNU format,
member names relative to `/`) is cut at member boundaries into chunks of a few MiB, each compressed
as its own zstd frame, in parallel. A trailing zstd *skippable* frame, which zstd and tar ignore,
holds the metadata: roots, deletions, every entry with its per-file sha256, and the offset of each
frame. Independent frames are what make the restore fast: each worker thread decompresses its own
frames (zstandard releases the GIL) and writes their files with plain `os` calls, where a single
zstd stream would serialise everything behind one decompressor, as `tar -I zstd` does.

Extraction treats the blob as untrusted even after its digest matched (the ref naming it comes from
a store anyone with write access can fill): every entry must be listed in the metadata, lie
lexically under a root (no absolute escape, no `..`), resolve under a root through the symlinks that
exist on disk (no writing through a symlink pointing outside), never lie below a symlink of the same
snapshot, and be a regular file, directory, symlink or hardlink (no device nodes, fifos). Existing
paths the snapshot replaces or deletes are renamed aside first, so a failure is undone exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import struct
import tarfile
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BootseerError, IntegrityError
from .manifest import DIR, FILE, SYMLINK, UNDO_PREFIX, Entry

FORMAT = 1
TRAILER_MAGIC = b"BSEESNP1"
SKIPPABLE_MAGIC = 0x184D2A5B  # one of the sixteen skippable-frame magics zstd reserves
HARDLINK = "h"
CHUNK_BYTES = 4 << 20  # tar bytes per frame: big enough to compress well, small enough to spread
ONE_SHOT_MAX = 64 << 20  # frames up to this raw size are decompressed in one call
BLOCK = 512
MODE_MASK = 0o777  # setuid/setgid/sticky bits from a store are not honoured

Progress = Callable[[int], None]


class UnsafeArchive(IntegrityError):
    """The archive tries to write outside its roots, or holds something that cannot be restored safely."""


class RestoreError(BootseerError):
    """Extraction failed; `undone` says whether the tree was put back as it was."""

    def __init__(self, message: str, undone: bool) -> None:
        super().__init__(message)
        self.undone = undone


# ---- writing -----------------------------------------------------------------------------------


class _Sink:
    """The output file, with the running sha256 and offset of everything written."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "wb")  # noqa: SIM115 - closed in ArchiveWriter.close
        self.h = hashlib.sha256()
        self.offset = 0

    def write(self, data: bytes | memoryview) -> int:
        self.f.write(data)
        self.h.update(data)
        self.offset += len(data)
        return len(data)

    def flush(self) -> None:
        self.f.flush()


@dataclass
class Written:
    digest: str
    size: int
    files: int
    raw_bytes: int


class ArchiveWriter:
    """Build a snapshot blob at `path`: `add()` entries in order (parents first), then `finish()`."""

    def __init__(
        self, path: Path, level: int = 3, threads: int | None = None, progress: Progress | None = None
    ) -> None:
        import zstandard

        self._zstd = zstandard
        self.path = path
        self.level = level
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._sink = _Sink(path)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="bootseer-zstd")
        self._pending: deque[tuple[Future[bytes], int]] = deque()
        self._buf = bytearray()
        self._local = threading.local()
        self.chunks: list[list[int]] = []
        self.entries: list[list[Any]] = []
        self.raw_bytes = 0
        self._progress = progress

    # compression of one chunk, in a pool thread (one compressor per thread: they are not shareable)
    def _compress(self, data: bytes) -> bytes:
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:
            z = self._zstd.ZstdCompressor(level=self.level, write_content_size=True, write_checksum=True)
            cctx = self._local.cctx = z
        return cctx.compress(data)

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            fut, raw = self._pending.popleft()
            data = fut.result()
            self.chunks.append([self._sink.offset, len(data), raw])
            self._sink.write(data)

    def _cut(self) -> None:
        if not self._buf:
            return
        data = bytes(self._buf)
        self._buf.clear()
        self._pending.append((self._pool.submit(self._compress, data), len(data)))
        self._drain(keep=self.threads * 2)

    @staticmethod
    def _header(name: str, e: Entry, kind: str, size: int = 0, link: str = "") -> bytes:
        ti = tarfile.TarInfo(name.lstrip("/"))
        ti.mode = e.mode & 0o7777
        ti.mtime = e.mtime_ns // 1_000_000_000
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

    def add(self, path: str, e: Entry, link_to: str | None = None) -> bool:
        """Add one entry (`link_to`: an earlier path this file is a hardlink of). False if it vanished."""
        if link_to is not None:
            self._buf += self._header(path, e, HARDLINK, link=link_to)
            self.entries.append([path, HARDLINK, e.mode, 0, e.mtime_ns // 10**9, link_to])
        elif e.kind == DIR:
            self._buf += self._header(path, e, DIR)
            self.entries.append([path, DIR, e.mode, 0, e.mtime_ns // 10**9, ""])
        elif e.kind == SYMLINK:
            self._buf += self._header(path, e, SYMLINK, link=e.target)
            self.entries.append([path, SYMLINK, 0o777, 0, e.mtime_ns // 10**9, e.target])
        elif e.kind == FILE:
            return self._add_file(path, e)
        else:
            raise BootseerError(f"cannot snapshot {path}: not a file, directory or symlink")
        if len(self._buf) >= CHUNK_BYTES:
            self._cut()
        return True

    def _add_file(self, path: str, e: Entry) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, OSError):
            return False
        try:
            st = os.fstat(fd)
            size = st.st_size
            e = Entry(FILE, stat.S_IMODE(st.st_mode), size, st.st_mtime_ns)
            h = hashlib.sha256()
            header = self._header(path, e, FILE, size)
            if size + len(header) + len(self._buf) > CHUNK_BYTES and size > CHUNK_BYTES // 2:
                self._add_big(fd, header, size, h)
            else:
                self._buf += header
                got = 0
                while got < size:
                    piece = os.read(fd, min(size - got, 4 << 20))
                    if not piece:
                        raise BootseerError(f"cannot snapshot {path}: it shrank while being read")
                    h.update(piece)
                    self._buf += piece
                    got += len(piece)
                self._buf += b"\0" * (-size % BLOCK)
                if len(self._buf) >= CHUNK_BYTES:
                    self._cut()
        finally:
            os.close(fd)
        self.raw_bytes += size
        if self._progress:
            self._progress(size)
        self.entries.append([path, FILE, e.mode, size, e.mtime_ns // 10**9, h.hexdigest()])
        return True

    def _add_big(self, fd: int, header: bytes, size: int, h: Any) -> None:
        """A large file gets frames of its own, compressed by zstd's own worker threads."""
        self._cut()
        self._drain(keep=0)
        start = self._sink.offset
        cctx = self._zstd.ZstdCompressor(level=self.level, threads=self.threads, write_checksum=True)
        raw = len(header) + size + (-size % BLOCK)
        with cctx.stream_writer(self._sink, size=raw, closefd=False) as w:
            w.write(header)
            got = 0
            while got < size:
                piece = os.read(fd, min(size - got, 8 << 20))
                if not piece:
                    raise BootseerError("a file shrank while being read")
                h.update(piece)
                w.write(piece)
                got += len(piece)
            w.write(b"\0" * (-size % BLOCK))
        self.chunks.append([start, self._sink.offset - start, raw])

    def finish(self, meta: dict[str, Any]) -> Written:
        """End the tar stream, write the metadata trailer, close; returns the blob's digest and size."""
        self._buf += b"\0" * (2 * BLOCK)
        self._cut()
        self._drain(keep=0)
        self._pool.shutdown()
        doc = dict(meta, format=FORMAT, chunks=self.chunks, entries=self.entries)
        z = self._zstd.ZstdCompressor(level=3).compress(json.dumps(doc, separators=(",", ":")).encode())
        payload = z + struct.pack("<Q", len(z)) + TRAILER_MAGIC
        self._sink.write(struct.pack("<II", SKIPPABLE_MAGIC, len(payload)) + payload)
        self._sink.f.close()
        files = sum(1 for e in self.entries if e[1] in (FILE, HARDLINK, SYMLINK))
        return Written(self._sink.h.hexdigest(), self._sink.offset, files, self.raw_bytes)

    def abort(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        with contextlib.suppress(Exception):
            self._sink.f.close()
        self.path.unlink(missing_ok=True)


# ---- reading -----------------------------------------------------------------------------------


def read_meta(blob: Path) -> dict[str, Any]:
    """The metadata trailer of a snapshot blob (checked for shape, not yet for safety)."""
    import zstandard

    try:
        with open(blob, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            if end < 16 + 8:
                raise IntegrityError(f"{blob.name}: too short to be a snapshot")
            f.seek(end - 16)
            tail = f.read(16)
            if tail[8:] != TRAILER_MAGIC:
                raise IntegrityError(f"{blob.name}: not a bootseer snapshot (no trailer)")
            (n,) = struct.unpack("<Q", tail[:8])
            if n > end - 24:
                raise IntegrityError(f"{blob.name}: corrupt snapshot trailer")
            f.seek(end - 16 - n)
            doc = json.loads(zstandard.ZstdDecompressor().decompress(f.read(n), max_output_size=1 << 31))
    except (ValueError, zstandard.ZstdError) as e:
        raise IntegrityError(f"{blob.name}: corrupt snapshot metadata: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise IntegrityError(f"{blob.name}: unsupported snapshot format {doc.get('format')!r}")
    for key in ("roots", "deletions", "entries", "chunks"):
        if not isinstance(doc.get(key), list):
            raise IntegrityError(f"{blob.name}: snapshot metadata lacks {key!r}")
    return doc


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _check_path(p: Any, roots: list[str]) -> str:
    if not isinstance(p, str) or not p.startswith("/") or "\0" in p:
        raise UnsafeArchive(f"snapshot entry {p!r}: not an absolute path")
    if os.path.normpath(p) != p or "/../" in p + "/" or "/./" in p + "/":
        raise UnsafeArchive(f"snapshot entry {p!r}: not a normal path ('..', '.', '//')")
    if not _under(p, roots):
        raise UnsafeArchive(f"snapshot entry {p!r} lies outside the roots {', '.join(roots)}")
    return p


@dataclass
class Plan:
    """What an extraction will do, checked before anything is written."""

    roots: list[str]
    kinds: dict[str, tuple[str, int, int, str]]  # path -> (kind, mode, mtime, target/link)
    deletions: list[str]
    chunks: list[tuple[int, int, int]]
    files: int = 0
    raw_bytes: int = 0


def plan(meta: dict[str, Any], roots: list[str]) -> Plan:
    """Check the metadata against `roots` (the roots this node restores into) and build the plan."""
    roots = [os.path.normpath(os.path.abspath(r)) for r in roots]
    kinds: dict[str, tuple[str, int, int, str]] = {}
    symlinks: list[str] = []
    raw = 0
    for row in meta["entries"]:
        if not isinstance(row, list) or len(row) != 6:
            raise UnsafeArchive(f"malformed snapshot entry {row!r}")
        p, kind, mode, size, mtime, extra = row
        _check_path(p, roots)
        if kind not in (FILE, DIR, SYMLINK, HARDLINK):
            raise UnsafeArchive(f"snapshot entry {p}: kind {kind!r} cannot be restored (device node or fifo?)")
        if not isinstance(mode, int) or not isinstance(mtime, int) or not isinstance(size, int) or size < 0:
            raise UnsafeArchive(f"malformed snapshot entry {row!r}")
        if p in roots and kind != DIR:
            raise UnsafeArchive(f"snapshot entry {p} would replace a root with a {kind!r}")
        if p in kinds:
            raise UnsafeArchive(f"snapshot entry {p} appears twice")
        if kind == HARDLINK:
            _check_path(extra, roots)
            if kinds.get(extra, ("",))[0] != FILE:
                raise UnsafeArchive(f"snapshot hardlink {p} -> {extra}: target is not an earlier file of the snapshot")
        if kind == SYMLINK:
            if not isinstance(extra, str) or not extra or "\0" in extra:
                raise UnsafeArchive(f"snapshot symlink {p}: bad target")
            symlinks.append(p)
        kinds[p] = (kind, mode, mtime, extra if isinstance(extra, str) else "")
        raw += size
    # No entry may lie below a symlink of the same snapshot (it would be written through the link).
    if symlinks:
        links = set(symlinks)
        for p in kinds:
            parent = os.path.dirname(p)
            while parent not in ("/", ""):
                if parent in links:
                    raise UnsafeArchive(f"snapshot entry {p} lies below the snapshot's symlink {parent}")
                parent = os.path.dirname(parent)
    deletions = []
    for p in meta["deletions"]:
        _check_path(p, roots)
        if p in roots:
            raise UnsafeArchive(f"snapshot deletes the root {p}")
        deletions.append(p)
    chunks: list[tuple[int, int, int]] = []
    expect = 0
    for c in meta["chunks"]:
        if not (isinstance(c, list) and len(c) == 3 and all(isinstance(x, int) and x >= 0 for x in c)):
            raise IntegrityError(f"malformed snapshot frame index {c!r}")
        if c[0] != expect:
            raise IntegrityError("snapshot frame index is not contiguous")
        expect = c[0] + c[1]
        chunks.append((c[0], c[1], c[2]))
    files = sum(1 for k in kinds.values() if k[0] != DIR)
    return Plan(roots, kinds, deletions, chunks, files, raw)


class _MemReader:
    """read(n) over a decompressed frame without copying."""

    def __init__(self, data: bytes) -> None:
        self.mv = memoryview(data)
        self.pos = 0

    def read(self, n: int) -> memoryview:
        out = self.mv[self.pos : self.pos + n]
        self.pos += len(out)
        return out


class _StreamReader:
    """read(n) (exactly n unless at the end) over a streaming decompressor for a huge frame."""

    def __init__(self, reader: Any) -> None:
        self.r = reader

    def read(self, n: int) -> bytes:
        parts = []
        while n > 0:
            b = self.r.read(min(n, 8 << 20))
            if not b:
                break
            parts.append(b)
            n -= len(b)
        return parts[0] if len(parts) == 1 else b"".join(parts)


def _octal(field: bytes | memoryview) -> int:
    b = bytes(field)
    if b and b[0] & 0x80:  # GNU base-256 for large numbers
        n = int.from_bytes(b[1:], "big")
        return n
    b = b.rstrip(b"\0 ").strip()
    return int(b, 8) if b else 0


def _cstr(field: bytes | memoryview) -> str:
    b = bytes(field)
    i = b.find(b"\0")
    return (b if i < 0 else b[:i]).decode("utf-8", "surrogateescape")


@dataclass
class _State:
    """Shared by the workers of one extraction."""

    plan: Plan
    real_roots: list[str]
    created: list[str] = field(default_factory=list)  # paths this extraction made (undo removes them)
    made_dirs: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    hardlinks: list[tuple[str, str, int]] = field(default_factory=list)
    ok_parents: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    abort: threading.Event = field(default_factory=threading.Event)
    umask: int = 0o022


def _ensure_parent(st: _State, parent: str, trusted: bool = False) -> None:
    """Make `parent` exist, after checking it resolves inside the roots (through any symlinks on disk).

    `trusted`: `parent` is a root itself (named by the config, not by the snapshot).
    """
    if parent in st.ok_parents:
        return
    real = os.path.realpath(parent)
    if not trusted and not _under(real, st.real_roots):
        raise UnsafeArchive(f"{parent} resolves to {real}, outside the roots: refusing to write through it")
    missing = []
    p = parent
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
            with st.lock:
                st.made_dirs.append(d)
        except FileExistsError:
            pass
    with st.lock:
        st.ok_parents.add(parent)


def _write_file(st: _State, path: str, mode: int, mtime: int, data: Any, size: int, r: Any) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    mode &= MODE_MASK
    fd = os.open(path, flags, mode)
    st.created.append(path)  # list.append is atomic under the GIL
    try:
        if data is not None:
            view = data
            while view:
                n = os.write(fd, view)
                view = view[n:]
        else:  # streamed: a huge file
            left = size
            while left:
                piece = r.read(min(left, 8 << 20))
                if not piece:
                    raise IntegrityError(f"snapshot ends inside {path}")
                mv = memoryview(piece)
                while mv:
                    n = os.write(fd, mv)
                    mv = mv[n:]
                left -= len(piece)
        if mode & st.umask:
            os.fchmod(fd, mode)
        os.utime(fd, (mtime, mtime))
    finally:
        os.close(fd)


def _extract_frame(st: _State, blob_fd: int, chunk: tuple[int, int, int], dctx_local: threading.local) -> int:
    """Decompress one frame and write its members; returns the raw bytes handled."""
    import zstandard

    off, clen, raw = chunk
    if st.abort.is_set():
        return 0
    comp = os.pread(blob_fd, clen, off)
    if len(comp) != clen:
        raise IntegrityError("snapshot is truncated")
    dctx = getattr(dctx_local, "dctx", None)
    if dctx is None:
        dctx = dctx_local.dctx = zstandard.ZstdDecompressor()
    try:
        if raw <= ONE_SHOT_MAX:
            data = dctx.decompress(comp, max_output_size=raw)
            if len(data) != raw:
                raise IntegrityError("a snapshot frame has the wrong size")
            r: Any = _MemReader(data)
            streamed = False
        else:
            r = _StreamReader(dctx.stream_reader(comp))
            streamed = True
    except zstandard.ZstdError as e:
        raise IntegrityError(f"snapshot frame at {off} is corrupt: {e}") from None
    kinds = st.plan.kinds
    pos = 0
    longname: str | None = None
    longlink: str | None = None
    while pos < raw:
        if st.abort.is_set():
            return pos
        hdr = bytes(r.read(BLOCK))
        pos += BLOCK
        if len(hdr) < BLOCK:
            raise IntegrityError("snapshot ends inside a tar header")
        if hdr == b"\0" * BLOCK:
            continue  # end-of-archive blocks
        chk = _octal(hdr[148:156])
        if chk != sum(hdr[:148]) + 256 + sum(hdr[156:]):
            raise IntegrityError("snapshot has a tar header with a bad checksum")
        size = _octal(hdr[124:136])
        tflag = hdr[156:157]
        padded = size + (-size % BLOCK)
        if tflag in (b"L", b"K"):
            val = bytes(r.read(padded))[:size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            pos += padded
            if tflag == b"L":
                longname = val
            else:
                longlink = val
            continue
        name = longname if longname is not None else _cstr(hdr[0:100])
        if longname is None and hdr[257:263] == b"ustar\x00" and hdr[345]:
            name = _cstr(hdr[345:500]) + "/" + name
        link = longlink if longlink is not None else _cstr(hdr[157:257])
        longname = longlink = None
        path = "/" + name.rstrip("/")
        want = kinds.get(path)
        kind = {b"0": FILE, b"\0": FILE, b"5": DIR, b"2": SYMLINK, b"1": HARDLINK}.get(tflag)
        if kind is None:
            raise UnsafeArchive(f"snapshot member {path!r} has type {tflag!r} (device node, fifo?): refused")
        if want is None or want[0] != kind:
            raise UnsafeArchive(f"snapshot member {path!r} ({kind}) is not in the snapshot's list")
        with st.lock:
            if path in st.seen:
                raise UnsafeArchive(f"snapshot member {path!r} appears twice")
            st.seen.add(path)
        mode, mtime = want[1], want[2]
        if path in st.plan.roots:  # a root the setup created (e.g. a compile cache): the config names it
            if not os.path.isdir(path):
                _ensure_parent(st, path, trusted=True)
            continue
        parent = path.rpartition("/")[0]
        if parent not in st.ok_parents and kind != HARDLINK:
            _ensure_parent(st, parent)  # every parent is checked once: no writing through a symlink
        if kind == FILE:
            if size != _octal(hdr[124:136]) or padded + pos > raw:
                raise IntegrityError(f"snapshot member {path!r} overruns its frame")
            if streamed:
                _write_file(st, path, mode, mtime, None, size, r)
                r.read(padded - size)
            else:
                _write_file(st, path, mode, mtime, r.read(size), size, r)
                r.pos += padded - size
            pos += padded
        elif kind == DIR:
            try:
                os.mkdir(path, mode & MODE_MASK | 0o700)
                st.created.append(path)
            except FileExistsError:
                if not os.path.isdir(path) or os.path.islink(path):
                    raise UnsafeArchive(f"{path} exists and is not a directory") from None
        elif kind == SYMLINK:
            if link != want[3]:
                raise UnsafeArchive(f"snapshot symlink {path!r} differs from the snapshot's list")
            os.symlink(link, path)
            st.created.append(path)
            with contextlib.suppress(OSError):
                os.utime(path, (mtime, mtime), follow_symlinks=False)
        else:
            if "/" + link.lstrip("/") != want[3]:
                raise UnsafeArchive(f"snapshot hardlink {path!r} differs from the snapshot's list")
            with st.lock:
                st.hardlinks.append((path, want[3], mtime))
    return raw


@dataclass
class Extracted:
    files: int
    raw_bytes: int
    backup_note: str = ""


class _Undo:
    """Renames paths aside before they are replaced or deleted, so a failure can put them back."""

    def __init__(self, roots: list[str]) -> None:
        self.roots = roots
        self.dirs: dict[str, str] = {}
        self.moved: list[tuple[str, str]] = []
        self.tag = uuid.uuid4().hex[:10]

    def _dir_for(self, path: str) -> str:
        root = max((r for r in self.roots if _under(path, [r])), key=len)
        d = self.dirs.get(root)
        if d is None:
            d = os.path.join(root, f"{UNDO_PREFIX}{self.tag}")
            os.mkdir(d, 0o700)
            self.dirs[root] = d
        return d

    def move_aside(self, path: str) -> None:
        dest = os.path.join(self._dir_for(path), str(len(self.moved)))
        os.rename(path, dest)
        self.moved.append((path, dest))

    def restore(self) -> None:
        for path, dest in reversed(self.moved):
            os.rename(dest, path)
        self.moved.clear()
        self.discard()

    def discard(self) -> None:
        for d in self.dirs.values():
            shutil.rmtree(d, ignore_errors=True)
        self.dirs.clear()


def extract(
    blob: Path,
    meta: dict[str, Any],
    roots: list[str],
    threads: int | None = None,
    progress: Progress | None = None,
) -> Extracted:
    """Apply a verified snapshot blob under `roots`: deletions, then the members, all or nothing.

    Raises UnsafeArchive/IntegrityError (nothing written, or undone) or RestoreError.
    """
    p = plan(meta, roots)
    real_roots = [os.path.realpath(r) for r in p.roots]
    st = _State(p, real_roots)
    st.umask = os.umask(0o022)
    os.umask(st.umask)
    undo = _Undo(p.roots)
    try:
        # 1. Move aside what the snapshot deletes or replaces (the parents are checked first).
        for path in p.deletions:
            if os.path.lexists(path):
                _check_real_parent(path, real_roots)
                undo.move_aside(path)
        for path, (kind, *_rest) in p.kinds.items():
            try:
                cur = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if kind == DIR and stat.S_ISDIR(cur.st_mode):
                continue
            _check_real_parent(path, real_roots)
            undo.move_aside(path)
        # 2. The frames, in parallel: in forked processes where the OS has fork (no GIL between the
        # writers, and each gets its own share of a busy machine's CPU), else in threads. More
        # workers than cores: file creation waits on the filesystem, and waiting workers overlap.
        workers = max(1, min(threads or min(16, 4 * (os.cpu_count() or 1)), len(p.chunks) or 1))
        fd = os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
        local = threading.local()
        try:
            if workers > 1 and hasattr(os, "fork") and not os.environ.get("BOOTSEER_RESTORE_THREADS"):
                _frames_in_processes(st, fd, p.chunks, workers, progress)
            elif workers == 1:
                for c in p.chunks:
                    _extract_frame(st, fd, c, local)
                    if progress:
                        progress(c[2])
            else:
                with ThreadPoolExecutor(workers, thread_name_prefix="bootseer-restore") as pool:
                    futs = [pool.submit(_extract_frame, st, fd, c, local) for c in p.chunks]
                    try:
                        for fut, c in zip(futs, p.chunks, strict=True):
                            fut.result()
                            if progress:
                                progress(c[2])
                    except BaseException:
                        st.abort.set()
                        raise
        finally:
            os.close(fd)
        # 3. Hardlinks (their targets may have been in any frame), then directory modes and times.
        for path, target, _mtime in st.hardlinks:
            _check_real_parent(path, real_roots)
            _ensure_parent(st, os.path.dirname(path))
            os.link(target, path, follow_symlinks=False)
            st.created.append(path)
        missing = [q for q, k in p.kinds.items() if q not in st.seen]
        if missing:
            raise IntegrityError(f"snapshot lacks {len(missing)} listed entries (e.g. {missing[0]})")
        for path, (kind, mode, mtime, _x) in sorted(p.kinds.items(), reverse=True):
            if kind == DIR:
                os.chmod(path, mode & MODE_MASK)
                os.utime(path, (mtime, mtime))
    except BaseException as e:
        note = _rollback(st, undo)
        if isinstance(e, BootseerError):
            msg = f"{e} ({note})"
            if isinstance(e, IntegrityError):
                raise type(e)(msg) from None
            raise RestoreError(msg, undone=True) from None
        if isinstance(e, OSError):
            raise RestoreError(f"restore failed: {e} ({note})", undone=True) from None
        raise
    undo.discard()
    return Extracted(p.files, p.raw_bytes)


_ERRORS: dict[str, type[IntegrityError]] = {"UnsafeArchive": UnsafeArchive, "IntegrityError": IntegrityError}


def _frames_in_processes(
    st: _State, fd: int, chunks: list[tuple[int, int, int]], workers: int, progress: Progress | None
) -> None:
    """Extract the frames in `workers` forked children; merge what they did into `st` (for the undo).

    Each child reports on a pipe, as JSON lines, the raw bytes of each frame it finished and, last,
    the paths it created and the entries it saw, or its error. The parent raises the first error
    after every child is done, so the undo sees everything that was written.
    """
    import selectors

    bins: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for c in sorted(chunks, key=lambda c: -c[2]):  # largest first, onto the least loaded worker
        i = loads.index(min(loads))
        bins[i].append(c)
        loads[i] += c[2]
    sel = selectors.DefaultSelector()
    pids: list[int] = []
    for frames in bins:
        if not frames:
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                os.close(r)
                _child(st, fd, frames, w)
            finally:
                os._exit(0)
        os.close(w)
        pids.append(pid)
        sel.register(r, selectors.EVENT_READ, bytearray())
    results: list[dict[str, Any]] = []
    while sel.get_map():
        for key, _ in sel.select():
            data = os.read(key.fd, 1 << 16)
            buf: bytearray = key.data
            if not data:
                sel.unregister(key.fd)
                os.close(key.fd)
                continue
            buf += data
            while b"\n" in buf:
                line, _, rest = bytes(buf).partition(b"\n")
                buf[:] = rest
                msg = json.loads(line)
                if "p" in msg:
                    if progress:
                        progress(msg["p"])
                else:
                    results.append(msg)
    sel.close()
    for pid in pids:
        os.waitpid(pid, 0)
    error: BootseerError | None = None
    for res in results:
        st.created.extend(res["created"])
        st.made_dirs.extend(res["made"])
        st.hardlinks.extend((a, b, c) for a, b, c in res["links"])
        for path in res["seen"]:
            if path in st.seen and error is None:
                error = UnsafeArchive(f"snapshot member {path!r} appears twice")
            st.seen.add(path)
        if res["error"] and error is None:
            kind, msg = res["error"]
            error = _ERRORS[kind](msg) if kind in _ERRORS else RestoreError(msg, undone=False)
    if len(results) != len(pids) and error is None:
        error = RestoreError("a restore worker process died", undone=False)
    if error is not None:
        raise error


def _child(st: _State, fd: int, frames: list[tuple[int, int, int]], w: int) -> None:  # pragma: no cover
    """The body of one forked worker (see `_frames_in_processes`)."""
    st.created.clear()
    st.made_dirs.clear()
    st.seen.clear()
    st.hardlinks.clear()
    local = threading.local()
    err: list[str] | None = None
    with os.fdopen(w, "w") as out:
        try:
            for c in frames:
                _extract_frame(st, fd, c, local)
                out.write(json.dumps({"p": c[2]}) + "\n")
                out.flush()
        except BaseException as e:  # reported to the parent, which undoes everything
            err = [type(e).__name__, str(e) or type(e).__name__]
        doc = {"created": st.created, "made": st.made_dirs, "seen": sorted(st.seen), "links": st.hardlinks}
        out.write(json.dumps({**doc, "error": err}) + "\n")


def _check_real_parent(path: str, real_roots: list[str]) -> None:
    real = os.path.realpath(os.path.dirname(path))
    if not _under(real, real_roots):
        raise UnsafeArchive(f"{path}: its directory resolves to {real}, outside the roots")


def _rollback(st: _State, undo: _Undo) -> str:
    """Remove what the extraction created, put back what it moved aside. Returns what was done."""
    st.abort.set()
    errors = 0
    created = sorted(set(st.created) | set(st.made_dirs), key=lambda q: q.count("/"), reverse=True)
    for q in created:
        try:
            if os.path.isdir(q) and not os.path.islink(q):
                os.rmdir(q)
            else:
                os.unlink(q)
        except FileNotFoundError:
            pass
        except OSError:
            errors += 1
    try:
        undo.restore()
    except OSError:
        errors += 1
    if errors:
        return f"undo incomplete: {errors} path(s) could not be put back"
    return "the tree was put back as it was"
