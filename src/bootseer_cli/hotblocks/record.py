"""Hot-block records: which byte ranges of which files a start read, and how to store them.

A record is a Parquet table of extents `(path, offset, length)`, sorted by path and offset, whose
key-value metadata (`bootseer.hot`, JSON) holds the image key, the page size, the roots, the size and
mtime of every file that has extents (so replay can tell a stale file), the bytes under the roots
(for "share of the roots") and when and where it was taken. It is published as an immutable blob,
and `refs/hot/<image_key>.json` names it (written last, DESIGN.md section 3).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError
from .pagecache import PAGE_SIZE, FileInfo, parallel_map, resident_runs, walk_files

if TYPE_CHECKING:
    from ..settings import P2PSettings
    from ..store.cache import BlobCache
    from ..store.core import Store

FORMAT = 1
META_KEY = b"bootseer.hot"
REF_KIND = "hot"
# Resident runs this close together are read as one extent: one larger read costs less than two
# round trips on a lazily loaded image, and the gap is rarely more than readahead left out.
GAP_BYTES = 64 << 10
STAT_THREADS = 64  # stats at once when checking a record against the files
# An opened-files record's files recorded in part (mapped libraries: mapped.py) have their extents in the
# ref too, so the start rebuilds it without the blob and pyarrow (`from_deps`), up to this many extents
# (`import torch`: ~150); beyond, the ref stays small and the start loads the blob.
MAX_REF_PARTS = 4096


@dataclass
class Record:
    image_key: str
    roots: list[str]
    page_size: int = PAGE_SIZE
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (size, mtime_ns)
    extents: list[tuple[str, int, int]] = field(default_factory=list)  # (path, offset, length)
    roots_bytes: int = 0
    roots_files: int = 0
    created: float = 0.0
    creator: str = ""
    # "mincore" (pages resident after the start) or "opened-files" (the files the start opened, on a
    # tree that drops pages at open, where residency cannot be seen: whole, or the pages of a mapped
    # library that the job's page tables held)
    method: str = "mincore"
    # "full", or "partial (why)": the opens the record may have missed (a fanotify overflow, the cap on
    # paths: opens.py); a partial record is published all the same, and says so
    coverage: str = "full"

    @property
    def total_bytes(self) -> int:
        return sum(n for _, _, n in self.extents)

    def bytes_by_file(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for path, _, n in self.extents:
            out[path] = out.get(path, 0) + n
        return out


def coalesce(
    runs: Iterable[tuple[int, int]], page_size: int, file_size: int, gap: int = GAP_BYTES
) -> list[tuple[int, int]]:
    """Page runs → byte extents (offset, length), neighbours closer than `gap` merged, clipped to the file."""
    out: list[list[int]] = []
    for first, count in runs:
        start = first * page_size
        end = min((first + count) * page_size, file_size)
        if end <= start:
            continue
        if out and start - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e - s) for s, e in out]


def scan(
    image_key: str,
    roots: list[str],
    files: Iterable[FileInfo] | None = None,
    whole: Callable[[str], bool] | None = None,
    mapped: dict[str, list[tuple[int, int]]] | None = None,
) -> Record:
    """Take a record now: every file under `roots` with resident pages, as coalesced extents.

    A file for which `whole(path)` is true is recorded whole (its tree drops pages at every open,
    so mincore cannot see what was read: the file set is what the record knows), unless `mapped` has
    its pages from the job's page tables (mapped.py: page runs of a mapped library), and page 0 (the
    ELF header, which the dynamic loader reads with read(), not through the mapping).
    """
    rec = Record(image_key=image_key, roots=list(roots), created=time.time(), creator=socket.gethostname())
    listed = list(files if files is not None else walk_files(roots))
    whole = whole or (lambda _p: False)

    def runs_of(f: FileInfo) -> list[tuple[int, int]]:
        if f.size <= 0:
            return []
        if whole(f.path):
            if mapped and mapped.get(f.path):
                return [(0, 1), *mapped[f.path]]
            return [(0, (f.size + PAGE_SIZE - 1) // PAGE_SIZE)]
        return resident_runs(f.path, f.size)

    runs = parallel_map(runs_of, listed)
    for f, file_runs in zip(listed, runs, strict=True):
        rec.roots_files += 1
        rec.roots_bytes += f.size
        extents = coalesce(file_runs, PAGE_SIZE, f.size)
        if extents:
            rec.files[f.path] = (f.size, f.mtime_ns)
            rec.extents.extend((f.path, off, n) for off, n in extents)
    rec.extents.sort()
    if any(whole(p) for p in rec.files):
        rec.method = "opened-files"
    return rec


def scan_seen(
    image_key: str,
    roots: list[str],
    files: list[FileInfo] | None,
    mapped: dict[str, list[tuple[int, int]]] | None = None,
) -> Record:
    """`scan` of the files a start was seen to open (all under the roots when None), each tree as it allows:
    residency by mincore where pages survive an open, whole files where the tree drops them (probed now,
    after the start, on a page already resident where there is one, so the probe adds nothing), but for
    the pages `mapped` saw in the job's page tables."""
    from .probe import probe_root

    sample = (files or [])[:64]
    hints = [(f.path, runs[0][0] * PAGE_SIZE) for f in sample if (runs := resident_runs(f.path, f.size))]
    hints += [(f.path, 0) for f in sample if f.size > 0]
    # no hint (the whole roots were evicted and walked): the caller knew the tree keeps pages
    drops = tuple(os.path.realpath(r).rstrip("/") + "/" for r in roots if hints and probe_root(r, hints).drops)
    return scan(image_key, roots, files, whole=(lambda p: p.startswith(drops)) if drops else None, mapped=mapped)


def file_infos(paths: Iterable[str]) -> list[FileInfo]:
    """FileInfo for each path that is still a regular file (no symlinks followed)."""
    out = []
    for p in paths:
        try:
            s = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISREG(s.st_mode):
            out.append(FileInfo(p, s.st_size, s.st_mtime_ns, s.st_uid))
    return out


def to_parquet(rec: Record) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = {
        "format": FORMAT,
        "image_key": rec.image_key,
        "page_size": rec.page_size,
        "roots": rec.roots,
        "roots_bytes": rec.roots_bytes,
        "roots_files": rec.roots_files,
        "created": rec.created,
        "creator": rec.creator,
        "method": rec.method,
        "coverage": rec.coverage,
        "files": {p: [s, m] for p, (s, m) in sorted(rec.files.items())},
    }
    table = pa.table(
        {
            "path": pa.array([e[0] for e in rec.extents], pa.string()),
            "offset": pa.array([e[1] for e in rec.extents], pa.int64()),
            "length": pa.array([e[2] for e in rec.extents], pa.int64()),
        }
    ).replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def from_parquet(data: bytes) -> Record:
    """Parse a record; anything malformed is an IntegrityError (the store is not trusted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # not read_table: it imports pyarrow.dataset. On this thread: a record is small, and pyarrow's
        # pool of threads, once started, could abort the process at its exit ("terminate called without
        # an active exception": `bootseer hot show` under load, 1 in 60 runs)
        table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        meta = json.loads((table.schema.metadata or {})[META_KEY])
        paths = table.column("path").to_pylist()
        offsets = table.column("offset").to_pylist()
        lengths = table.column("length").to_pylist()
        rec = Record(
            image_key=str(meta["image_key"]),
            roots=[str(r) for r in meta["roots"]],
            page_size=int(meta["page_size"]),
            files={str(p): (int(v[0]), int(v[1])) for p, v in meta["files"].items()},
            extents=list(zip(paths, offsets, lengths, strict=True)),
            roots_bytes=int(meta.get("roots_bytes", 0)),
            roots_files=int(meta.get("roots_files", 0)),
            created=float(meta.get("created", 0.0)),
            creator=str(meta.get("creator", "")),
            method=str(meta.get("method", "mincore")),
            coverage=str(meta.get("coverage", "full")),
        )
    except (KeyError, ValueError, TypeError, OSError, pa.ArrowException) as e:
        raise IntegrityError(f"hot-block record is malformed: {e}") from None
    for path, off, n in rec.extents:
        if not isinstance(path, str) or not os.path.isabs(path) or off is None or n is None or off < 0 or n <= 0:
            raise IntegrityError(f"hot-block record has a bad extent: {path!r} {off} {n}")
        if path not in rec.files:
            raise IntegrityError(f"hot-block record has an extent for an unlisted file: {path}")
    return rec


def _probe_hint(rec: Record) -> list[Any]:
    """A page the replay would read, of the shallowest file: the next start probes the tree with it
    (probe.py) without listing directories through the loader."""
    if not rec.extents:
        return []
    path, offset = min(((p, o) for p, o, _ in rec.extents), key=lambda e: (e[0].count("/"), e))
    return [path, offset]


def publish(store: Store, rec: Record) -> dict[str, Any]:
    """Store the record as a blob, then its ref (last, so a reader never sees a ref without its blob)."""
    data = to_parquet(rec)
    digest = store.put_blob_bytes(data)
    doc = {
        "format": FORMAT,
        "blob": digest,
        "size": len(data),
        "files": len(rec.files),
        "extents": len(rec.extents),
        "bytes": rec.total_bytes,
        "roots": rec.roots,
        "roots_bytes": rec.roots_bytes,
        "created": rec.created,
        "creator": rec.creator,
        "method": rec.method,
        "coverage": rec.coverage,
        **ref_extras(rec),
    }
    store.write_ref(REF_KIND, rec.image_key, doc)
    return doc


def ref_extras(rec: Record) -> dict[str, Any]:
    """What a start needs from the ref alone, before (or instead of) loading the Parquet blob and pyarrow
    (0.3 s of import): the probe's page, the extents that judge a loader's own cache (loadercache.py),
    and `deps`, the size, mtime and recorded bytes of every file, so a stale record is known as such."""
    from .loadercache import pick_samples

    probe = _probe_hint(rec)
    by_file = rec.bytes_by_file()
    doc: dict[str, Any] = {
        "probe": probe,
        "samples": [list(x) for x in pick_samples(rec.extents, probe[0] if probe else None)],
        "deps": [[p, s, m, by_file.get(p, 0)] for p, (s, m) in sorted(rec.files.items())],
    }
    if rec.method == "opened-files":
        partial = [e for e in rec.extents if by_file[e[0]] != rec.files[e[0]][0]]
        if partial and len(partial) <= MAX_REF_PARTS:
            parts: dict[str, list[int]] = {}
            for path, off, n in partial:
                parts.setdefault(path, []).extend((off, n))
            doc["parts"] = [[p, flat] for p, flat in parts.items()]
    return doc


def within(roots: list[str]) -> Callable[[str], bool]:
    """A test for "this path is under one of `roots`" (paths as written; one not in normal form is not)."""
    real = {os.path.realpath(r) for r in roots}  # a root may be a file (walk_files)
    prefixes = tuple(r.rstrip("/") + "/" for r in real)

    def inside(path: str) -> bool:
        return os.path.normpath(path) == path and (path.startswith(prefixes) or path in real)

    return inside


def confine(rec: Record, roots: list[str]) -> int:
    """Drop, in place, every file and extent of `rec` not under `roots` (this node's configured roots, not
    the record's own, which come from the store); returns how many files were dropped.

    A record is a list of paths that replay opens and reads as root: one from the store must not make it
    read anything outside the trees it was configured for. Paths are compared as written, and one that
    is not in normal form (`..`, `//`) is dropped too, so no spelling leads out of a root."""
    inside = within(roots)
    outside = {p for p in rec.files if not inside(p)} | {p for p, _, _ in rec.extents if not inside(p)}
    if outside:
        rec.files = {p: v for p, v in rec.files.items() if p not in outside}
        rec.extents = [e for e in rec.extents if e[0] not in outside]
    return len(outside)


def load(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    image_key: str,
    roots: list[str],
    doc: dict[str, Any] | None = None,
) -> tuple[Record, dict[str, Any]] | None:
    """The published record for `image_key` (through the node cache, and the job's swarm when `p2p` is on),
    confined to `roots` (the configured ones: see `confine`; the ref's `_outside` counts what was dropped), or None.
    `doc`: the ref, when the caller has just read it."""
    from ..delivery import fetch_blob

    doc = doc if doc is not None else store.read_ref(REF_KIND, image_key)
    if doc is None:
        return None
    digest = doc.get("blob")
    if not isinstance(digest, str):
        raise IntegrityError(f"ref hot/{image_key[:16]} names no blob")
    fetched = fetch_blob(p2p, store, digest, cache=cache)
    rec = from_parquet(fetched.path.read_bytes())
    dropped = confine(rec, roots)
    doc = dict(doc, _source=fetched.source, _bytes_from_store=fetched.bytes_from_store, _outside=dropped)
    return rec, doc


@dataclass
class Staleness:
    fresh_files: int = 0
    stale_files: list[str] = field(default_factory=list)
    fresh_bytes: int = 0
    stale_bytes: int = 0

    @property
    def stale_share(self) -> float:
        total = self.fresh_bytes + self.stale_bytes
        return self.stale_bytes / total if total else 0.0


_NS = 1_000_000_000


def check(rec: Record) -> tuple[Staleness, set[str]]:
    """Which of the record's files still have the size and mtime they had; returns (counts, fresh paths)."""
    st = Staleness()
    fresh: set[str] = set()
    by_file = rec.bytes_by_file()
    paths = list(rec.files)
    for path, s in zip(paths, stat_many(paths), strict=True):
        size, mtime_ns = rec.files[path]
        _count(st, fresh, path, s, size, mtime_ns, by_file.get(path, 0))
    return st, fresh


def stat_many(paths: list[str]) -> list[os.stat_result | None]:
    """`os.stat` of each path (None where it fails), many at once: on a loader a stat can be a request
    (rclone asks the bucket for an object's mtime: 242 stats took 1.37 s one by one, 0.19 s 64 at a time)."""

    def one(path: str) -> os.stat_result | None:
        try:
            return os.stat(path)
        except OSError:
            return None

    if len(paths) < 16:
        return [one(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(STAT_THREADS) as pool:
        return list(pool.map(one, paths, chunksize=4))


def _count(
    st: Staleness, fresh: set[str], path: str, s: os.stat_result | None, size: int, mtime_ns: int, n: int
) -> None:
    """Count `path` (`n` recorded bytes) as fresh when it is still a regular file of that size and mtime."""
    # Whole seconds: an env snapshot (a tar stream) restores mtimes to the second, so the
    # same file on the node that ran the setup and on a node that restored it must agree.
    ok = s is not None and stat.S_ISREG(s.st_mode) and s.st_size == size and s.st_mtime_ns // _NS == mtime_ns // _NS
    if ok:
        st.fresh_files += 1
        st.fresh_bytes += n
        fresh.add(path)
    else:
        st.stale_files.append(path)
        st.stale_bytes += n


def from_deps(doc: dict[str, Any], image_key: str, roots: list[str]) -> Record | None:
    """An opened-files record rebuilt from its ref alone (no blob, no Parquet, no pyarrow: 0.2-1 s of a
    start): the ref's `deps` give the files recorded whole (their extents are the files, front to back)
    and its `parts` the extents of those recorded in part (mapped libraries). Only the files under
    `roots` (the configured ones, as `confine`); None for any other ref (a mincore record, a file
    recorded in part without `parts` that add up to its recorded bytes, `deps` missing or malformed)."""
    deps = doc.get("deps")
    if doc.get("method") != "opened-files" or not isinstance(deps, list):
        return None
    inside = within(roots)
    rec = Record(image_key=image_key, roots=[str(r) for r in doc.get("roots") or []], method="opened-files")
    try:
        parts = {str(p): [int(x) for x in flat] for p, flat in doc.get("parts") or []}
        for path, size, mtime_ns, n in deps:
            size, n = int(size), int(n)
            if not isinstance(path, str) or size < 0:
                return None
            if n == size:
                extents = [(0, size)] if size > 0 else []
            else:
                found = _parts_of(parts.get(path), size, n)
                if found is None:
                    return None
                extents = found
            if inside(path):
                rec.files[path] = (size, int(mtime_ns))
                rec.extents.extend((path, off, length) for off, length in extents)
    except (TypeError, ValueError):
        return None
    rec.extents.sort()
    return rec


def _parts_of(flat: list[int] | None, size: int, n: int) -> list[tuple[int, int]] | None:
    """The extents (offset, length) in a ref's `parts` for a file of `size` bytes with `n` recorded,
    or None unless they lie in the file, in order, apart, and add up to `n`."""
    if not flat or len(flat) % 2:
        return None
    extents = list(zip(flat[::2], flat[1::2], strict=True))
    end = 0
    for off, length in extents:
        if off < end or length <= 0 or off + length > size:
            return None
        end = off + length
    return extents if sum(length for _, length in extents) == n else None


def ref_deps(doc: dict[str, Any], roots: list[str]) -> list[tuple[str, int, int, int]] | None:
    """The ref's `deps` (path, size, mtime_ns, recorded bytes) under `roots` (as `confine`), or None when
    the ref has none or they are malformed (a ref published before them: load and check instead)."""
    deps = doc.get("deps")
    if not isinstance(deps, list):
        return None
    inside = within(roots)
    try:
        return [
            (p, int(size), int(mtime_ns), int(n)) for p, size, mtime_ns, n in deps if isinstance(p, str) and inside(p)
        ]
    except (TypeError, ValueError):
        return None
