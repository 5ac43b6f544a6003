"""The node-local blob cache: verified blobs by digest, bounded in size, least recently used out first.

A restart on the same node then costs no transfer at all. Recency is the file's mtime, touched on
every hit, so the cache needs no index file that could be torn by a crash.

Every hit is verified (sha256) before it is returned: a hit whose bytes fail is dropped, and the
caller fetches it again from its next source (swarm, store), so a corrupt entry costs one refetch
instead of failing every later start. Hashing on hit, rather than trusting a "verified" marker keyed
by inode, size and mtime, because the failure this guards against (a flipped byte on disk, a stray
write that keeps the size) changes none of those, and mtime is rewritten on every hit anyway. The
cost is one sequential read of the blob, which also warms the page cache for the reader that comes
next; that is far cheaper than a start that fails, or runs without its checkpoint, on a wrong byte.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .digests import sha256_file
from .settings import StoreSettings
from .store import Store, blob_path

if TYPE_CHECKING:
    pass


def _touch(p: Path) -> None:
    """Recency with the clock's full resolution (the kernel's file times are coarse, ~4 ms)."""
    now = time.time()
    os.utime(p, (now, now))


def _link_stored(store: Store, src: Path, digest: str, dest: Path) -> bool:
    """Replace `src` by a hard link to the store's copy of the blob at `dest`; False when not possible."""
    stored = Path(store.path(blob_path(digest)))
    tmp = dest.with_name(f".{dest.name}.link-{os.getpid()}-{time.monotonic_ns()}")
    try:
        if stored.stat().st_size != src.stat().st_size:
            return False
        os.link(stored, tmp)
        os.replace(tmp, dest)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    src.unlink(missing_ok=True)
    return True


class BlobCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def path(self, digest: str) -> Path:
        return self.root / blob_path(digest).removeprefix("blobs/")

    def get(self, digest: str) -> Path | None:
        """The cached file, verified and its recency refreshed; None on a miss or a corrupt entry."""
        p = self.path(digest)
        try:
            _touch(p)
            before = p.stat()
            if sha256_file(p) == digest:
                return p
        except FileNotFoundError:
            return None
        self._drop(p, before.st_ino, digest)
        return None

    def peek(self, digest: str) -> Path | None:
        """The cached file, its recency refreshed, *not* verified: for a reader that hashes it while it
        reads (the env restore) and calls `drop` when the digest does not match."""
        p = self.path(digest)
        try:
            _touch(p)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return p

    def drop(self, p: Path, ino: int, digest: str) -> None:
        """Remove an entry that failed its digest (unless a good copy replaced it meanwhile), loudly."""
        self._drop(p, ino, digest)

    @staticmethod
    def _drop(p: Path, ino: int, digest: str) -> None:
        """Remove a corrupt entry, unless a good copy replaced it (another inode) while it was hashed."""
        import sys

        with contextlib.suppress(FileNotFoundError):
            if p.stat().st_ino == ino:
                p.unlink()
        print(
            f"bootseer: warning: cached blob {digest[:12]} failed its sha256 check; dropped, fetching it again",
            file=sys.stderr,
            flush=True,
        )

    def fetch(self, store: Store, digest: str, progress: Callable[[int], None] | None = None) -> tuple[Path, int]:
        """The blob from the cache, else from the store (verified). Returns (path, bytes transferred)."""
        hit = self.get(digest)
        if hit is not None:
            return hit, 0
        dest = self.path(digest)
        n = store.fetch_blob(digest, dest, progress=progress, link=True)  # one copy with a local store
        _touch(dest)
        self.evict(keep=digest)
        return dest, n

    def adopt(self, src: Path, digest: str, store: Store | None = None) -> Path:
        """Move a file already known to match `digest` into the cache (e.g. a freshly built snapshot).

        When `store` is local and already holds the blob (it was just uploaded), the cache links the
        stored copy instead and `src` goes, so the node keeps one copy on disk, not two.
        """
        dest = self.path(digest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not (store is not None and store.is_local and _link_stored(store, src, digest, dest)):
            os.replace(src, dest)
        _touch(dest)
        self.evict(keep=digest)
        return dest

    def entries(self) -> list[tuple[float, int, Path]]:
        out = []
        if not self.root.exists():
            return out
        for p in self.root.glob("sha256/*/*"):
            if p.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                out.append((st.st_mtime, st.st_size, p))
        return out

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def linked(self) -> tuple[int, int]:
        """(count, bytes) of the entries that are hard links shared with the local store: no extra disk."""
        n = size = 0
        for _, s, p in self.entries():
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_nlink > 1:
                    n, size = n + 1, size + s
        return n, size

    def evict(self, keep: str | None = None) -> int:
        """Remove least recently used blobs until the cache fits; returns bytes freed."""
        entries = sorted(self.entries())
        total = sum(size for _, size, _ in entries)
        freed = 0
        for _, size, p in entries:
            if total <= self.max_bytes:
                break
            if keep and p.name == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                total -= size
                freed += size
        return freed


def cache_for(settings: StoreSettings, degrade: bool = True) -> BlobCache:
    """The node cache the store settings name (default: under the platformdirs user cache).

    With `degrade`, a cache directory that is read-only or full is replaced, for this process, by a
    private scratch directory (`nodedirs`, one warning): a start then runs without the node cache
    instead of failing in every stage that touches it. `doctor` asks for the configured one as it is."""
    from .paths import blob_cache_dir

    root = settings.cache_dir or blob_cache_dir()
    if degrade:
        from .nodedirs import usable_or_scratch

        root = usable_or_scratch(root, "blobs") or root
    return BlobCache(root, settings.cache_max_bytes)
