"""Push a checkpoint directory into the striped layout.

Two passes over the local files, both parallel per stripe: the first hashes (each file, each cell,
each stripe), the second streams each stripe straight from the files to its target as a
content-addressed blob (`Store.put_blob_stream`, which re-hashes on the way, so a file that changes
between the passes fails the push instead of publishing a stripe that disagrees with its manifest).
No stripe is ever staged on local disk, so a checkpoint as large as the disk can be pushed.

The manifest is written after every stripe is in place, and the `latest` hint after the manifest:
a reader never finds a tag whose stripes are not all there.

A stripe object already on its target with the right size is not trusted by its size: it is read
back and hashed, and replaced when it does not match (a torn or corrupted object would otherwise be
published under a new tag that can never be read). That costs one read of each unchanged stripe.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ..digests import CHUNK, sha256_file
from ..errors import BootseerError, ConfigError, IntegrityError, StoreError
from ..store.core import Store, blob_path
from .catalog import public_uri, write_latest
from .layout import (
    MAX_CELL,
    MAX_STRIPES,
    MIN_CELL,
    FileEntry,
    Manifest,
    StripeRef,
    cell_count,
    check_name,
    manifest_rel,
    stripe_size,
)

if TYPE_CHECKING:
    from .reader import Reader

UPLOAD_TRIES = 3


def default_tag() -> str:
    """Sortable, and unique enough for two pushes in the same second."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def scan(src: Path) -> tuple[list[tuple[str, Path, int]], list[str]]:
    """(relative path, absolute path, size) of every regular file, sorted, and every directory."""
    if not src.is_dir():
        raise ConfigError(f"{src}: not a directory")
    files: list[tuple[str, Path, int]] = []
    dirs: list[str] = []
    for root, dnames, fnames in os.walk(src, followlinks=False):
        dnames.sort()
        rel_root = Path(root).relative_to(src)
        for d in dnames:
            full = Path(root) / d
            if full.is_symlink():
                raise ConfigError(f"{full}: symlinked directories are not supported in a checkpoint")
            dirs.append((rel_root / d).as_posix())
        for f in fnames:
            full = Path(root) / f
            try:
                st = full.stat()  # follows a symlink to a file: its content is what a reader wants
            except OSError as e:
                raise ConfigError(f"{full}: {e.strerror}") from None
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{full}: not a regular file")
            files.append(((rel_root / f).as_posix(), full, st.st_size))
    files.sort(key=lambda t: t[0])
    return files, sorted(dirs)


Origin = Path | FileEntry  # a local file, or a file of a parent checkpoint read through its stripes


class _Source:
    """Logical-stream reads over the files (pread, so threads share the descriptors).

    A file is a local path, or (a write-back's unchanged file, `writeback.py`) an entry of the parent
    checkpoint, read through `lower`, the parent's read engine: its cells are verified on the way,
    so its bytes are the ones its signed manifest names, without a local copy.
    """

    def __init__(self, files: list[tuple[str, Origin, int]], lower: Reader | None = None) -> None:
        self.paths = [p for _, p, _ in files]
        self.sizes = [s for _, _, s in files]
        self.lower = lower
        self.starts: list[int] = []
        off = 0
        for s in self.sizes:
            self.starts.append(off)
            off += s
        self.total = off
        self.fds: dict[int, int] = {}
        self.lock = threading.Lock()

    def _fd(self, i: int) -> int:
        with self.lock:
            if i not in self.fds:
                self.fds[i] = os.open(self.paths[i], os.O_RDONLY | os.O_CLOEXEC)  # type: ignore[arg-type]
            return self.fds[i]

    def _pread(self, i: int, want: int, off: int) -> bytes:
        origin = self.paths[i]
        if isinstance(origin, FileEntry):
            if self.lower is None:
                raise BootseerError(f"{origin.path}: a parent checkpoint's file without its reader")
            return self.lower.pread(origin, off, want)
        return os.pread(self._fd(i), want, off)

    def mtime_ns(self, i: int) -> int | None:
        """File `i`'s mtime, recorded in the manifest (trainers pick their newest checkpoint by it): a local
        file's from the descriptor its bytes were read through, a parent's file keeps its recorded one."""
        origin = self.paths[i]
        if isinstance(origin, FileEntry):
            return origin.mtime_ns
        return os.fstat(self._fd(i)).st_mtime_ns

    def read(self, lo: int, n: int) -> bytes:
        out = []
        i = bisect.bisect_right(self.starts, lo) - 1
        while n > 0 and i < len(self.sizes):
            if self.sizes[i] == 0 or lo >= self.starts[i] + self.sizes[i]:
                i += 1
                continue
            off = lo - self.starts[i]
            want = min(n, self.sizes[i] - off)
            data = self._pread(i, want, off)
            if len(data) != want:
                raise BootseerError(f"{self.paths[i]}: changed size while it was pushed")
            out.append(data)
            lo += want
            n -= want
            i += 1
        if n:
            raise BootseerError("a checkpoint file shrank while it was pushed")
        return b"".join(out)

    def close(self) -> None:
        with self.lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()


def _file_digest(origin: Origin) -> str:
    """A local file's sha256; a parent's file keeps the digest its manifest names (its cells are checked)."""
    return origin.sha256 if isinstance(origin, FileEntry) else sha256_file(origin)


def _stripe_cells(total: int, cell: int, k: int, s: int) -> Iterator[tuple[int, int, int]]:
    """(cell index, logical offset, length) of the cells of stripe `s`, in stripe order."""
    for c in range(s, cell_count(total, cell), k):
        lo = c * cell
        yield c, lo, min(cell, total - lo)


Progress = Callable[[str, int], Callable[[int], None] | None]


def _noop(_n: int) -> None:
    pass


def _phase(progress: Progress | None, name: str, total: int) -> Callable[[int], None]:
    """The `advance` of one phase, safe to call from the pool's threads (a bar is not)."""
    advance = (progress and progress(name, total)) or _noop
    lock = threading.Lock()

    def adv(n: int) -> None:
        with lock:
            advance(n)

    return adv


class _Striper:
    """One push's logical stream dealt into `k` stripes of `cell`-byte cells over `targets`."""

    def __init__(self, source: _Source, cell: int, k: int, targets: list[Store]) -> None:
        self.source = source
        self.cell = cell
        self.k = k
        self.targets = targets
        self.cells: list[str] = [""] * cell_count(source.total, cell)  # filled in by hash_stripe

    def cells_of(self, s: int) -> Iterator[tuple[int, int, int]]:
        return _stripe_cells(self.source.total, self.cell, self.k, s)

    def size_of(self, s: int) -> int:
        return stripe_size(self.source.total, self.cell, self.k, s)

    def target_of(self, s: int) -> Store:
        return self.targets[s % len(self.targets)]

    def hash_stripe(self, s: int, advance: Callable[[int], None]) -> str:
        """The stripe's digest; each of its cells' digests lands in `cells` on the way."""
        h = hashlib.sha256()
        for c, lo, n in self.cells_of(s):
            data = self.source.read(lo, n)
            self.cells[c] = hashlib.sha256(data).hexdigest()
            h.update(data)
            advance(n)
        return h.hexdigest()

    def upload_stripe(self, s: int, digest: str, advance: Callable[[int], None]) -> None:
        """Stream stripe `s` from the files to its target as blob `digest` (re-hashed on the way).

        A transient server error (seen on loopback S3 servers under concurrent multipart uploads)
        costs a retry of this stripe, not the whole push; corrupt data is never retried.
        """
        _drop_if_corrupt(self.target_of(s), digest, self.size_of(s))
        for attempt in range(UPLOAD_TRIES):
            chunks = (self.source.read(lo, n) for _, lo, n in self.cells_of(s))
            try:
                self.target_of(s).put_blob_stream(digest, chunks, self.size_of(s), advance)
                return
            except IntegrityError:
                raise
            except StoreError:
                if attempt == UPLOAD_TRIES - 1:
                    raise
                time.sleep(0.5 * 2**attempt)


def _drop_if_corrupt(target: Store, digest: str, size: int) -> None:
    """Delete blob `digest` from `target` when it is there with the right size but other bytes, so
    the upload that follows replaces it (`put_blob_stream` skips an object of the right size)."""
    rel = blob_path(digest)
    try:
        if not target.exists(rel) or target.size(rel) != size:
            return
        h = hashlib.sha256()
        with target.fs.open_input_stream(target.path(rel)) as src:
            while chunk := src.read(CHUNK):
                h.update(chunk)
    except OSError as e:
        raise StoreError(f"cannot check stripe blob {digest[:12]} on its target: {e}") from None
    if h.hexdigest() != digest:
        target.delete(rel)


def _check_args(store: Store, name: str, tag: str | None, stripes: int, cell_size: int) -> str:
    """The tag to push under, once the arguments are sane and the tag is free (tags are immutable)."""
    check_name(name)
    tag = check_name(tag, "tag") if tag else default_tag()
    if not 1 <= stripes <= MAX_STRIPES:
        raise ConfigError(f"--stripes {stripes}: use 1 to {MAX_STRIPES}")
    if not MIN_CELL <= cell_size <= MAX_CELL:
        raise ConfigError(f"--cell-size {cell_size}: use {MIN_CELL} B to 1 GiB")
    if store.exists(manifest_rel(name, tag)):
        raise ConfigError(f"checkpoint {name}:{tag} already exists (tags are immutable; pick another tag)")
    return tag


def _transfer(
    job: _Striper, files: list[tuple[str, Origin, int]], workers: int, progress: Progress | None
) -> tuple[list[str], list[str]]:
    """Both passes on one pool: (file digests, stripe digests) once every stripe is on its target.

    The "hash" phase counts the checkpoint's bytes once, as the stripes' pass reads them: a 1.5 GB
    checkpoint shows 1.5 GB, the figure a user compares with `du`. The files' own digests read the
    same bytes alongside (from the page cache); the phase ends when both passes are done.
    """
    total = job.source.total
    with ThreadPoolExecutor(workers, thread_name_prefix="ckpt-push") as pool:
        adv = _phase(progress, "hash", total)
        file_futs = [pool.submit(_file_digest, p) for _, p, _ in files]
        stripe_futs = [pool.submit(job.hash_stripe, s, adv) for s in range(job.k)]
        file_digests = [f.result() for f in file_futs]
        digests = [f.result() for f in stripe_futs]
        adv = _phase(progress, "upload", total)
        for f in [pool.submit(job.upload_stripe, s, digests[s], adv) for s in range(job.k)]:
            f.result()
    return file_digests, digests


def push(
    store: Store,
    src: Path,
    name: str,
    tag: str | None = None,
    *,
    stripes: int = 4,
    cell_size: int = 1 << 20,
    targets: list[Store] | None = None,
    threads: int = 0,
    progress: Progress | None = None,
) -> Manifest:
    """Store `src` as NAME:TAG with `stripes` stripes dealt over `targets` (default: the store itself).

    `progress(phase, total)` may return an `advance(n)` callback per phase ("hash", "upload").
    """
    found, dirs = scan(src.resolve())
    files: list[tuple[str, Origin, int]] = list(found)  # local files only: a push_files without `lower`
    return push_files(
        store,
        files,
        dirs,
        name,
        tag,
        stripes=stripes,
        cell_size=cell_size,
        targets=targets,
        threads=threads,
        progress=progress,
    )


def push_files(
    store: Store,
    files: list[tuple[str, Origin, int]],
    dirs: list[str],
    name: str,
    tag: str | None = None,
    *,
    stripes: int = 4,
    cell_size: int = 1 << 20,
    targets: list[Store] | None = None,
    threads: int = 0,
    progress: Progress | None = None,
    lower: Reader | None = None,
) -> Manifest:
    """`push` of a listed view: `files` sorted by path, each a local file or a parent's entry (`lower`)."""
    tag = _check_args(store, name, tag, stripes, cell_size)
    source = _Source(files, lower)
    job = _Striper(source, cell_size, stripes, targets or [store])
    try:
        file_digests, digests = _transfer(job, files, threads or min(32, max(4, stripes)), progress)
        mtimes = [source.mtime_ns(i) for i in range(len(files))]
    except OSError as e:
        raise StoreError(f"push {name}:{tag}: {e}") from None
    finally:
        source.close()
    entries = [
        FileEntry(rel, off, size, d, t)
        for (rel, _, size), off, d, t in zip(files, source.starts, file_digests, mtimes, strict=True)
    ]
    refs = [
        StripeRef("" if job.target_of(s) is store else public_uri(job.target_of(s).uri), digests[s], job.size_of(s))
        for s in range(stripes)
    ]
    m = Manifest(name, tag, cell_size, refs, entries, job.cells, dirs, created=time.time())
    store.put_doc(manifest_rel(name, tag), m.to_doc())  # signed: a manifest names what a job reads as weights
    write_latest(store, name, tag, m.created)
    return m
