"""Capture, publish and restore environment snapshots; the single-flight lease keeper.

The library behind both `bootseer exec` (stage.py) and the `snapshot`/`restore` verbs:

- `capture()` diffs the roots against a baseline, refuses what another node could not use
  (editable installs pointing outside the roots, files still open for writing), warns about what
  the setup changed outside the roots, and writes the blob into the node cache;
- `publish()` uploads it and writes `refs/env/<env_key>.json` last;
- `restore()` opens the blob once where it lies (the node cache's file, a local store's file in
  place, else a fetch: swarm → store), extracts it all-or-nothing while a thread hashes the same
  descriptor, checks the digest before the commit (a mismatch undoes the tree), stamps.

The roots and the setup are `setup.py`, stamps `stamp.py`, the blob `format.py` and `extract.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..delivery import Fetched
from ..errors import BootseerError, IntegrityError
from .format import ArchiveEntry, ArchiveWriter, Meta, Written
from .manifest import FILE, Manifest, under
from .setup import excluded_paths
from .stamp import remove_stamp, switch_deletions, write_stamp

if TYPE_CHECKING:
    from ..cache import BlobCache
    from ..settings import P2PSettings, StoreSettings
    from ..store import Lease, Store

REF_KIND = "env"
FORMAT = 1
# Written by the container runtime (Docker, Podman, the kubelet) when it creates the container, a
# moment before the setup starts: not the setup's changes, and no other node wants this node's copy.
RUNTIME_MANAGED = frozenset(("/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/etc/mtab", "/etc/.pwd.lock"))


def lease_key(env_key: str) -> str:
    return f"env-{env_key}"


class LeaseKeeper:
    """Renews a single-flight lease in the background while a long setup runs.

    A renewal happens only while the lease is still ours (`Store.renew_lease` compares first): once
    it finds another owner, which took the lease over after ours expired (a stalled node), the keeper
    stops, sets `lost`, and never overwrites the new owner's lease; the release at the end is then
    a no-op. The work goes on (the snapshot it publishes is content-addressed, so a duplicate is
    harmless), but the single flight is over, which `lost` tells.
    """

    def __init__(self, lease: Lease, ttl_s: float, on_renew: Callable[[], None] | None = None) -> None:
        self.lease = lease
        self.ttl_s = ttl_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._on_renew = on_renew
        self._handed_over = False
        self._t = threading.Thread(target=self._run, name="bootseer-lease", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            with contextlib.suppress(BootseerError, OSError, ValueError):  # a missed renewal: try again later
                if not self.lease.renew(self.ttl_s):
                    self.lost.set()
                    return
                if self._on_renew is not None:
                    self._on_renew()

    def hand_over(self) -> None:
        """Keep renewing past the `with` block, and never release: another process takes the lease on.

        Call `stop_renewing` (before exec) when that process is about to take over."""
        self._handed_over = True

    def stop_renewing(self) -> None:
        """Stop the renewals and wait for one in flight (an exec part way through a local renewal would
        leave the lease file moved aside, i.e. free), then renew once more: the lease's full TTL for
        the next holder to start renewing it. The lease is not released."""
        self._stop.set()
        self._t.join(10.0)
        with contextlib.suppress(BootseerError, OSError, ValueError):  # it still holds until its expiry
            if not self.lease.lost and not self.lease.renew(self.ttl_s):
                self.lost.set()

    def __enter__(self) -> LeaseKeeper:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop renewing and release, waiting a few seconds at most: the ref is written before this,
        so a slow store only delays the lease's expiry for others, never their restore. A keeper
        handed over (`hand_over`) goes on renewing until `stop_renewing`, and releases nothing."""
        if self._handed_over:
            return
        self._stop.set()

        def release() -> None:
            with contextlib.suppress(BootseerError, OSError, ValueError):  # it expires by itself
                self.lease.release()

        t = threading.Thread(target=release, name="bootseer-lease-release", daemon=True)
        t.start()
        t.join(3.0)


# ---- capture ---------------------------------------------------------------------------------------


def editable_outside(after: Manifest, changed: list[str], roots: list[str]) -> list[str]:
    """Editable installs the setup made whose code lives outside the roots (another node lacks it)."""
    bad: list[str] = []
    for p in changed:
        if after[p].kind != FILE:
            continue
        name = os.path.basename(p)
        try:
            if name.endswith(".pth") and after[p].size < 1 << 20:
                for line in Path(p).read_text(errors="replace").splitlines():
                    line = line.strip()
                    is_path = line and not line.startswith(("#", "import ")) and os.path.isabs(line)
                    if is_path and not under(os.path.normpath(line), roots):
                        bad.append(f"{p} adds {line} to sys.path")
            elif name == "direct_url.json" and after[p].size < 1 << 20:
                doc = json.loads(Path(p).read_text())
                url = doc.get("url", "")
                if doc.get("dir_info", {}).get("editable") and url.startswith("file://"):
                    from urllib.parse import unquote, urlparse

                    src = os.path.normpath(unquote(urlparse(url).path))
                    if not under(src, roots):
                        bad.append(f"{os.path.dirname(p)} is an editable install of {src}")
        except (OSError, ValueError, AttributeError):
            continue
    return bad


def open_for_writing(paths: set[str]) -> list[str]:
    """Which of `paths` some process holds open for writing (from /proc/<pid>/fd and fdinfo)."""
    found: list[str] = []
    me = os.getpid()
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target not in paths:
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags = _fdinfo_flags(f.read())
            except OSError:
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                found.append(f"{target} (pid {pid})")
    return found


def _fdinfo_flags(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8)
    return 0


def _pid1_started() -> float:
    """When this (container's) PID 1 started, as a wall-clock time; 0 when unknown.

    Nothing written before it started can be the setup's work: in a container started right after its
    image was built (a CI pre-warm), the image's own files are only a second older than the setup."""
    try:
        with open("/proc/1/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0.0
    # the boot time from the two clocks (/proc/stat's btime is whole seconds: too coarse here)
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def outside_changes(since: float, roots: list[str], exclude: list[str], budget_s: float = 1.5) -> list[str]:
    """Files the setup changed outside the roots, looked for (bounded) where setups usually write.

    They will not be in the snapshot, so another node restoring it will lack them: a warning, not
    an error (many such writes are caches, e.g. pip's). Each place gets a share of the time budget
    and is walked newest directory first, so a fresh install is found before old bulk.
    """
    import sysconfig

    since = max(since, _pid1_started())
    home = os.path.expanduser("~")
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    places = [base["purelib"], base["platlib"], base["scripts"], "/usr/local", "/opt", "/etc", home]
    skip = [*roots, *exclude, "/proc", "/sys", "/dev"]
    found: list[str] = []
    seen: set[str] = set()
    places = [os.path.normpath(p) for p in places]
    places = [p for p in dict.fromkeys(places) if not under(p, skip) and os.path.isdir(p)]
    for top in places:
        t_end = time.monotonic() + budget_s / max(1, len(places))
        stack = [top]
        while stack and time.monotonic() < t_end and len(found) < 50:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            try:
                it = os.scandir(d)
            except OSError:
                continue
            subdirs: list[tuple[float, str]] = []
            with it:
                for e in it:
                    if under(e.path, skip) or (d == home and e.name.startswith(".") and e.name != ".local"):
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append((st.st_mtime, e.path))
                    elif st.st_ctime >= since or st.st_mtime >= since:
                        found.append(e.path)
            stack.extend(p for _, p in sorted(subdirs))  # newest last: popped first
    return found


@dataclass
class Captured:
    blob: Path
    digest: str
    size: int
    files: int
    raw_bytes: int
    deletions: int
    entries: list[ArchiveEntry]
    deletion_paths: list[str]
    seconds: dict[str, float] = field(default_factory=dict)  # scan, write, outside_wait: for profiles


def _refuse_unportable(after: Manifest, changed: list[str], roots: list[str]) -> None:
    """What another node could not use: editable installs of code outside the roots, files still being written."""
    problems = editable_outside(after, changed, roots)
    if problems:
        raise BootseerError(
            "cannot snapshot: editable installs point outside the roots, another node would lack their code: "
            + "; ".join(problems[:5])
            + " (install them non-editable, or add their directories to [env] extra_roots)"
        )
    busy = open_for_writing({p for p in changed if after[p].kind == FILE})
    if busy:
        raise BootseerError(
            "cannot snapshot: files are still open for writing (a setup process still running?): " + ", ".join(busy[:5])
        )


def _write_blob(
    tmp: Path, after: Manifest, changed: list[str], meta: dict[str, Any], progress: bool | None
) -> tuple[Written, list[ArchiveEntry]]:
    """The blob of `changed` at `tmp` (removed again on any failure); its summary and entries.

    With several cores (and fork), contiguous segments of `changed` are written by forked workers,
    each reading, framing and compressing its own files (Python's per-file work in parallel, not
    only zstd's), and appended in order; else one writer does it all."""
    from ..progress import byte_bar
    from .manifest import hardlink_groups

    links = hardlink_groups(after, changed)
    total = sum(after[p].size for p in changed if after[p].kind == FILE)
    workers = min(os.cpu_count() or 1, max(1, len(changed) // SEGMENT_MIN_ENTRIES))
    w: ArchiveWriter | None = None
    try:
        with byte_bar(total, "capture", enabled=progress) as advance:
            w = ArchiveWriter(tmp, progress=advance)
            if workers > 1 and hasattr(os, "fork"):
                _write_segments(w, tmp, after, changed, links, workers, advance)
            else:
                for p in changed:
                    w.add(p, after[p], link_to=links.get(p))
            return w.finish(meta), w.entries
    except BaseException:
        if w is not None:
            w.abort()
        raise


SEGMENT_MIN_ENTRIES = 2000  # fewer entries per worker than this: forking costs more than it saves


def _segments(after: Manifest, changed: list[str], n: int) -> list[list[str]]:
    """`changed` cut into `n` contiguous runs of about equal bytes (each entry counts a header block)."""
    weight = [(after[p].size if after[p].kind == FILE else 0) + 512 for p in changed]
    share = sum(weight) / n
    out: list[list[str]] = [[]]
    acc = 0.0
    for p, wgt in zip(changed, weight, strict=True):
        if acc >= share * len(out) and len(out) < n:
            out.append([])
        out[-1].append(p)
        acc += wgt
    return [seg for seg in out if seg]


def _write_segments(
    w: ArchiveWriter,
    tmp: Path,
    after: Manifest,
    changed: list[str],
    links: dict[str, str],
    workers: int,
    advance: Callable[[int], None],
) -> None:
    """Fork one writer per segment, then append their outputs to `w` in order as each finishes.

    A hardlink's target is in its own or an earlier segment, so it stays ahead of the link."""
    from .format import CHUNK_BYTES

    targets = set(links.values())
    big = [
        p
        for p in changed
        if after[p].kind == FILE and after[p].size > CHUNK_BYTES // 2 and p not in links and p not in targets
    ]
    small = [p for p in changed if p not in set(big)] if big else changed
    # the small files in `workers` segments, one thread each; the large ones last, in one more worker
    # whose zstd uses every core (a 434 MB libtorch_cpu.so on one thread would outlast all the rest)
    plan = [(seg, 1) for seg in _segments(after, small, workers)] + ([(big, os.cpu_count() or 1)] if big else [])
    kids: list[tuple[int, int, Path]] = []
    try:
        for k, (seg, threads) in enumerate(plan):
            part = tmp.with_name(f"{tmp.name}.part{k}")
            r, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                os.close(r)
                _segment_child(part, seg, after, links, threads, wfd)
            os.close(wfd)
            kids.append((pid, r, part))
        for pid, r, part in kids:
            with os.fdopen(r, "rb") as f:
                doc = json.loads(f.read() or b'{"error": "a capture worker died"}')
            os.waitpid(pid, 0)
            if "error" in doc:
                raise BootseerError(str(doc["error"]))
            w.append_segment(part, doc)
            advance(doc["raw"])
            part.unlink(missing_ok=True)
    finally:
        for _pid, _r, part in kids:
            part.unlink(missing_ok=True)


def _segment_child(  # pragma: no cover - runs in a forked child
    part: Path, seg: list[str], after: Manifest, links: dict[str, str], threads: int, wfd: int
) -> None:
    """Write one segment and report it (or the error) as JSON on `wfd`; never returns."""
    try:
        sw = ArchiveWriter(part, threads=threads)
        for p in seg:
            sw.add(p, after[p], link_to=links.get(p))
        payload = json.dumps(sw.end_segment())
    except BaseException as e:  # reported to the parent, which raises it
        payload = json.dumps({"error": str(e) or type(e).__name__})
    try:
        with os.fdopen(wfd, "w") as out:
            out.write(payload)
    finally:
        os._exit(0)


def capture(
    store: StoreSettings,
    roots: list[str],
    baseline: Manifest,
    env_key: str,
    cache: BlobCache,
    warn: Callable[[str], None],
    since: float | None = None,
    progress: bool | None = None,
    info: Callable[[str], None] | None = None,
) -> Captured:
    """Write the snapshot of what changed under `roots` since `baseline` into the node cache."""
    from .manifest import diff, scan

    exclude = excluded_paths(store)
    t0 = time.monotonic()
    after = scan(roots, exclude)
    d = diff(baseline, after)
    _refuse_unportable(after, d.changed, roots)
    t1 = time.monotonic()
    # the look outside the roots (a warning only, up to 1.5 s of walking) runs beside the blob's writing
    outside: list[str] = []

    def look() -> None:
        if since is not None:
            with contextlib.suppress(OSError, ValueError):  # a warning only: never a traceback from here
                outside.extend(outside_changes(since, roots, exclude))

    looker = threading.Thread(target=look, name="bootseer-outside", daemon=True)
    looker.start()
    tmp_dir = cache.root / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"snap-{uuid.uuid4().hex[:12]}.tar.zst"
    meta = {
        "roots": roots,
        "deletions": d.deleted,
        "env_key": env_key,
        "created": time.time(),
        "creator": socket.gethostname(),
    }
    written, entries = _write_blob(tmp, after, d.changed, meta, progress)
    t2 = time.monotonic()
    looker.join()
    _warn_outside(outside, warn, info)
    return Captured(
        tmp,
        written.digest,
        written.size,
        written.files,
        written.raw_bytes,
        len(d.deleted),
        entries,
        d.deleted,
        seconds={"scan": t1 - t0, "write": t2 - t1, "outside_wait": time.monotonic() - t2},
    )


@dataclass(frozen=True)
class Upload:
    """What publishing needs of a capture, small enough to hand to the agent in its task (JSON)."""

    blob: Path
    digest: str
    size: int
    files: int
    raw_bytes: int
    deletions: int
    entries: int  # how many entries the blob lists (ref field "entries"), deletions included

    @classmethod
    def of(cls, cap: Captured) -> Upload:
        entries = len(cap.entries) + cap.deletions
        return cls(cap.blob, cap.digest, cap.size, cap.files, cap.raw_bytes, cap.deletions, entries)

    def as_task(self) -> dict[str, Any]:
        return {**self.__dict__, "blob": str(self.blob)}

    @classmethod
    def from_task(cls, d: dict[str, Any]) -> Upload:
        ints = {k: int(d[k]) for k in ("size", "files", "raw_bytes", "deletions", "entries")}
        return cls(blob=Path(str(d["blob"])), digest=str(d["digest"]), **ints)


PENDING_DIR = "pending"


def pin_pending(cache: BlobCache, cap: Captured) -> Captured:
    """Move a capture to `<cache>/pending/`, out of the evictable part of the cache (eviction only
    walks `sha256/`), until the agent has uploaded it and adopts it into the cache."""
    pending = cache.root / PENDING_DIR
    pending.mkdir(parents=True, exist_ok=True)
    dest = pending / f"{cap.digest}-{uuid.uuid4().hex[:8]}.tar.zst"
    os.replace(cap.blob, dest)
    return replace(cap, blob=dest)


def sweep_pending(cache: BlobCache, ttl_s: float) -> int:
    """Remove pending captures whose uploader is gone: the agent touches its blob at every lease
    renewal (every TTL/3), so a blob untouched for 3 TTLs (10 minutes at least) has no uploader."""
    pending = cache.root / PENDING_DIR
    cutoff = time.time() - max(3 * ttl_s, 600.0)
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for p in pending.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed += 1
    return removed


def _warn_outside(outside: list[str], warn: Callable[[str], None], info: Callable[[str], None] | None) -> None:
    """What the setup changed outside the roots: a warning (the runtime's own files only a note)."""
    managed = [p for p in outside if p in RUNTIME_MANAGED]
    outside = [p for p in outside if p not in RUNTIME_MANAGED]
    if managed and info is not None:
        info(f"env: ignored {', '.join(managed)}: the container runtime writes them, not the setup")
    if outside:
        shown = ", ".join(outside[:8]) + (" …" if len(outside) > 8 else "")
        warn(f"the setup changed {len(outside)} file(s) outside [env] roots; they are not in the snapshot: {shown}")


def publish(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    cap: Captured | Upload,
    env_key: str,
    roots: list[str],
    progress: bool | None = None,
) -> Path:
    """Upload the blob, adopt it into the node cache, then write the ref (last). Returns the cached path.

    Called by `exec` before the launcher starts (`[exec] agent = false`, the `snapshot` verb), or by
    the agent's "env-publish" task (envsnap/agent_tasks.py) with the capture's `Upload`."""
    from .. import delivery
    from ..progress import byte_bar

    if isinstance(cap, Captured):
        cap = Upload.of(cap)
    with byte_bar(cap.size, "upload", enabled=progress) as advance:
        store.put_blob_file(cap.blob, cap.digest, progress=advance)
    path = cache.adopt(cap.blob, cap.digest, store)  # a local store: one copy, linked
    extra = delivery.after_publish(p2p, store, cap.digest, path) or {}
    doc = {
        "blob": cap.digest,
        "size": cap.size,
        "files": cap.files,
        "bytes": cap.raw_bytes,
        "deletions": cap.deletions,
        "entries": cap.entries,
        "created": time.time(),
        "creator": socket.gethostname(),
        "roots": roots,
        "format": FORMAT,
        **extra,
    }
    store.write_ref(REF_KIND, env_key, doc)
    return path


# ---- restore ---------------------------------------------------------------------------------------


@dataclass
class Restored:
    digest: str
    files: int
    raw_bytes: int
    source: str
    bytes_from_store: int
    bytes_from_peers: int
    seconds_fetch: float
    seconds_extract: float
    fetch_note: str = ""  # why the swarm was not used, when it was enabled


def fetch_verified(
    p2p: P2PSettings, store: Store, cache: BlobCache, digest: str, size: int | None, progress: bool | None = None
) -> Fetched:
    """The blob on local disk, its digest checked (a cached copy is re-checked; a bad one refetched)."""
    from .. import delivery
    from ..digests import sha256_file
    from ..progress import byte_bar

    for attempt in range(2):
        with byte_bar(size, "download", enabled=progress) as advance:
            fetched = delivery.fetch_blob(p2p, store, digest, progress=advance, cache=cache)
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


def restore(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    env_key: str,
    roots: list[str],
    ref: dict[str, Any] | None = None,
    progress: bool | None = None,
    extra_keys: tuple[str, ...] = (),
) -> Restored | None:
    """Restore the snapshot for `env_key` under `roots`; None when the store has none.

    Raises IntegrityError/UnsafeArchive/NoSpace/RestoreError when the snapshot cannot be used (any
    other exception a malformed ref or blob provokes is turned into an IntegrityError); the tree is
    then as it was before (the message says so). The caller holds the tree lock.
    """

    if ref is None:
        ref = store.read_ref(REF_KIND, env_key)
        if ref is None:
            return None
    digest = ref.get("blob") if isinstance(ref, dict) else None
    if not isinstance(digest, str) or ref.get("format") != FORMAT:
        raise IntegrityError(f"ref env/{env_key[:16]} is malformed or of an unknown format")
    try:
        return _restore(p2p, store, cache, env_key, roots, ref, digest, progress, extra_keys)
    except BootseerError:
        raise
    except Exception as e:  # whatever a malformed ref or blob provokes: the snapshot is unusable
        raise IntegrityError(f"snapshot {digest[:12]} is unusable: {type(e).__name__}: {e}"[:400]) from None


def entries_hint(ref: dict[str, Any]) -> int:
    """How many entries the ref says its blob lists (bounds the metadata read; never trusted further)."""
    n = ref.get("entries")
    if isinstance(n, int) and n >= 0:
        return n
    files, deletions = ref.get("files"), ref.get("deletions")
    known = [x for x in (files, deletions) if isinstance(x, int) and x >= 0]
    return 2 * sum(known)  # refs from before "entries": directories are not counted in "files"


class DigestMismatch(IntegrityError):
    """The blob read during a streamed restore does not match its digest (the tree was undone)."""


class _Verifier:
    """Hashes a blob through an open descriptor in a thread, while the same descriptor is extracted.

    hashlib releases the GIL on large updates, so the hash runs beside the forked extraction workers
    and warms the page cache ahead of them; the extraction asks for the result before it commits.
    """

    def __init__(self, fd: int, digest: str) -> None:
        self.fd = fd
        self.digest = digest
        self.got = ""
        self.error = ""
        self._t = threading.Thread(target=self._run, name="bootseer-verify", daemon=True)

    def start(self) -> None:
        """Begin hashing (the extraction calls this once its workers are forked)."""
        if self._t.ident is None:
            self._t.start()

    def _run(self) -> None:
        import hashlib

        h = hashlib.sha256()
        off = 0
        try:
            while chunk := os.pread(self.fd, 4 << 20, off):
                h.update(chunk)
                off += len(chunk)
            self.got = h.hexdigest()
        except OSError as e:
            self.error = str(e)

    def ok(self) -> bool:
        self.start()  # an extraction that failed before its workers ran never started it
        self._t.join()
        return not self.error and self.got == self.digest

    def check(self) -> None:
        if not self.ok():
            raise DigestMismatch(
                f"blob {self.digest[:12]} does not match its digest{': ' + self.error if self.error else ''}"
            )


class _Download(_Verifier):
    """A remote blob downloaded into a temporary file of the node cache, in order and hashed on the way,
    while the extraction reads the frames that have arrived (`extract(arriving=True)`); the metadata is
    read first from the blob's end by a ranged read. Renamed into the cache once restored and matched.
    A failed download pads the file to its full size, so waiting workers go on, fail and are undone."""

    def __init__(self, store: Store, cache: BlobCache, digest: str) -> None:
        from ..store import blob_path

        self.store = store
        self.dest = cache.path(digest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.part = self.dest.with_name(f".{self.dest.name}.part-{uuid.uuid4().hex[:8]}")
        src = store.open_input(blob_path(digest))  # ranged reads: the size and the metadata at the end
        self.size = int(src.size())
        self.tail: tuple[Callable[[int, int], bytes], int] = (lambda n, off: bytes(src.read_at(n, off)), self.size)
        self._w = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        super().__init__(os.open(self.part, os.O_RDONLY | os.O_CLOEXEC), digest)
        self.start()  # the fetch itself: it runs from the start, beside everything else

    def _run(self) -> None:
        import hashlib

        from ..store import blob_path

        h = hashlib.sha256()
        n = 0
        try:
            with self.store.fs.open_input_stream(self.store.path(blob_path(self.digest))) as src:
                while chunk := src.read(4 << 20):
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
        if not self.ok() and self.error:
            from ..errors import StoreError

            raise StoreError(f"store {self.store.uri}: cannot download blob {self.digest[:12]}: {self.error}")
        super().check()

    def keep(self, cache: BlobCache) -> None:
        os.replace(self.part, self.dest)
        cache.evict(keep=self.digest)

    def discard(self) -> None:
        self.part.unlink(missing_ok=True)


@dataclass
class _Blob:
    """An open blob for one restore attempt: where it came from and, when unverified, its hasher."""

    fd: int
    fetched: Fetched
    verifier: _Verifier | None  # None: the fetch already checked the digest
    store_path: Path | None = None  # read in place from a local store: link it into the cache after

    def close(self) -> None:
        if isinstance(self.verifier, _Download):
            self.verifier.discard()  # a no-op once kept
        os.close(self.fd)


def _open_blob(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    digest: str,
    size: int | None,
    progress: bool | None,
    *,
    cached: bool,
) -> _Blob:
    """The blob to restore from, opened once, with no copy made: the node cache's file (`cached`), the
    local store's file in place, or else a fetch (swarm, remote store) into the cache, hashed on the way."""
    from ..errors import StoreError
    from ..store import blob_path

    hit = cache.peek(digest) if cached else None
    if hit is not None:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(hit, os.O_RDONLY | os.O_CLOEXEC)
            return _Blob(fd, Fetched(hit, "cache"), _Verifier(fd, digest))
    if store.is_local and not p2p.enabled:
        path = Path(store.path(blob_path(digest)))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreError(f"store {store.uri}: blob {digest[:12]} not found") from None
        n = os.fstat(fd).st_size
        return _Blob(fd, Fetched(path, "store", bytes_from_store=n), _Verifier(fd, digest), store_path=path)
    if not p2p.enabled:  # a remote store: fetch, hash, decompress and write overlapped
        d = _Download(store, cache, digest)
        return _Blob(d.fd, Fetched(d.dest, "store", bytes_from_store=d.size), d)
    fetched = _fetch_or_drop(p2p, store, cache, digest, size, progress)
    return _Blob(os.open(fetched.path, os.O_RDONLY | os.O_CLOEXEC), fetched, None)


def _link_into_cache(cache: BlobCache, b: _Blob, digest: str) -> None:
    """After a verified in-place restore: the node cache gets a hard link to the store's blob (one copy
    on disk), if it is still the file that was read; across filesystems the store stays the only copy."""
    if b.store_path is None:
        return
    dest = cache.path(digest)
    tmp = dest.with_name(f".{dest.name}.link-{uuid.uuid4().hex[:8]}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(b.store_path, tmp)
        if os.stat(tmp).st_ino == os.fstat(b.fd).st_ino:
            os.replace(tmp, dest)
            cache.evict(keep=digest)
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _restore(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    env_key: str,
    roots: list[str],
    ref: dict[str, Any],
    digest: str,
    progress: bool | None,
    extra_keys: tuple[str, ...],
) -> Restored:
    """Open the blob (cache, local store in place, or a fetch), extract it while it is hashed; a
    digest mismatch found at the end undoes the tree, drops a bad cached copy and tries the store."""
    size = ref.get("size") if isinstance(ref.get("size"), int) else None
    for attempt in range(2):
        t0 = time.monotonic()
        b = _open_blob(p2p, store, cache, digest, size, progress, cached=attempt == 0)
        try:
            restored, meta = _restore_from(b, roots, ref, digest, progress, t0)
            _link_into_cache(cache, b, digest)
            if isinstance(b.verifier, _Download):
                b.verifier.keep(cache)
        except BootseerError as e:
            if b.verifier is None or b.verifier.ok():
                raise
            if isinstance(b.verifier, _Download) and b.verifier.error:
                b.verifier.check()  # the StoreError of the download (the tree is already undone)
            if b.fetched.source == "cache":  # a bad cached copy: drop it, read the store's
                cache.drop(Path(b.fetched.path), os.fstat(b.fd).st_ino, digest)
                continue
            with contextlib.suppress(BootseerError, OSError):
                store.delete_blob(digest)  # the next capture replaces it
            if isinstance(e, DigestMismatch):
                raise
            raise DigestMismatch(f"blob {digest[:12]} does not match its digest ({e})") from None
        finally:
            b.close()
        write_stamp(roots, [env_key, *extra_keys], digest, meta.entries, meta.deletions)
        return restored
    raise DigestMismatch(f"blob {digest[:12]} does not match its digest")


def _restore_from(
    b: _Blob, roots: list[str], ref: dict[str, Any], digest: str, progress: bool | None, t0: float
) -> tuple[Restored, Meta]:
    """Read the metadata (bounded, checked for safety by the plan) and extract from the open blob."""
    from ..progress import byte_bar
    from .extract import extract
    from .format import read_meta

    t1 = time.monotonic()
    meta = read_meta(b.verifier.tail if isinstance(b.verifier, _Download) else b.fd, entries_hint(ref))
    if any(not under(r, roots) for r in meta.roots):
        raise IntegrityError(
            f"the snapshot was captured for roots {', '.join(meta.roots)}, which this node's roots "
            f"({', '.join(roots)}) do not contain; nothing restored"
        )
    switch = switch_deletions(roots, meta, digest)
    remove_stamp(roots)
    planned = replace(meta, deletions=(*meta.deletions, *switch)) if switch else meta
    raw = ref.get("bytes")
    v = b.verifier
    with byte_bar(raw if isinstance(raw, int) and raw > 0 else None, "restore", enabled=progress) as advance:
        ex = extract(
            b.fd,
            planned,
            roots,
            progress=advance,
            verify=v and v.check,
            start_verify=v and v.start,
            arriving=isinstance(v, _Download),
        )
    t2 = time.monotonic()
    f = b.fetched
    restored = Restored(
        digest, ex.files, ex.raw_bytes, f.source, f.bytes_from_store, f.bytes_from_peers, t1 - t0, t2 - t1, f.note
    )
    return restored, meta
