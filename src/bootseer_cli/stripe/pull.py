"""Pull a striped checkpoint to local disk: parallel, verified, atomic.

The files are written into a hidden sibling directory of DEST and renamed into place only when every
cell has matched its checksum in the manifest (the read engine checks each one), so DEST appears
complete, verified, or not at all. Reads go through the same engine as the mount (`reader.Reader`): by
default ranged reads from the stripe targets with read-ahead across all stripes; with `[p2p]`
enabled, whole stripes are fetched first through `delivery.fetch_blob` (node cache → swarm →
store), so the job's nodes share the transfer, and the engine then assembles from those local files.

A small marker beside DEST (`.DEST.bootseer-ckpt.json`) records which manifest it holds, so a restart
that finds the same checkpoint already pulled does nothing, and the size and mtime of every entry
bootseer wrote: what differs from it is the job's (`job_files`), never replaced or removed by bootseer,
and pushed as a new tag by the write-back (writeback.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError, IntegrityError
from .catalog import Targets
from .layout import Manifest
from .reader import FileStripe, Reader, ReaderOptions, StripeSource, open_reader

if TYPE_CHECKING:
    from ..settings import P2PSettings
    from ..store.cache import BlobCache

WRITE_CHUNK = 16 << 20


@dataclass
class PullResult:
    dest: Path
    bytes: int
    skipped: bool = False
    bytes_from_store: int = 0
    bytes_from_peers: int = 0


def marker_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.bootseer-ckpt.json"


def _marker(dest: Path) -> dict[str, Any]:
    try:
        doc = json.loads(marker_path(dest).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def is_current(dest: Path, m: Manifest) -> bool:
    """DEST holds exactly checkpoint `m`, as bootseer wrote it (nothing the job wrote since)."""
    return _marker(dest).get("manifest") == m.digest() and dest.is_dir() and is_current_tree(dest)


def _stamps(dest: Path) -> dict[str, list[int]]:
    """Size and mtime (ns) of every entry under DEST, links not followed (a directory's size is -1)."""
    import stat

    out: dict[str, list[int]] = {}
    for root, dnames, fnames in os.walk(dest):
        rel_root = os.path.relpath(root, dest)
        for n in dnames + fnames:
            rel = n if rel_root == "." else f"{rel_root}/{n}"
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, n))
                out[rel] = [-1 if stat.S_ISDIR(st.st_mode) else st.st_size, st.st_mtime_ns]
    return out


def write_marker(dest: Path, m: Manifest) -> None:
    """Record that DEST holds `m`, and the stamp of each entry as it is now (written by bootseer)."""
    doc = {"manifest": m.digest(), "name": m.name, "tag": m.tag, "files": _stamps(dest)}
    tmp = marker_path(dest).with_suffix(f".{uuid.uuid4().hex}.tmp")  # unguessable, O_EXCL: no planted link followed
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "w") as f:
        f.write(json.dumps(doc))
    os.replace(tmp, marker_path(dest))


def pulled_from(dest: Path) -> str:
    """The checkpoint name DEST was pulled from, when its marker records what bootseer wrote ("" when
    not: no marker, or an older bootseer's without the stamps, whose files cannot be told apart)."""
    doc = _marker(dest)
    return str(doc.get("name") or "") if isinstance(doc.get("files"), dict) else ""


def job_files(dest: Path) -> list[str]:
    """Entries under DEST bootseer did not put there (new, or changed since its pull or write-back)."""
    if not dest.is_dir() or dest.is_symlink():
        return []
    known = _marker(dest).get("files")
    known = known if isinstance(known, dict) else {}
    return sorted(rel for rel, st in _stamps(dest).items() if known.get(rel) != st)


def is_current_tree(dest: Path) -> bool:
    """DEST is exactly as bootseer last wrote it: nothing new, changed or removed."""
    known = _marker(dest).get("files")
    return isinstance(known, dict) and _stamps(dest) == known


def _whole_stripes(
    m: Manifest, targets: Targets, p2p: P2PSettings, cache: BlobCache, advance: Callable[[int], None]
) -> tuple[list[StripeSource], int, int]:
    """Fetch every stripe whole through fetch_blob (in parallel); local sources for the engine."""
    from ..delivery import fetch_blob

    def one(i: int) -> tuple[StripeSource, int, int]:
        ref = m.stripes[i]
        for _ in range(2):  # the cache may evict a stripe between fetch and open: fetch it again
            got = fetch_blob(p2p, targets.get(ref.target), ref.digest, progress=advance, cache=cache)
            try:
                return FileStripe(str(got.path), i), got.bytes_from_store, got.bytes_from_peers
            except FileNotFoundError:
                continue
        raise BootseerError(f"stripe {i} vanished from the node cache while it was pulled")

    with ThreadPoolExecutor(min(16, m.k)) as pool:
        got = list(pool.map(one, range(m.k)))
    return [g[0] for g in got], sum(g[1] for g in got), sum(g[2] for g in got)


def pull(
    m: Manifest,
    targets: Targets,
    dest: Path,
    *,
    replace: bool = False,
    opts: ReaderOptions | None = None,
    p2p: P2PSettings | None = None,
    cache: BlobCache | None = None,
    whole_stripes: bool = False,
    advance: Callable[[int], None] | None = None,
) -> PullResult:
    """Materialise checkpoint `m` at `dest`.

    `whole_stripes` fetches each stripe whole into the node `cache` first (through the swarm when
    `p2p` is enabled), so the nodes of a job share the transfer; it needs `cache`.
    """
    if whole_stripes and cache is None:
        raise ValueError("pull(whole_stripes=True) needs the node cache")
    dest = Path(os.path.abspath(dest))
    advance = advance or (lambda _n: None)
    if is_current(dest, m):
        return PullResult(dest, 0, skipped=True)
    targets.check(m)  # an unknown target is refused before anything is created or opened
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())) and not replace:
        raise BootseerError(f"{dest} already exists (use --force to replace it)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.bootseer-part-{uuid.uuid4().hex[:8]}"
    from_store = from_peers = 0
    reader: Reader | None = None
    try:
        tmp.mkdir()
        for d in m.dirs:
            (tmp / d).mkdir(parents=True, exist_ok=True)
        if whole_stripes:
            from ..settings import P2PSettings

            assert cache is not None  # checked above
            sources, from_store, from_peers = _whole_stripes(m, targets, p2p or P2PSettings(), cache, advance)
            reader = Reader(m, sources, opts)
            advance = lambda _n: None  # noqa: E731 - the bytes were counted as they arrived
        else:
            reader = open_reader(m, targets, opts)
            from_store = m.total_size
        _write_files(m, reader, tmp, advance)
        marker_path(dest).unlink(missing_ok=True)
        _swap_in(tmp, dest)
        write_marker(dest, m)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if reader is not None:
            reader.close()
    return PullResult(dest, m.total_size, bytes_from_store=from_store, bytes_from_peers=from_peers)


def _write_files(m: Manifest, reader: Reader, root: Path, advance: Callable[[int], None]) -> None:
    """Write every file from one sequential stream through the engine, on a writer thread.

    Reading and writing overlap: this thread waits for verified cells while the writer thread
    copies the previous chunk into the page cache (both release the GIL), so the disk write does
    not stall the read-ahead. Every byte passes a per-cell checksum from the manifest on its way
    through the engine, which covers each file completely, so the files' own sha256 (kept in the
    manifest for other tools) is not computed again here.
    """
    chunk = max(WRITE_CHUNK, 4 * m.cell_size * m.k)
    stream = object()
    q: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=3)
    errors: list[BaseException] = []

    def writer() -> None:
        out = None
        while (item := q.get()) is not None:
            if errors:
                continue  # keep draining so the reader never blocks on a full queue
            kind, value = item
            try:
                if kind == "open":
                    out = open(value, "wb")  # noqa: SIM115 - closed by the "close" item or below
                elif kind == "close" and out is not None:
                    if value is not None:  # the recorded mtime, on the descriptor written (no path followed)
                        out.flush()
                        os.utime(out.fileno(), ns=(value, value))
                    out.close()
                    out = None
                elif out is not None:
                    for part in value:
                        out.write(part)
                        advance(len(part))
            except BaseException as e:
                errors.append(e)
        if out is not None:
            out.close()

    thread = threading.Thread(target=writer, name="ckpt-pull-writer", daemon=True)
    thread.start()
    try:
        for f in m.files:
            path = root / f.path
            path.parent.mkdir(parents=True, exist_ok=True)
            q.put(("open", path))
            off = 0
            while off < f.size:
                if errors:
                    raise errors[0]
                parts = reader.pread_parts(f, off, chunk, stream=stream)
                if not parts:
                    raise IntegrityError(f"checkpoint {m.name}:{m.tag}: {f.path} ended early")
                q.put(("data", parts))
                off += sum(len(p) for p in parts)
            q.put(("close", f.mtime_ns))
    finally:
        q.put(None)
        thread.join()
    if errors:
        raise errors[0]


def _swap_in(tmp: Path, dest: Path) -> None:
    """Rename the finished directory into place; an old DEST is moved aside first, then removed."""
    old = None
    if dest.exists() or dest.is_symlink():
        if dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
            dest.rmdir()
        else:
            old = dest.parent / f".{dest.name}.bootseer-old-{uuid.uuid4().hex[:8]}"
            os.rename(dest, old)
    try:
        os.rename(tmp, dest)
    except BaseException:
        if old is not None:
            with contextlib.suppress(OSError):
                os.rename(old, dest)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
