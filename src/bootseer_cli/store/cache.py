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
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .cachedir import (
    UnsafeCacheDir,
    open_parent,
    open_regular,
    open_root,
    open_sub,
    parent_fd,
    sha256_fd,
    unlink_at,
)

if TYPE_CHECKING:
    from ..settings import StoreSettings
    from .core import Store

FANOUT = "sha256"


def _touch(name: str, dfd: int) -> None:
    """Recency with the clock's full resolution (the kernel's file times are coarse, ~4 ms); the
    entry `name` in `dfd`, never a link's target."""
    now = time.time()
    os.utime(name, (now, now), dir_fd=dfd, follow_symlinks=False)


def _link_stored(store: Store, src: Path, digest: str, dfd: int, name: str) -> bool:
    """Replace `src` by a hard link to the store's copy of the blob at `name` in `dfd`; False when
    not possible."""
    from .core import blob_path

    stored = Path(store.path(blob_path(digest)))
    tmp = f".{name}.link-{os.getpid()}-{time.monotonic_ns()}"
    try:
        if stored.stat().st_size != src.stat().st_size:
            return False
        os.link(stored, tmp, dst_dir_fd=dfd, follow_symlinks=False)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        unlink_at(tmp, dfd)
        return False
    src.unlink(missing_ok=True)
    return True


class BlobCache:
    def __init__(self, root: Path, max_bytes: int, keeps: bool = True) -> None:
        self.root = root
        self.max_bytes = max_bytes
        # False for a scratch directory standing in for a read-only or full node cache: what lands there
        # is gone after the job, so a restore streams its snapshot from the store instead (delivery.py)
        self.keeps = keeps

    def path(self, digest: str) -> Path:
        # the store's module is imported here, not with this one: a capture (which only needs
        # `root`) then does not load it, its transports and its trust (~25 ms before its first read)
        from .core import blob_path

        return self.root / blob_path(digest).removeprefix("blobs/")

    def get(self, digest: str) -> Path | None:
        """The cached file, verified and its recency refreshed; None on a miss or a corrupt entry (or
        one below a directory that is a link or someone else's: `cachedir`)."""
        p = self.path(digest)
        try:
            with parent_fd(p, self.root, create=False) as dfd:
                fd = open_regular(p.name, dfd)
                try:
                    _touch(p.name, dfd)
                    ino = os.fstat(fd).st_ino
                    if sha256_fd(fd) == digest:
                        return p
                finally:
                    os.close(fd)
                self._drop_at(dfd, p.name, ino, digest)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UnsafeCacheDir as e:
            _warn(str(e))
            return None
        return None

    def peek(self, digest: str) -> Path | None:
        """The cached file, its recency refreshed, *not* verified: for a reader that hashes it while it
        reads (the env restore) and calls `drop` when the digest does not match."""
        p = self.path(digest)
        try:
            with parent_fd(p, self.root, create=False) as dfd:
                os.close(open_regular(p.name, dfd))
                _touch(p.name, dfd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UnsafeCacheDir as e:
            _warn(str(e))
            return None
        return p

    def drop(self, p: Path, ino: int, digest: str) -> None:
        """Remove an entry that failed its digest (unless a good copy replaced it meanwhile), loudly."""
        try:
            with parent_fd(p, self.root, create=False) as dfd:
                self._drop_at(dfd, p.name, ino, digest)
        except (OSError, UnsafeCacheDir):
            pass

    @staticmethod
    def _drop_at(dfd: int, name: str, ino: int, digest: str) -> None:
        """Remove a corrupt entry, unless a good copy replaced it (another inode) while it was hashed."""
        with contextlib.suppress(FileNotFoundError):
            if os.stat(name, dir_fd=dfd, follow_symlinks=False).st_ino == ino:
                os.unlink(name, dir_fd=dfd)
        _warn(f"cached blob {digest[:12]} failed its sha256 check; dropped, fetching it again")

    def fetch(self, store: Store, digest: str, progress: Callable[[int], None] | None = None) -> tuple[Path, int]:
        """The blob from the cache, else from the store (verified). Returns (path, bytes transferred)."""
        hit = self.get(digest)
        if hit is not None:
            return hit, 0
        dest = self.path(digest)
        n = store.fetch_blob(digest, dest, progress=progress, link=True, base=self.root)  # one copy, local store
        with contextlib.suppress(OSError), parent_fd(dest, self.root, create=False) as dfd:
            _touch(dest.name, dfd)
        self.evict(keep=digest)
        return dest, n

    def adopt(self, src: Path, digest: str, store: Store | None = None) -> Path:
        """Move a file already known to match `digest` into the cache (e.g. a freshly built snapshot).

        When `store` is local and already holds the blob (it was just uploaded), the cache links the
        stored copy instead and `src` goes, so the node keeps one copy on disk, not two.
        """
        dest = self.path(digest)
        with parent_fd(dest, self.root) as dfd:
            if not (store is not None and store.is_local and _link_stored(store, src, digest, dfd, dest.name)):
                os.replace(src, dest.name, dst_dir_fd=dfd)
            _touch(dest.name, dfd)
        self.evict(keep=digest)
        return dest

    def adopt_at(self, dfd: int, tmp: str, digest: str) -> Path:
        """Rename our temporary `tmp` in `dfd` (the fan-out directory from `dir_fd(digest)`) into place as
        `digest`: a writer that made its copy there by descriptor never names the cache by path."""
        dest = self.path(digest)
        os.replace(tmp, dest.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        _touch(dest.name, dfd)
        self.evict(keep=digest)
        return dest

    def dir_fd(self, digest: str) -> int:
        """A descriptor of `digest`'s fan-out directory, made when missing, entered no-follow and
        checked as the acting uid's (`cachedir`): for a writer that acts by name in it. The caller
        closes it. UnsafeCacheDir (a StoreError) when a component is a link or someone else's."""
        return open_parent(self.path(digest), self.root)

    def _fanout(self) -> Iterator[tuple[str, int]]:
        """(name, descriptor) of each fan-out directory, entered no-follow; a link or another user's
        directory is skipped (once, with a warning), never entered."""
        try:
            rfd = open_root(self.root, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            try:
                top = open_sub(rfd, FANOUT, str(self.root / FANOUT), create=False)
            except FileNotFoundError:
                return
            except UnsafeCacheDir as e:
                _warn(str(e))
                return
            try:
                for sub in sorted(os.listdir(top)):
                    try:
                        fd = open_sub(top, sub, str(self.root / FANOUT / sub), create=False)
                    except (FileNotFoundError, NotADirectoryError):
                        continue
                    except UnsafeCacheDir as e:
                        _warn(str(e))
                        continue
                    try:
                        yield sub, fd
                    finally:
                        os.close(fd)
            finally:
                os.close(top)
        finally:
            os.close(rfd)

    def entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every cached blob: regular files in real fan-out directories."""
        out = []
        for sub, fd in self._fanout():
            for name in os.listdir(fd):
                if name.startswith("."):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        out.append((st.st_mtime, st.st_size, self.root / FANOUT / sub / name))
        return out

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def linked(self) -> tuple[int, int]:
        """(count, bytes) of the entries that are hard links shared with the local store: no extra disk."""
        n = size = 0
        for _sub, fd in self._fanout():
            for name in os.listdir(fd):
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not name.startswith(".") and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                        n, size = n + 1, size + st.st_size
        return n, size

    def evict(self, keep: str | None = None) -> int:
        """Remove least recently used blobs until the cache fits; returns the bytes freed on disk (an
        entry hard-linked with the local store counts toward the bound but frees nothing). Each unlink is
        by name in its fan-out directory, entered no-follow again: a directory swapped for a link
        since the listing is refused, not followed."""
        entries = sorted(self.entries())
        total = sum(size for _, size, _ in entries)
        freed = 0
        fds: dict[str, int] = {}  # each fan-out directory entered once per eviction
        try:
            for _, size, p in entries:
                if total <= self.max_bytes:
                    break
                if keep and p.name == keep:
                    continue
                with contextlib.suppress(FileNotFoundError, NotADirectoryError, UnsafeCacheDir):
                    dfd = fds.get(p.parent.name)
                    if dfd is None:
                        dfd = fds[p.parent.name] = open_parent(p, self.root, create=False)
                    st = os.stat(p.name, dir_fd=dfd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    os.unlink(p.name, dir_fd=dfd)
                    total -= size
                    freed += size if st.st_nlink == 1 else 0  # a link shared with the store frees no disk
        finally:
            for dfd in fds.values():
                os.close(dfd)
        return freed


def _warn(msg: str) -> None:
    from ..redact import warn

    warn(msg)


def cache_for(settings: StoreSettings, degrade: bool = True) -> BlobCache:
    """The node cache the store settings name (default: under the platformdirs user cache).

    With `degrade`, a cache directory that is read-only or full is replaced, for this process, by a
    private scratch directory (`nodedirs`, one warning): a start then runs without the node cache
    instead of failing in every stage that touches it. `doctor` asks for the configured one as it is."""
    from ..paths import blob_cache_dir

    root = settings.cache_dir or blob_cache_dir()
    if not degrade:
        return BlobCache(root, settings.cache_max_bytes)
    from ..nodedirs import usable_or_scratch, why_unusable
    from ..paths import configured_cache_root

    keeps = not why_unusable(settings.cache_dir or configured_cache_root() / "blobs")
    return BlobCache(usable_or_scratch(root, "blobs") or root, settings.cache_max_bytes, keeps=keeps)
