"""Files a setup rewrote with the bytes they already had: not part of a layer.

A layer is what the setup changed over its parent, and the difference is taken by `lstat` (size,
mtime, inode). `pip install --target T --upgrade -r requirements.txt` reinstalls every requirement
into T, so after a one-line bump every file had a new inode and mtime: the layer was the whole tree
(1,542 files, 18.9 MB, the size of its parent). A file's stat cannot tell identical bytes from new
ones, and its bytes before the setup are gone once it is overwritten; the parent's blob still has them.

`identical_rewrites` takes the changed files that kept their kind, size and mode, finds each in the
newest link of the parent's chain that lists it (the blobs are read from the node cache or a local
store, hashed against their digest first, never fetched for this), and compares the bytes there with
the file's. Equal files stay out of the layer (the stamp still lists them as the tree now has them),
so a node that restores the chain gets the same bytes with the parent's mtime.

Bytecode: pip compiles each module it writes, and a timestamp-based `.pyc` records its source's
mtime (bytes 8-12), so the rewritten module's `.pyc` differs from the parent's there, and where
`marshal` flagged other objects for back-references (`_same_code`). It is left out when its code
objects are equal and its source is left out, each copy recording its own source's mtime: the
builder's pair (new mtime) and a restored pair (the parent's) are both valid for Python's check.

The comparison reads (and hashes) the whole blob, so it is made only where the candidates are a
material part of it (`_worth_reading`): a `--target` reinstall, a bump of a large package.

Only a file whose every byte is compared equal is left out: a blob missing, unreadable or not what
its digest says makes no file identical (it and every older link are not consulted), so the worst
case is the layer as it was.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .manifest import FILE, Entry, Manifest, open_regular

if TYPE_CHECKING:
    from ..store.cache import BlobCache
    from ..store.core import Store
    from .reader import Reader

PYC_STAMP = slice(8, 12)  # a timestamp-based pyc's source mtime (PEP 552: flags 0)
PYC_MAX = 8 << 20
WORTH_BYTES = 64 << 20  # candidates' bytes that make reading any blob for them worth it


def local_chain(chain: Sequence[dict[str, Any]], cache: BlobCache, store: Store) -> list[tuple[str, Path | None]]:
    """A layer's chain (base first, as the ref records it), newest first: each link's digest and its
    blob here (the node cache's copy, or a local store's file), None where neither holds it."""
    from ..store.core import blob_path

    out: list[tuple[str, Path | None]] = []
    for link in reversed(chain):
        digest = str(link.get("blob") or "")
        path = cache.peek(digest) if digest else None
        if path is None and digest and store.is_local:
            local = Path(store.path(blob_path(digest)))
            path = local if local.is_file() else None
        out.append((digest, path))
    return out


def candidates(baseline: Manifest, after: Manifest, changed: Sequence[str]) -> dict[str, Entry]:
    """The changed regular files that kept their size and mode (one link: a hardlink follows its
    target), with their baseline entry: the only ones whose bytes may be the parent's."""
    out: dict[str, Entry] = {}
    for p in changed:
        b, a = baseline.get(p), after[p]
        if b is not None and a.kind == FILE == b.kind and a.size == b.size and a.mode == b.mode and a.nlink == 1:
            out[p] = b
    return out


def identical_rewrites(
    baseline: Manifest, after: Manifest, changed: Sequence[str], blobs: Sequence[tuple[str, Path | None]]
) -> set[str]:
    """The paths of `changed` whose bytes equal the parent's. `blobs`: the chain's (digest, local path
    or None), newest first."""
    todo = candidates(baseline, after, changed)
    same: set[str] = set()
    pycs: dict[str, str] = {}  # pyc -> its source: left out only if the source is
    for digest, path in blobs:
        if not todo or path is None or not _worth_reading(todo, path):
            break
        try:
            found = _compare_blob(digest, path, todo, baseline, after)
        except Exception:  # a blob unreadable or corrupt in any way: nothing of it (nor older) is known
            break
        for p, src in found.items():
            if src:
                pycs[p] = src
            else:
                same.add(p)
    same |= {p for p, src in pycs.items() if src in same}
    return same


def _worth_reading(todo: dict[str, Entry], blob: Path) -> bool:
    """Whether the candidates' bytes are worth reading the blob for (hashing it, decompressing its frames).

    A small bump over a large base (a few same-size files of one reinstalled package against a torch
    blob of hundreds of MB) would pay a second or more on every layered build to save a few kB of
    upload: compared only when the candidates hold at least a quarter of the blob's size, or 64 MiB."""
    want = sum(e.size for e in todo.values())
    try:
        size = os.stat(blob).st_size
    except OSError:
        return False
    return want * 4 >= size or want >= WORTH_BYTES


def _compare_blob(
    digest: str, path: Path, todo: dict[str, Entry], baseline: Manifest, after: Manifest
) -> dict[str, str]:
    """Compare the candidates this blob lists (they leave `todo`: this link holds their last bytes).
    Returns the equal ones, each mapped to "" or (a pyc equal but for its source's mtime) to its source."""
    import zstandard

    from .reader import next_member, read_meta

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if _sha256(fd) != digest:
            raise ValueError(f"blob {digest[:12]} does not match its digest")
        meta = read_meta(fd)
        wanted: dict[str, Entry] = {}
        for e in meta.entries:
            b = todo.pop(e.path, None)
            if b is not None and e.kind == FILE and e.size == b.size and e.mtime == b.mtime_ns // 10**9:
                wanted[e.path] = b
        out: dict[str, str] = {}
        dctx = zstandard.ZstdDecompressor()
        for frame in meta.frames:
            if not wanted:
                break
            r = _Reads(dctx.stream_reader(os.pread(fd, frame.length, frame.offset)))
            pos = 0
            while pos < frame.raw and wanted:
                m, n = next_member(r, frame.raw - pos)
                pos += n
                if m is None:
                    continue
                padded = m.size + (-m.size % 512)
                pos += padded
                b = wanted.pop(m.path, None)
                if b is None or m.kind != FILE or m.size != b.size:
                    r.skip(padded)
                    continue
                verdict = _verdict(m.path, r, m.size, after)
                r.skip(padded - m.size)
                if verdict is not None:
                    out[m.path] = verdict
        return out
    finally:
        os.close(fd)


def _verdict(path: str, r: _Reads, size: int, after: Manifest) -> str | None:
    """Compare the member's `size` bytes next in `r` with the file at `path` (all of them are read).

    "" when equal; its source's path when it is a pyc that differs only in the source mtime it
    records, each copy recording its own source's; None otherwise."""
    try:
        fd = open_regular(path)
    except OSError:
        r.skip(size)
        return None
    try:
        if not path.endswith(".pyc") or size > PYC_MAX:
            return _same_stream(r, fd, size)
        old, new = r.read(size), _read_exact_fd(fd, size + 1)
    finally:
        os.close(fd)
    if new == old:
        return ""
    if len(new) < 16 or new[:8] != old[:8] or new[12:16] != old[12:16]:
        return None
    if old[4:8] != b"\0\0\0\0" or old[:4] != _magic():  # hash-based, or another Python's: equal bytes only
        return None
    if not _same_code(old[16:], new[16:]):
        return None
    src = _pyc_source(path)
    if src is None or src not in after:
        return None
    return src if new[PYC_STAMP] == _stamp(after[src]) else None


def _magic() -> bytes:
    from importlib.util import MAGIC_NUMBER

    return MAGIC_NUMBER


def _same_code(old: bytes, new: bytes) -> bool:
    """Whether two pycs' code objects are equal.

    Their bytes may differ where the code does not: `marshal` flags an object for back-references by
    its reference count at the time it is written, which differs from one compiling process to the
    next (9 bytes of six's 46 kB pyc), and pip compiles in a temporary directory, whose random name
    is the recorded `co_filename` (import replaces it with the source's path on load:
    `_imp._fix_co_filename`; code equality does not compare it). Only bytes of this interpreter's
    magic number get here: the loader Python's import runs on every pyc the job imports."""
    import marshal

    if old == new:
        return True
    try:
        a, b = marshal.loads(old), marshal.loads(new)
    except (ValueError, EOFError, TypeError):
        return False
    return bool(a == b)


def _same_stream(r: _Reads, fd: int, size: int) -> str | None:
    """Whether the file `fd` holds exactly the member's `size` bytes, a MiB at a time ("" or None)."""
    left, same = size, True
    while left > 0:
        k = min(left, 1 << 20)
        old = r.read(k)
        if same and _read_exact_fd(fd, k) != old:
            same = False
        left -= k
    return "" if same and not os.read(fd, 1) else None


def _stamp(e: Entry) -> bytes:
    return ((e.mtime_ns // 10**9) & 0xFFFFFFFF).to_bytes(4, "little")


def _pyc_source(pyc: str) -> str | None:
    """`d/__pycache__/name.cpython-311.pyc` -> `d/name.py`."""
    d, _, name = pyc.rpartition("/")
    parent, _, cache = d.rpartition("/")
    if cache != "__pycache__":
        return None
    stem = name.split(".", 1)[0]
    return f"{parent}/{stem}.py"


class _Reads:
    """A `reader.Reader` over a decompressor's stream (whose `read` may return less than asked)."""

    def __init__(self, stream: Reader) -> None:
        self.s = stream

    def read(self, n: int) -> bytes:
        parts, left = [], n
        while left > 0:
            piece = self.s.read(left)
            if not piece:
                break
            parts.append(piece)
            left -= len(piece)
        return b"".join(parts)

    def skip(self, n: int) -> None:
        while n > 0:
            piece = self.s.read(min(n, 1 << 20))
            if not piece:
                return
            n -= len(piece)


def _read_exact_fd(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left > 0:
        piece = os.read(fd, min(left, 1 << 20))
        if not piece:
            break
        parts.append(piece)
        left -= len(piece)
    return b"".join(parts)


def _sha256(fd: int) -> str:
    h = hashlib.sha256()
    off = 0
    while True:
        piece = os.pread(fd, 1 << 20, off)
        if not piece:
            return h.hexdigest()
        h.update(piece)
        off += len(piece)
