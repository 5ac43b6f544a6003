"""Getting a blob onto this node: node cache → swarm (when [p2p] is enabled) → store.

Every capability that needs a whole blob (env snapshots, hot-block packs, checkpoint stripes in
`pull` mode) calls `fetch_blob`, so the order of sources, the verification and the accounting of
where the bytes came from live in one place.

Whoever needs the blob's digest checked gets it through `fetch_verified`; a streamed env restore
opens it once with `open_blob` (the node cache's file, a local store's file in place, or a download
hashed on the way, into the cache) and checks it while it extracts (`Verifier`, `DigestMismatch`).

This module stays cheap to import: `launch` calls `handoff` on every `exec` that ran stages, and
libtorrent is loaded only once `fetch_blob` actually goes to the swarm.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import BootseerError, IntegrityError, fork_deaf_to_interrupts
from .redact import warn

if TYPE_CHECKING:
    import hashlib

    from .p2p.seed import SeedTask
    from .settings import P2PSettings
    from .store.cache import BlobCache
    from .store.core import Store

# What stops the swarm leg without being a bug: a store error while joining, libtorrent's own errors
# (RuntimeError), a socket or file error, a torrent that cannot be made (ValueError: an empty blob),
# a libtorrent that does not load. Each means "fetch this blob from the store instead".
_SWARM_FAILURES = (BootseerError, OSError, RuntimeError, ValueError, ImportError)

# Set once `fetch_blob` has entered the swarm in this process: `handoff` then has a session to stop
# and blobs to hand to the agent. A fact recorded here, rather than guessed from what was imported.
_swarm_used = threading.Event()


@dataclass
class Fetched:
    """A blob on this node: its file, and where its bytes came from (the stage reports reads it)."""

    path: Path
    source: str  # "cache" | "peers" | "store"
    bytes_from_store: int = 0
    bytes_from_peers: int = 0
    note: str = ""  # e.g. why the swarm was not used


def fetch_blob(
    p2p: P2PSettings,
    store: Store,
    digest: str,
    progress: Callable[[int], None] | None = None,
    *,
    cache: BlobCache,
) -> Fetched:
    """The verified blob as a file in the node cache.

    With `[p2p] enabled`, a cache miss goes to the job's swarm first (the store serving about one
    copy to the whole job); anything that stops the swarm (no torrent for this blob, libtorrent
    cannot listen, a store error while joining) falls back to the store, with the reason in `note`.
    """
    hit = cache.get(digest)
    if hit is not None:
        return Fetched(hit, "cache")
    note = ""
    if p2p.enabled:
        from .p2p.fetch import NoSwarm, fetch_from_swarm

        _swarm_used.set()
        try:
            r = fetch_from_swarm(p2p, store, digest, cache, progress=progress)
            source = "peers" if r.bytes_from_peers > 0 else "store"
            return Fetched(r.path, source, r.bytes_from_store, r.bytes_from_peers, r.note)
        except NoSwarm as e:
            note = f"swarm not used: {e}"
        except _SWARM_FAILURES as e:  # the swarm is an optimisation: it never stops a fetch
            note = f"swarm failed ({e or type(e).__name__}); fetched from the store"
            warn(f"blob {digest[:12]}: {note}")
    path, n = cache.fetch(store, digest, progress=progress)
    return Fetched(path, "store", bytes_from_store=n, note=note)


def after_publish(p2p: P2PSettings, store: Store, digest: str, path: Path) -> dict[str, Any]:
    """Called by whoever publishes a blob that many nodes will fetch (a snapshot, a stripe).

    Returns extra fields for the ref that names the blob: with [p2p] enabled, the digest of the
    blob's torrent, which is also stored as a blob and named by `refs/torrent/<digest>.json` so
    that `fetch_blob` finds the swarm from the blob's digest alone. Nothing to add without P2P; a
    failure to make the torrent only means this blob travels from the store.
    """
    if not p2p.enabled:
        return {}
    try:
        from .p2p.publish import publish_torrent

        return {"torrent": publish_torrent(store, digest, path)}
    except _SWARM_FAILURES as e:
        warn(f"no torrent for blob {digest[:12]} (it will be fetched from the store): {e}")
        return {}


# ---- one blob, verified: for a reader of the whole file, and opened once for a streamed restore --------


def fetch_verified(
    p2p: P2PSettings, store: Store, cache: BlobCache, digest: str, size: int | None, progress: bool | None = None
) -> Fetched:
    """The blob on local disk, its digest checked (a cached copy is re-checked; a bad one refetched)."""
    from .digests import sha256_file
    from .progress import byte_bar

    for attempt in range(2):
        with byte_bar(size, "download", enabled=progress) as advance:
            fetched = fetch_blob(p2p, store, digest, progress=advance, cache=cache)
        if fetched.source == "store" or sha256_file(fetched.path) == digest:
            return fetched
        Path(fetched.path).unlink(missing_ok=True)  # a corrupt cached copy: drop it, fetch again
        if attempt:
            break
    raise IntegrityError(f"blob {digest[:12]} does not match its digest")


def _fetch_or_drop(
    p2p: P2PSettings, store: Store, cache: BlobCache, digest: str, size: int | None, progress: bool | None
) -> Fetched:
    """fetch_verified; a blob the store holds corrupt is deleted there, so the next capture replaces it."""
    try:
        return fetch_verified(p2p, store, cache, digest, size, progress)
    except IntegrityError:
        with contextlib.suppress(BootseerError, OSError):
            store.delete_blob(digest)
        raise


class DigestMismatch(IntegrityError):
    """The blob read during a streamed restore does not match its digest (the tree was undone)."""


def _hash_fd(h: hashlib._Hash, fd: int) -> None:
    """Feed the whole file at `fd` to `h`: through a read-only mapping (no copy of the blob into a
    buffer: ~45 ms of CPU for a 200 MB blob), or by reads where the file cannot be mapped."""
    import mmap

    size = os.fstat(fd).st_size
    try:
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
    except (OSError, ValueError):
        m = None
    if m is not None:
        with m, memoryview(m) as view:
            m.madvise(mmap.MADV_SEQUENTIAL)  # read ahead of the hash, and into the workers' page cache
            h.update(view)
        return
    off = 0
    while chunk := os.pread(fd, 4 << 20, off):
        h.update(chunk)
        off += len(chunk)


class Verifier:
    """Hashes a local blob through an open descriptor in a forked child, while the restore reads the same
    descriptor: its metadata, its plan, then the extraction's workers.

    Started once the metadata's bytes are read (`start`), the hash runs on a core the restore's serial
    first steps (decoding the metadata, the plan) leave idle, and it reads the blob into the page cache
    ahead of the workers; the extraction asks for the result before it commits. A process rather than a
    thread: no GIL to share with the plan, and no thread in this process while the workers are forked.
    `Download` keeps a thread.
    """

    def __init__(self, fd: int, digest: str) -> None:
        self.fd = fd
        self.digest = digest
        self.got = ""
        self.error = ""
        self._pid = 0
        self._r = -1
        self._done = False

    def start(self) -> None:
        """Begin hashing (idempotent): the restore calls it once the metadata's bytes are read."""
        if self._pid or self._done:
            return
        import hashlib

        h = hashlib.sha256()  # made here, so the child takes no lock another thread of this one may hold
        r, w = os.pipe()
        pid = fork_deaf_to_interrupts()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                os.close(r)
                _hash_fd(h, self.fd)
                os.write(w, h.hexdigest().encode())
            except BaseException as e:  # reported as the error: a read that failed is no match
                with contextlib.suppress(BaseException):
                    os.write(w, b"!" + str(e).encode("utf-8", "replace")[:300])
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self._pid, self._r = pid, r

    def _wait(self) -> None:
        if self._done:
            return
        self.start()
        parts = []
        try:
            while piece := os.read(self._r, 4096):
                parts.append(piece)
        finally:
            self._done = True
            os.close(self._r)
            with contextlib.suppress(ChildProcessError):  # reaped already (an interrupted restore stops its children)
                os.waitpid(self._pid, 0)
        out = b"".join(parts)
        if out.startswith(b"!"):
            self.error = out[1:].decode("utf-8", "replace")
        elif len(out) == 64:
            self.got = out.decode()
        else:
            self.error = "the hashing process died"

    def ok(self) -> bool:
        """Whether the blob matched its digest, once the hash is done (waits for it)."""
        self._wait()
        return not self.error and self.got == self.digest

    def check(self) -> None:
        """Raise DigestMismatch unless the blob matched: the extraction calls it before its commit."""
        if not self.ok():
            raise DigestMismatch(
                f"blob {self.digest[:12]} does not match its digest{': ' + self.error if self.error else ''}"
            )

    def close(self) -> None:
        """Stop and reap a hash still running (a restore that ended before it asked for the result)."""
        if self._pid and not self._done:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self._wait()


class _Threaded(Verifier):
    """The hash in a thread of this process (a download hashes what it writes, as it writes it)."""

    def __init__(self, fd: int, digest: str) -> None:
        super().__init__(fd, digest)
        self._t = threading.Thread(target=self._run, name="bootseer-verify", daemon=True)

    def start(self) -> None:
        if self._t.ident is None:
            self._t.start()

    def _run(self) -> None:
        raise NotImplementedError

    def _wait(self) -> None:
        self.start()  # an extraction that failed before its workers ran never started it
        self._t.join()

    def close(self) -> None:
        pass


class Download(_Threaded):
    """A remote blob downloaded into a temporary file of the node cache, in order and hashed on the way,
    while the extraction reads the frames that have arrived (`extract(arriving=True)`); the metadata is
    read first from the blob's end by a ranged read. Renamed into the cache once restored and matched.
    A failed download pads the file to its full size, so waiting workers go on, fail and are undone."""

    def __init__(self, store: Store, cache: BlobCache, digest: str) -> None:
        from .store.core import blob_path

        self.store = store
        self.dest = cache.path(digest)
        # ranged reads: the size and the metadata at the end; each waited for at most STALL_S (store.guard)
        src = store.open_ranged(blob_path(digest), f"blob {digest[:12]}")
        self.size = src.size()
        self.tail: tuple[Callable[[int, int], bytes], int] = (lambda n, off: bytes(src.read_at(n, off)), self.size)
        self._dfd = -1
        why = bypass_reason(cache, self.size)
        if why:  # straight into the roots: through a file with no name, gone once the restore ends
            self.dest, self._w = unnamed_file(self.size)
            if why != NOT_KEPT:
                warn(f"{why}: restoring blob {digest[:12]} from the store straight into the roots (not cached)")
            super().__init__(os.dup(self._w), digest)
            self.start()
            return
        # The part file lives in the fan-out directory, entered no-follow: created, renamed and removed
        # by name in that descriptor (a user's `sha256/86 -> /etc` is refused, never written through).
        self._dfd = cache.dir_fd(digest)
        self.part = f".{self.dest.name}.part-{os.urandom(4).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self._w = os.open(self.part, flags, 0o600, dir_fd=self._dfd)
            rfd = os.open(self.part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dfd)
        except BaseException:
            os.close(self._dfd)
            raise
        super().__init__(rfd, digest)
        self.start()  # the fetch itself: it runs from the start, beside everything else

    def _run(self) -> None:
        import hashlib

        from .store.core import blob_path

        h = hashlib.sha256()
        n = 0
        try:
            with self.store.read_chunks(blob_path(self.digest), 4 << 20, f"blob {self.digest[:12]}") as src:
                for chunk in src:
                    h.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(self._w, view) :]
                    n += len(chunk)
            self.got = h.hexdigest()
        except Exception as e:  # reported by check(): a fetch failure, not a corrupt blob
            self.error = f"{type(e).__name__}: {e}"[:300]
        finally:
            if self.error or n < self.size:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._w, max(n, self.size))
            os.close(self._w)

    def check(self) -> None:
        """A failed download is a StoreError (the store's fault, not the blob's); then the digest check."""
        if not self.ok() and self.error:
            from .errors import StoreError

            raise StoreError(f"store {self.store.uri}: cannot download blob {self.digest[:12]}: {self.error}")
        super().check()

    def keep(self, cache: BlobCache) -> None:
        """The restore used it: rename it into the node cache, where later restores find it (unless it
        went through an unnamed file: `bypass_reason`)."""
        if self._dfd < 0:
            return
        os.replace(self.part, self.dest.name, src_dir_fd=self._dfd, dst_dir_fd=self._dfd)
        cache.evict(keep=self.digest)

    def discard(self) -> None:
        """Remove the partial file of a download not kept (a no-op once kept), and let go of its directory."""
        if self._dfd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.part, dir_fd=self._dfd)
        os.close(self._dfd)
        self._dfd = -1


NOT_KEPT = "the node cache keeps nothing on this node"  # a scratch stand-in: nodedirs warned already


def bypass_reason(cache: BlobCache, size: int | None) -> str:
    """Why a blob of `size` bytes goes straight into the roots rather than through the node cache ("" when
    it fits). Checked before the download: a cache disk smaller than the snapshot was filled to the brim,
    the download failed, and the setup ran on every start (issue 46)."""
    from .nodedirs import FULL_BELOW_BYTES
    from .units import fmt_bytes

    if not cache.keeps:
        return NOT_KEPT
    free = free_bytes(cache.root)
    if size is None or free is None or size + FULL_BELOW_BYTES <= free:
        return ""
    return f"the node cache {cache.root} has {fmt_bytes(free)} free, too little for a {fmt_bytes(size)} snapshot"


def free_bytes(directory: Path) -> int | None:
    """Free space for this user on the filesystem of `directory` (its nearest existing parent)."""
    d = directory
    while not d.exists() and d != d.parent:
        d = d.parent
    try:
        st = os.statvfs(d)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def unnamed_file(size: int) -> tuple[Path, int]:
    """A file with no name (O_TMPFILE, else created and unlinked at once) on the first temporary
    filesystem with room for `size` bytes: nothing of it outlives this process, however it ends."""
    import tempfile

    from .errors import NoSpace
    from .nodedirs import FULL_BELOW_BYTES
    from .units import fmt_bytes

    for d in dict.fromkeys((tempfile.gettempdir(), "/var/tmp", "/dev/shm")):
        free = free_bytes(Path(d))
        if free is None or free < size + FULL_BELOW_BYTES:
            continue
        try:
            return Path(d), os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError:
            with contextlib.suppress(OSError):
                fd, name = tempfile.mkstemp(prefix="bootseer-blob-", dir=d)
                os.unlink(name)
                return Path(d), fd
    raise NoSpace(f"no temporary directory has room for a {fmt_bytes(size)} snapshot streamed from the store")


@dataclass
class Blob:
    """An open blob for one restore attempt: where it came from and, when unverified, its hasher."""

    fd: int
    fetched: Fetched
    verifier: Verifier | None  # None: the fetch already checked the digest
    store_path: Path | None = None  # read in place from a local store: link it into the cache after

    def close(self) -> None:
        """Close the descriptor; a download never kept is removed with it."""
        if isinstance(self.verifier, Download):
            self.verifier.discard()  # a no-op once kept
        elif self.verifier is not None:
            self.verifier.close()
        os.close(self.fd)


def open_blob(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    digest: str,
    size: int | None,
    progress: bool | None,
    *,
    cached: bool,
) -> Blob:
    """The blob to restore from, opened once, with no copy made: the node cache's file (`cached`), the
    local store's file in place, or else a fetch (swarm, remote store) into the cache, hashed on the way."""
    from .errors import BlobMissing
    from .store.core import blob_path

    hit = cache.peek(digest) if cached else None
    if hit is not None:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(hit, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            return Blob(fd, Fetched(hit, "cache"), Verifier(fd, digest))
    if store.is_local and not p2p.enabled:
        path = Path(store.path(blob_path(digest)))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BlobMissing(f"store {store.uri}: blob {digest[:12]} not found") from None
        n = os.fstat(fd).st_size
        return Blob(fd, Fetched(path, "store", bytes_from_store=n), Verifier(fd, digest), store_path=path)
    if not p2p.enabled or bypass_reason(cache, size):  # a remote store: fetch, hash, decompress, write overlapped
        d = Download(store, cache, digest)
        return Blob(d.fd, Fetched(d.dest, "store", bytes_from_store=d.size), d)
    fetched = _fetch_or_drop(p2p, store, cache, digest, size, progress)
    return Blob(os.open(fetched.path, os.O_RDONLY | os.O_CLOEXEC), fetched, None)


def link_into_cache(cache: BlobCache, b: Blob, digest: str) -> None:
    """After a verified in-place restore: the node cache gets a hard link to the store's blob (one copy
    on disk), if it is still the file that was read; across filesystems the store stays the only copy."""
    if b.store_path is None or not cache.keeps:
        return
    dest = cache.path(digest)
    tmp = f".{dest.name}.link-{os.urandom(4).hex()}"
    try:
        dfd = cache.dir_fd(digest)  # no-follow: a linked fan-out directory is refused, not written through
    except (OSError, BootseerError):
        return
    try:
        os.link(b.store_path, tmp, dst_dir_fd=dfd, follow_symlinks=False)
        if os.stat(tmp, dir_fd=dfd, follow_symlinks=False).st_ino == os.fstat(b.fd).st_ino:
            os.replace(tmp, dest.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            cache.evict(keep=digest)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        os.close(dfd)


HANDOFF_LINGER_S = 5.0


def handoff(cap_s: float | None = HANDOFF_LINGER_S) -> list[SeedTask]:
    """Before `exec`: stop this process's swarm (after serving the peers still downloading from it, a
    few seconds at most: the agent serves them again right after) and return the agent tasks that keep
    seeding the fetched blobs. `cap_s=None` lingers up to `[p2p] deadline_s`. No-op without P2P (and
    then libtorrent is never imported)."""
    if not _swarm_used.is_set():
        return []
    _swarm_used.clear()
    from .p2p.fetch import shutdown
    from .p2p.seed import SeedTask

    return [SeedTask(blobs=spec["blobs"], fetches=spec["fetches"]) for spec in shutdown(cap_s)]
