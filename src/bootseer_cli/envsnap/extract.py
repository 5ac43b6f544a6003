"""Extracting a snapshot blob safely: the plan (checks), the apply (three strategies), the undo.

Extraction treats the blob as untrusted whatever its digest (the ref naming it comes from a store
anyone with write access can fill; a streamed restore checks the digest only at the end, before the
commit): every entry must be listed in the metadata, lie
lexically under a root (no absolute escape, no `..`), resolve under a root through the symlinks that
exist on disk (no writing through a symlink pointing outside), never lie below a symlink of the same
snapshot, and be a regular file, directory, symlink or hardlink (no device nodes, fifos). Existing
paths the snapshot replaces or deletes are renamed aside first (the journal), so a failure is
undone exactly.

The frames are applied in forked worker processes where the OS has fork, else in threads, or in
this thread for a single frame: each worker decompresses its own frames and writes their files
with plain `os` calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BootseerError, IntegrityError
from . import journal
from .format import BLOCK, HARDLINK, ArchiveEntry, Frame, Meta, Progress, Reader, TarMember, UnsafeArchive, next_member
from .manifest import DIR, FILE, SYMLINK, UNDO_PREFIX, under

ONE_SHOT_MAX = 64 << 20  # frames up to this raw size are decompressed in one call
MODE_MASK = 0o777  # setuid/setgid/sticky bits from a store are not honoured


FAULT_ENV = "BOOTSEER_TEST_RESTORE_FAULT"  # tests: SIGKILL the process group at a named point
SPACE_SLACK = 1 << 20  # free space kept beyond the snapshot's files (metadata blocks, the stamp)


def _fault(point: str) -> None:
    """A test hook: at `point`, kill this restore's whole process group, as a crash would."""
    if os.environ.get(FAULT_ENV) == point:
        os.killpg(os.getpgrp(), signal.SIGKILL)


class NoSpace(BootseerError):
    """The filesystem under a root has too little free space for the snapshot (nothing was written)."""


class RestoreError(BootseerError):
    """Extraction failed (the filesystem refused a write); `undone` says whether the tree was put back."""

    def __init__(self, message: str, undone: bool) -> None:
        super().__init__(message)
        self.undone = undone


@dataclass
class Extracted:
    files: int
    raw_bytes: int
    backup_note: str = ""


# ---- the plan ------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What an extraction will do, checked before anything is written."""

    roots: list[str]
    entries: dict[str, ArchiveEntry]  # by path, in the snapshot's order
    deletions: list[str]
    frames: tuple[Frame, ...]
    files: int = 0
    raw_bytes: int = 0


def _check_path(p: Any, roots: list[str]) -> str:
    """Absolute, normal (no '.', '..', '//', trailing '/': string tests, which are what `normpath`
    would change, at a fraction of its cost per entry) and lexically under a root."""
    if not isinstance(p, str) or not p.startswith("/") or "\0" in p:
        raise UnsafeArchive(f"snapshot entry {p!r}: not an absolute path")
    q = p + "/"
    if "//" in q or "/./" in q or "/../" in q:
        raise UnsafeArchive(f"snapshot entry {p!r}: not a normal path ('..', '.', '//')")
    if not under(p, roots):
        raise UnsafeArchive(f"snapshot entry {p!r} lies outside the roots {', '.join(roots)}")
    return p


def _check_entry(e: ArchiveEntry, roots: list[str], earlier: dict[str, ArchiveEntry]) -> None:
    """One listed entry: under a root, of a restorable kind, not a duplicate, links well formed."""
    p = _check_path(e.path, roots)
    if e.kind not in (FILE, DIR, SYMLINK, HARDLINK):
        raise UnsafeArchive(f"snapshot entry {p}: kind {e.kind!r} cannot be restored (device node or fifo?)")
    if p in roots and e.kind != DIR:
        raise UnsafeArchive(f"snapshot entry {p} would replace a root with a {e.kind!r}")
    if p in earlier:
        raise UnsafeArchive(f"snapshot entry {p} appears twice")
    if e.kind == HARDLINK:
        _check_path(e.extra, roots)
        target = earlier.get(e.extra)
        if target is None or target.kind != FILE:
            raise UnsafeArchive(f"snapshot hardlink {p} -> {e.extra}: target is not an earlier file of the snapshot")
    if e.kind == SYMLINK and (not isinstance(e.extra, str) or not e.extra or "\0" in e.extra):
        raise UnsafeArchive(f"snapshot symlink {p}: bad target")


def _check_below_symlinks(entries: dict[str, ArchiveEntry]) -> None:
    """No entry may lie below a symlink of the same snapshot (it would be written through the link).

    In sorted order every path below `L` follows `L + "/"` directly, so one bisection per symlink
    answers it (a walk up every entry's parents cost ~0.5 s on a 23k-entry torch env)."""
    import bisect

    links = [p for p, e in entries.items() if e.kind == SYMLINK]
    if not links:
        return
    paths = sorted(entries)
    for link in links:
        i = bisect.bisect_left(paths, link + "/")
        if i < len(paths) and paths[i].startswith(link + "/"):
            raise UnsafeArchive(f"snapshot entry {paths[i]} lies below the snapshot's symlink {link}")


def plan(meta: Meta, roots: list[str]) -> Plan:
    """Check the metadata against `roots` (the roots this node restores into) and build the plan."""
    roots = [os.path.normpath(os.path.abspath(r)) for r in roots]
    entries: dict[str, ArchiveEntry] = {}
    for e in meta.entries:
        _check_entry(e, roots, entries)
        entries[e.path] = e if isinstance(e.extra, str) else ArchiveEntry(e.path, e.kind, e.mode, e.size, e.mtime)
    _check_below_symlinks(entries)
    deletions = []
    for p in meta.deletions:
        _check_path(p, roots)
        if p in roots:
            raise UnsafeArchive(f"snapshot deletes the root {p}")
        deletions.append(p)
    files = sum(1 for e in entries.values() if e.kind != DIR)
    raw = sum(e.size for e in entries.values())
    _check_frames_bound(meta.frames, entries)
    return Plan(roots, entries, deletions, meta.frames, files, raw)


def _check_frames_bound(frames: tuple[Frame, ...], entries: dict[str, ArchiveEntry]) -> None:
    """The frames may decompress to no more than the listed entries take in a tar stream (each
    file's size in whole blocks, headers and long-name records, the end blocks): a blob cannot
    expand beyond what its metadata admits. A tar writer may pad its end to a 20-block record."""
    allowed = 20 * BLOCK * max(1, len(frames))
    for e in entries.values():
        allowed += e.size + (-e.size % BLOCK) + 3 * BLOCK + 2 * (len(e.path) + len(e.extra)) + 2 * BLOCK
    total = sum(f.raw for f in frames)
    if total > allowed:
        raise IntegrityError(f"snapshot frames hold {total} bytes, more than its listed entries take ({allowed})")


def _nearest_existing(path: str) -> str:
    while not os.path.lexists(path) and path != "/":
        path = os.path.dirname(path)
    return path


def _root_of(path: str, roots: list[str]) -> str:
    """The innermost root `path` lies under (the plan made sure there is one)."""
    return roots[0] if len(roots) == 1 else max((r for r in roots if under(path, [r])), key=len)


def check_space(p: Plan) -> None:
    """Before the first write: every filesystem under the roots has room for the snapshot's files
    (each rounded up to a 4 KiB block), else NoSpace, saying how much is needed and free."""
    from ..units import fmt_bytes

    dev_of = {r: os.stat(_nearest_existing(r)).st_dev for r in p.roots}  # one stat per root, not per entry
    need: dict[int, int] = {}
    where: dict[int, str] = {}
    for e in p.entries.values():
        root = _root_of(e.path, p.roots)
        dev = dev_of[root]
        need[dev] = need.get(dev, 0) + e.size + (-e.size % 4096) + (4096 if e.kind == DIR else 0)
        where.setdefault(dev, root)
    for dev, n in need.items():
        vfs = os.statvfs(_nearest_existing(where[dev]))
        has = vfs.f_bavail * vfs.f_frsize
        if n + SPACE_SLACK > has:
            raise NoSpace(
                f"not enough free space under {where[dev]}: the snapshot needs {fmt_bytes(n + SPACE_SLACK)}, "
                f"has {fmt_bytes(has)}"
            )


# ---- the shared state of one extraction, and writing one path ---------------------------------


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
    members: int = 0  # members this process applied (for the test fault hook)
    member_fault: int = -1  # the member at which the test hook kills the restore (-1: never)
    on_workers: Callable[[], None] | None = None  # called once the workers run (after any fork)
    new: set[str] = field(default_factory=set)  # what the journal says this extraction creates
    # resolved paths of checked parents and of directories this process made inside them (a
    # directory it made is no symlink: its real path is its parent's plus its name, no realpath walk)
    real_dirs: dict[str, str] = field(default_factory=dict)
    arriving: bool = False  # the blob is still being downloaded into the file: wait for each frame


def _ensure_parent(st: _State, parent: str, trusted: bool = False) -> None:
    """Make `parent` exist, after checking it resolves inside the roots (through any symlinks on disk).

    `trusted`: `parent` is a root itself (named by the config, not by the snapshot).
    """
    if parent in st.ok_parents:
        return
    real = st.real_dirs.get(parent) or os.path.realpath(parent)
    if not trusted and not under(real, st.real_roots):
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
        st.real_dirs[parent] = real


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_file(st: _State, e: ArchiveEntry, r: Reader, streamed: bool) -> None:
    """Create the file exclusively (never through a link) and copy its `e.size` bytes from `r`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    mode = e.mode & MODE_MASK
    fd = os.open(e.path, flags, mode)
    st.created.append(e.path)  # list.append is atomic under the GIL
    try:
        if not streamed:
            _write_all(fd, r.read(e.size))
        else:  # a huge file, from a streaming decompressor
            left = e.size
            while left:
                piece = r.read(min(left, 8 << 20))
                if not piece:
                    raise IntegrityError(f"snapshot ends inside {e.path}")
                _write_all(fd, piece)
                left -= len(piece)
        if mode & st.umask:
            os.fchmod(fd, mode)
        os.utime(fd, (e.mtime, e.mtime))
    finally:
        os.close(fd)


# ---- one frame -------------------------------------------------------------------------------------


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


STALL_S = 300.0  # a blob still arriving that has not grown for this long is given up


def _wait_for(fd: int, end: int) -> None:
    """Until the file being downloaded holds `end` bytes (the download fills it in order; on a failure
    it is padded to its full size, and the frames then fail to decompress)."""
    size, since = -1, time.monotonic()
    while True:
        now = os.fstat(fd).st_size
        if now >= end:
            return
        if now != size:
            size, since = now, time.monotonic()
        elif time.monotonic() - since > STALL_S:
            raise IntegrityError(f"the snapshot download stalled at {size} bytes")
        time.sleep(0.002)


def _open_frame(fd: int, frame: Frame, dctx_local: threading.local, arriving: bool = False) -> tuple[Reader, bool]:
    """A reader over the frame's tar bytes, and whether it streams (frames too big to hold at once)."""
    import zstandard

    if arriving:
        _wait_for(fd, frame.offset + frame.length)
    comp = os.pread(fd, frame.length, frame.offset)
    if len(comp) != frame.length:
        raise IntegrityError("snapshot is truncated")
    dctx = getattr(dctx_local, "dctx", None)
    if dctx is None:
        dctx = dctx_local.dctx = zstandard.ZstdDecompressor()
    try:
        if frame.raw > ONE_SHOT_MAX:
            return _StreamReader(dctx.stream_reader(comp)), True
        data = dctx.decompress(comp, max_output_size=frame.raw)
    except zstandard.ZstdError as e:
        raise IntegrityError(f"snapshot frame at {frame.offset} is corrupt: {e}") from None
    if len(data) != frame.raw:
        raise IntegrityError("a snapshot frame has the wrong size")
    return _MemReader(data), False


def _listed(st: _State, m: TarMember) -> ArchiveEntry:
    """The listed entry a member stands for: its kind must match, and it may come only once."""
    if m.kind is None:
        raise UnsafeArchive(f"snapshot member {m.path!r} has type {m.typeflag!r} (device node, fifo?): refused")
    want = st.plan.entries.get(m.path)
    if want is None or want.kind != m.kind:
        raise UnsafeArchive(f"snapshot member {m.path!r} ({m.kind}) is not in the snapshot's list")
    with st.lock:
        if m.path in st.seen:
            raise UnsafeArchive(f"snapshot member {m.path!r} appears twice")
        st.seen.add(m.path)
    return want


def _put_dir(st: _State, e: ArchiveEntry) -> None:
    try:
        os.mkdir(e.path, e.mode & MODE_MASK | 0o700)
        st.created.append(e.path)
    except FileExistsError:
        if not os.path.isdir(e.path) or os.path.islink(e.path):
            raise UnsafeArchive(f"{e.path} exists and is not a directory") from None
    parent, _, name = e.path.rpartition("/")
    real_parent = st.real_dirs.get(parent)
    if real_parent is not None:  # a real directory (made here, or found not to be a link)
        st.real_dirs[e.path] = f"{real_parent}/{name}"


def _put_symlink(st: _State, e: ArchiveEntry, link: str) -> None:
    if link != e.extra:
        raise UnsafeArchive(f"snapshot symlink {e.path!r} differs from the snapshot's list")
    os.symlink(link, e.path)
    st.created.append(e.path)
    with contextlib.suppress(OSError):
        os.utime(e.path, (e.mtime, e.mtime), follow_symlinks=False)


def _apply_member(st: _State, m: TarMember, r: Reader, streamed: bool, room: int) -> int:
    """Write one member (its data is next in `r`, `room` bytes are left in the frame); returns data bytes read."""
    e = _listed(st, m)
    if e.path in st.plan.roots:  # a root the setup created (e.g. a compile cache): the config names it
        if not os.path.isdir(e.path):
            _ensure_parent(st, e.path, trusted=True)
        return 0
    parent = e.path.rpartition("/")[0]
    if parent not in st.ok_parents and e.kind != HARDLINK:
        _ensure_parent(st, parent)  # every parent is checked once: no writing through a symlink
    st.members += 1
    if st.members == st.member_fault:
        _fault(f"member:{st.members}")
    if e.kind == FILE:
        if m.size != e.size:  # the metadata's listed size bounds what a member may write
            raise IntegrityError(f"snapshot member {e.path!r} holds {m.size} bytes, its listing says {e.size}")
        if m.padded > room:
            raise IntegrityError(f"snapshot member {e.path!r} overruns its frame")
        _write_file(st, e, r, streamed)
        r.read(m.padded - m.size)
        return m.padded
    if e.kind == DIR:
        _put_dir(st, e)
    elif e.kind == SYMLINK:
        _put_symlink(st, e, m.link)
    else:
        if "/" + m.link.lstrip("/") != e.extra:
            raise UnsafeArchive(f"snapshot hardlink {e.path!r} differs from the snapshot's list")
        with st.lock:
            st.hardlinks.append((e.path, e.extra, e.mtime))  # after every frame: its target may be anywhere
    return 0


def _extract_frame(st: _State, blob_fd: int, frame: Frame, dctx_local: threading.local) -> int:
    """Decompress one frame and write its members; returns the raw bytes handled."""
    if st.abort.is_set():
        return 0
    r, streamed = _open_frame(blob_fd, frame, dctx_local, st.arriving)
    pos = 0
    while pos < frame.raw:
        if st.abort.is_set():
            return pos
        m, n = next_member(r, frame.raw - pos)
        pos += n
        if m is not None:
            pos += _apply_member(st, m, r, streamed, frame.raw - pos)
    return frame.raw


# ---- the strategies: this thread, threads, forked processes ----------------------------------------


def _frames_here(st: _State, fd: int, frames: tuple[Frame, ...], progress: Progress | None) -> None:
    local = threading.local()
    for f in frames:
        _extract_frame(st, fd, f, local)
        if progress:
            progress(f.raw)


def _frames_in_threads(st: _State, fd: int, frames: tuple[Frame, ...], workers: int, progress: Progress | None) -> None:
    local = threading.local()
    with ThreadPoolExecutor(workers, thread_name_prefix="bootseer-restore") as pool:
        futs = [pool.submit(_extract_frame, st, fd, f, local) for f in frames]
        try:
            for fut, f in zip(futs, frames, strict=True):
                fut.result()
                if progress:
                    progress(f.raw)
        except BaseException:
            st.abort.set()
            raise


_ERRORS: dict[str, type[BootseerError]] = {"UnsafeArchive": UnsafeArchive, "IntegrityError": IntegrityError}


def _bins(frames: tuple[Frame, ...], workers: int, arriving: bool = False) -> list[list[Frame]]:
    """The frames spread over `workers`: largest first, onto the least loaded worker; for a blob still
    arriving, in the order they arrive, dealt round (no worker waits for the end while others idle)."""
    bins: list[list[Frame]] = [[] for _ in range(workers)]
    if arriving:
        for i, f in enumerate(sorted(frames, key=lambda f: f.offset)):
            bins[i % workers].append(f)
        return [b for b in bins if b]
    loads = [0] * workers
    for f in sorted(frames, key=lambda f: -f.raw):
        i = loads.index(min(loads))
        bins[i].append(f)
        loads[i] += f.raw
    return [b for b in bins if b]


def _fork_workers(st: _State, fd: int, bins: list[list[Frame]]) -> tuple[list[int], list[int]]:
    """One forked child per bin; returns their pids and the read ends of their report pipes."""
    pids: list[int] = []
    pipes: list[int] = []
    for frames in bins:
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
        pipes.append(r)
    return pids, pipes


def _collect(pipes: list[int], progress: Progress | None) -> list[dict[str, Any]]:
    """Read the children's JSON lines until every pipe closes: progress as it comes, the final reports."""
    import selectors

    sel = selectors.DefaultSelector()
    for r in pipes:
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
                if "p" not in msg:
                    results.append(msg)
                elif progress:
                    progress(msg["p"])
    sel.close()
    return results


def _merge(st: _State, results: list[dict[str, Any]], workers: int) -> BootseerError | None:
    """Fold the children's reports into `st` (for the undo); the first error any of them met."""
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
    if len(results) != workers and error is None:
        error = RestoreError("a restore worker process died", undone=False)
    return error


def _frames_in_processes(
    st: _State, fd: int, frames: tuple[Frame, ...], workers: int, progress: Progress | None
) -> None:
    """Extract the frames in `workers` forked children; merge what they did into `st` (for the undo).

    Each child reports on a pipe, as JSON lines, the raw bytes of each frame it finished and, last,
    the paths it created and the entries it saw, or its error. The parent raises the first error
    after every child is done, so the undo sees everything that was written.
    """
    pids, pipes = _fork_workers(st, fd, _bins(frames, workers, st.arriving))
    _workers_running(st)
    results = _collect(pipes, progress)
    for pid in pids:
        os.waitpid(pid, 0)
    error = _merge(st, results, len(pids))
    if error is not None:
        raise error


def _child(st: _State, fd: int, frames: list[Frame], w: int) -> None:  # pragma: no cover
    """The body of one forked worker (see `_frames_in_processes`)."""
    st.created.clear()
    st.made_dirs.clear()
    st.seen.clear()
    st.hardlinks.clear()
    local = threading.local()
    err: list[str] | None = None
    with os.fdopen(w, "w") as out:
        try:
            for f in frames:
                _extract_frame(st, fd, f, local)
                out.write(json.dumps({"p": f.raw}) + "\n")
                out.flush()
        except BaseException as e:  # reported to the parent, which undoes everything
            err = [type(e).__name__, str(e) or type(e).__name__]
        doc = {"created": st.created, "made": st.made_dirs, "seen": sorted(st.seen), "links": st.hardlinks}
        out.write(json.dumps({**doc, "error": err}) + "\n")


def _workers_running(st: _State) -> None:
    """Start what runs beside the workers (the digest check of a streamed restore): only after the
    fork, so no child is forked while a parent thread holds a lock."""
    if st.on_workers is not None:
        st.on_workers()


def _apply_frames(st: _State, blob: Path | int, threads: int | None, progress: Progress | None) -> None:
    """The frames, in parallel: in forked processes where the OS has fork (no GIL between the writers,
    and each gets its own share of a busy machine's CPU), else in threads. More workers than cores:
    file creation waits on the filesystem, and waiting workers overlap."""
    frames = st.plan.frames
    workers = max(1, min(threads or min(16, 4 * (os.cpu_count() or 1)), len(frames) or 1))
    fd = blob if isinstance(blob, int) else os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if workers > 1 and hasattr(os, "fork") and not os.environ.get("BOOTSEER_RESTORE_THREADS"):
            _frames_in_processes(st, fd, frames, workers, progress)
        elif workers == 1:
            _workers_running(st)
            _frames_here(st, fd, frames, progress)
        else:
            _workers_running(st)
            _frames_in_threads(st, fd, frames, workers, progress)
    finally:
        if not isinstance(blob, int):
            os.close(fd)


# ---- the journal (undo) ------------------------------------------------------------------------


class _Undo:
    """Renames paths aside before they are replaced or deleted, so a failure can put them back.

    The moves are planned first (`plan_moves`), written to the journal with their destinations, and
    only then carried out: a process killed half way leaves a journal that says where everything is.
    """

    def __init__(self, roots: list[str]) -> None:
        self.roots = roots
        self.tag = uuid.uuid4().hex[:10]
        self.dirs: dict[str, str] = {r: os.path.join(r, f"{UNDO_PREFIX}{self.tag}") for r in roots}
        self.planned: list[tuple[str, str]] = []
        self.moved: list[tuple[str, str]] = []

    def plan_move(self, path: str) -> None:
        root = max((r for r in self.roots if under(path, [r])), key=len)
        self.planned.append((path, os.path.join(self.dirs[root], str(len(self.planned)))))

    def carry_out(self, real_roots: list[str]) -> None:
        for path, dest in self.planned:
            _check_real_parent(path, real_roots)
            d = os.path.dirname(dest)
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
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


def _check_real_parent(path: str, real_roots: list[str]) -> None:
    real = os.path.realpath(os.path.dirname(path))
    if not under(real, real_roots):
        raise UnsafeArchive(f"{path}: its directory resolves to {real}, outside the roots")


def _below(path: str, tops: set[str]) -> bool:
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        if parent in tops:
            return True
        parent = os.path.dirname(parent)
    return False


def _plan_changes(st: _State, undo: _Undo) -> None:
    """What the extraction will move aside (what the snapshot deletes or replaces) and what it will
    create (entries and parents that do not exist, or lie below something moved), before any change.

    A path whose parent is known to be absent is absent too: into a fresh tree this costs one
    `lstat` per directory level that exists, not one per entry."""
    moved: set[str] = set()
    for path in st.plan.deletions:
        if os.path.lexists(path) and not (moved and _below(path, moved)):
            undo.plan_move(path)
            moved.add(path)
    absent: set[str] = set()
    for path, e in st.plan.entries.items():
        if path.rpartition("/")[0] in absent:
            absent.add(path)
            continue
        if moved and _below(path, moved):
            continue
        try:
            cur = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            absent.add(path)
            continue
        if e.kind == DIR and stat.S_ISDIR(cur.st_mode):
            continue
        undo.plan_move(path)
        moved.add(path)
    kept: set[str] = set(st.plan.roots)
    for path in st.plan.entries:
        p = path
        while p not in kept and p not in st.new:
            if p not in absent and p not in moved and not (moved and _below(p, moved)) and os.path.lexists(p):
                kept.add(p)
                break
            if p not in moved:
                st.new.add(p)
            p = os.path.dirname(p)


def _rollback(st: _State, undo: _Undo) -> str:
    """Remove what the extraction created (a dead worker's paths too: the planned new paths), put
    back what it moved aside. Returns what was done."""
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
    errors += journal.undo_paths(st.plan.roots, sorted(st.new), [])
    try:
        undo.restore()
    except OSError:
        errors += 1
    if errors:
        return f"undo incomplete: {errors} path(s) could not be put back"
    return "the tree was put back as it was"


# ---- extract ---------------------------------------------------------------------------------------


def _finish(st: _State) -> None:
    """Hardlinks (their targets may have been in any frame), the completeness check, directory modes."""
    for path, target, _mtime in st.hardlinks:
        _check_real_parent(path, st.real_roots)
        _ensure_parent(st, os.path.dirname(path))
        os.link(target, path, follow_symlinks=False)
        st.created.append(path)
    missing = [q for q in st.plan.entries if q not in st.seen]
    if missing:
        raise IntegrityError(f"snapshot lacks {len(missing)} listed entries (e.g. {missing[0]})")
    for path, e in sorted(st.plan.entries.items(), reverse=True):
        if e.kind == DIR:
            os.chmod(path, e.mode & MODE_MASK)
            os.utime(path, (e.mtime, e.mtime))


def _after_rollback(e: BaseException, note: str) -> BaseException:
    """The error to raise once the tree is put back: archive faults keep their type, anything else
    a malformed blob can provoke (ValueError, RecursionError, zstd's errors …) is an IntegrityError."""
    if isinstance(e, (IntegrityError, UnsafeArchive)):
        return type(e)(f"{e} ({note})")
    if isinstance(e, BootseerError):
        return RestoreError(f"{e} ({note})", undone=True)
    if isinstance(e, OSError):
        return RestoreError(f"restore failed: {e} ({note})", undone=True)
    if isinstance(e, Exception):
        return IntegrityError(f"unusable snapshot ({type(e).__name__}: {e}) ({note})")
    return e


def _journal_doc(st: _State, undo: _Undo, committed: bool = False) -> dict[str, Any]:
    return {
        "v": 1,
        "committed": committed,
        "undo_dirs": sorted(undo.dirs.values()),
        "moves": [list(m) for m in undo.planned],
        "new": sorted(st.new),
    }


def extract(
    blob: Path | int,
    meta: Meta,
    roots: list[str],
    threads: int | None = None,
    progress: Progress | None = None,
    verify: Callable[[], None] | None = None,
    start_verify: Callable[[], None] | None = None,
    arriving: bool = False,
) -> Extracted:
    """Apply a snapshot blob (a path or an open descriptor) under `roots`: deletions, then the
    members, all or nothing.

    `verify` is called once everything is written, before the journal is committed: a restore that
    hashes the blob while it is extracted (started by `start_verify` once the workers run) raises
    there when the digest does not match, and the tree is undone like after any other failure. The
    path checks never depend on it. `arriving`: the blob (a descriptor) is still being downloaded
    into its file, in order; each frame is waited for.

    Raises UnsafeArchive/IntegrityError/NoSpace (nothing written, or undone) or RestoreError. The
    journal (see journal.py) is written before the first change and removed once done or undone;
    the caller holds the tree lock.
    """
    p = plan(meta, roots)
    check_space(p)
    st = _State(p, [os.path.realpath(r) for r in p.roots], on_workers=start_verify, arriving=arriving)
    fault = os.environ.get(FAULT_ENV, "")
    if fault.startswith("member:") and fault[7:].isdigit():
        st.member_fault = int(fault[7:])
    st.umask = os.umask(0o022)
    os.umask(st.umask)
    undo = _Undo(p.roots)
    _plan_changes(st, undo)
    journal.write(p.roots, _journal_doc(st, undo))
    _fault("journal")
    try:
        undo.carry_out(st.real_roots)
        _apply_frames(st, blob, threads, progress)
        _finish(st)
        if verify is not None:
            verify()
    except BaseException as e:
        note = _rollback(st, undo)
        if not note.startswith("undo incomplete"):
            journal.remove(p.roots)
        err = _after_rollback(e, note)
        if err is e:
            raise
        raise err from None
    journal.write(p.roots, _journal_doc(st, undo, committed=True))
    _fault("committed")
    undo.discard()
    journal.remove(p.roots)
    return Extracted(p.files, p.raw_bytes)
