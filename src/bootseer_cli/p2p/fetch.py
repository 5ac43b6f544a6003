"""The swarm leg of `delivery.fetch_blob`: get a blob from the job's other nodes, the store serving ~one copy.

    torrent ref ─► join the swarm (announce in the store, connect to the others) ─►
        a seed already announced?  download from the swarm
        else take a free segment lease: its holder streams that segment from the store into the swarm
        (big blobs have up to 8 segments, so up to 8 nodes read one each and trade the rest)
    no progress for [p2p] deadline_s (no peer, a dead origin, only corrupt peers) ─► read the missing
    pieces from the store ─► verify the whole blob's sha256 ─► into the node cache

The session lives for the whole process: a blob keeps being served while the caller restores it, and
`linger` (at exit, or before `exec` hands seeding to the agent) waits, bounded, for the peers that
are still downloading from this node.

The session itself is in an unprivileged helper process (remote.py, helper.py), and the swarm joins
the secret torrent of the blob, not the stored one (secret.py): this process reads the store, feeds
pieces, and copies a finished download out of the helper's directory while hashing it; the copy it
made is what goes into the cache, and only when its sha256 is the blob's.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, IntegrityError, StoreError
from .copyout import keep_torrent
from .discovery import Announcer, local_host, static_peers, swarm_peers

if TYPE_CHECKING:
    from ..settings import P2PSettings
    from ..store.cache import BlobCache
    from ..store.core import Lease, Store
    from .copyout import PrefixCopier
    from .remote import RemoteHandle, RemoteSwarm
    from .swarm import StoreFeeder

POLL_S = 0.1
DISCOVER_S = 2.0
LEASE_TTL_S = 30.0

Progress = Callable[[int], None]


class NoSwarm(StoreError):
    """The swarm cannot deliver this blob (no torrent published, P2P cannot start): use the store.

    A StoreError because it means what a failing store read means to a caller (this source could not
    deliver, get the bytes elsewhere); `delivery.fetch_blob` catches it and reads the store."""


@dataclass
class Served:
    digest: str
    torrent_digest: str
    handle: RemoteHandle
    announcer: Announcer
    discoverer: Discoverer


@dataclass
class Result:
    path: Path
    bytes_from_store: int
    bytes_from_peers: int
    note: str = ""
    origin: bool = False
    hash_failures: int = 0


@dataclass
class Node:
    """This process's place in the job's swarms."""

    swarm: RemoteSwarm
    store: Store
    p2p: P2PSettings
    secret: bytes
    served: dict[str, Served] = field(default_factory=dict)
    fetches: list[dict[str, Any]] = field(default_factory=list)


_node: Node | None = None
_node_lock = threading.Lock()


def start_swarm(p2p: P2PSettings, store: Store, work_root: Path, wait: bool = True) -> tuple[RemoteSwarm, bytes]:
    """The helper's session and the swarm secret, or NoSwarm saying why there is none. Without
    `wait`, the helper may still be starting (`_ready` waits for it)."""
    from .remote import RemoteSwarm
    from .secret import swarm_secret

    try:
        secret = swarm_secret(p2p, store)
    except ConfigError as e:
        raise NoSwarm(str(e)) from None
    if secret is None:
        raise NoSwarm("no swarm secret ([p2p] key_file, or a [trust] signing_key to derive it from)")
    host = local_host(p2p, store)
    try:
        swarm = RemoteSwarm(p2p.listen or host, p2p.port, host, work_root, p2p.user)
    except (OSError, RuntimeError, ConfigError) as e:
        raise NoSwarm(str(e)) from None
    if wait:
        try:
            _ = swarm.port
        except OSError as e:
            swarm.close()
            raise NoSwarm(str(e)) from None
    return swarm, secret


def _ready(node: Node) -> None:
    """Wait for the helper started by `get_node`; one that did not start ends this process's swarm."""
    global _node
    try:
        _ = node.swarm.port
    except OSError as e:
        with _node_lock:
            if _node is node:
                _node = None
        node.swarm.close()
        raise NoSwarm(str(e)) from None


def get_node(p2p: P2PSettings, store: Store, cache: BlobCache | None = None) -> Node:
    """The process's one libtorrent session, started on first use (closed at exit or by `shutdown`);
    the helper works under `cache` (default: the node cache of the default store settings)."""
    global _node
    with _node_lock:
        if _node is None:
            if cache is None:
                from ..settings import StoreSettings
                from ..store.cache import cache_for

                cache = cache_for(StoreSettings())
            _prune_work(cache.root / ".p2p")
            swarm, secret = start_swarm(p2p, store, cache.root / ".p2p", wait=False)
            _node = Node(swarm, store, p2p, secret)
            atexit.register(shutdown)
        return _node


def _hex(h: RemoteHandle) -> str:
    return h.info_hash()


class Discoverer(threading.Thread):
    """Store I/O off the fetch loop (a slow store must not delay stall detection): lists the blob's
    swarm, connects to new peers, refreshes this node's entry, and counts the peers still downloading."""

    def __init__(self, node: Node, digest: str, handle: RemoteHandle, ann: Announcer) -> None:
        super().__init__(name=f"discover-{digest[:8]}", daemon=True)
        self.node, self.digest, self.handle, self.ann = node, digest, handle, ann
        self.stop = threading.Event()
        self.downloading = 0  # peers announced as downloading, other than this node
        self.seeds = 0

    def tick(self) -> None:
        eps = [(e.host, e.port) for e in static_peers(self.node.p2p)]
        try:
            peers = swarm_peers(self.node.store, self.digest, exclude=self.ann.name)
        except (StoreError, OSError):
            peers = []
        self.downloading = sum(1 for p in peers if p.state == "downloading")
        self.seeds = sum(1 for p in peers if p.state == "seed")
        self.node.swarm.connect(self.handle, eps + [(p.host, p.port) for p in peers])
        self.ann.refresh()

    def run(self) -> None:
        t0 = time.monotonic()
        # Often at first, while the job's nodes are still joining; then every DISCOVER_S.
        while not self.stop.wait(0.5 if time.monotonic() - t0 < 10 else DISCOVER_S):
            # Broad on purpose: this thread's job is to keep discovering for the whole fetch, and one
            # failed round (a store hiccup, a libtorrent error, a foreign entry) must not end it.
            with contextlib.suppress(Exception):
                self.tick()


def fetch_from_swarm(
    p2p: P2PSettings, store: Store, digest: str, cache: BlobCache, progress: Progress | None = None
) -> Result:
    """The verified blob in `cache`, fetched through the swarm (see the module docstring)."""
    node = get_node(p2p, store, cache)  # first: without a secret or a helper, no lease is taken
    tref = store.read_ref("torrent", digest)  # while the helper starts
    if not tref or not tref.get("torrent"):
        _ready(node)
        made = _torrent_for_unpublished(p2p, store, digest, cache, progress)
        if isinstance(made, Result):
            return made
        tref = made
    tdigest = str(tref["torrent"])
    torrent = store.get_blob_bytes(tdigest)
    _check_torrent(torrent, digest)
    _ready(node)
    return _Download(node, p2p, store, digest, cache, tdigest, torrent, progress).run()


def _joined(node: Node, torrent: bytes, digest: str) -> bytes:
    """The torrent of the blob's swarm: the stored one salted with the job's secret (secret.py)."""
    from .secret import swarm_torrent

    return swarm_torrent(torrent, digest, node.secret)


class _Download:
    """One blob fetched through the swarm. The steps (start, download, fall back, finish, abort) share
    the torrent's handle, this node's swarm entry, the store feeder and the accounting, so they live
    on one object and each reads as one unit."""

    def __init__(
        self,
        node: Node,
        p2p: P2PSettings,
        store: Store,
        digest: str,
        cache: BlobCache,
        tdigest: str,
        torrent: bytes,
        progress: Progress | None,
    ) -> None:
        self.node, self.swarm, self.p2p, self.store = node, node.swarm, p2p, store
        self.digest, self.cache, self.tdigest, self.torrent = digest, cache, tdigest, torrent
        self.progress = progress
        self.handle = self.swarm.add(_joined(node, torrent, digest), digest)
        self.key = _hex(self.handle)
        self.ann = Announcer(store, digest, self.swarm.announce_host, self.swarm.port)
        self.discoverer = Discoverer(node, digest, self.handle, self.ann)
        self.from_store = len(torrent)
        self.feeder: StoreFeeder | None = None
        self.plan: _SegmentClaims | None = None
        self.hasher: PrefixCopier | None = None  # our copy of the download, hashed as it grows
        self.note = ""
        self.origin = False

    def run(self) -> Result:
        """Start, download, finish; on any failure leave the swarm cleanly before the caller falls back."""
        try:
            self._start()
            self._download()
            return self._finish()
        except BaseException:
            self._abort()
            raise
        finally:
            if self.plan is not None:
                self.plan.release()

    def _start(self) -> None:
        """Join the swarm. With no seed announced yet, take a free store segment: this node is then an
        origin and streams that segment from the store into the swarm."""
        from .copyout import PrefixCopier
        from .swarm import StoreFeeder

        peers = []
        with contextlib.suppress(StoreError, OSError):
            peers = swarm_peers(self.store, self.digest, exclude=self.ann.name)
        first = None
        if not any(p.state == "seed" for p in peers):
            ti = self.handle.torrent_file()
            self.plan = _SegmentClaims(self.store, self.digest, ti.num_pieces(), segment_count(ti.total_size()))
            first = self.plan.first()
            if first is None:
                self.plan = None
        self.ann.write("downloading")
        self.discoverer.tick()
        self.discoverer.start()
        self.hasher = PrefixCopier(self.swarm, self.handle, self.cache, self.digest)
        self.hasher.start()
        if self.plan is not None and first is not None:
            self.origin = True
            segments = self.plan.iterate(first)
            self.feeder = StoreFeeder(
                self.handle, self.store, self.digest, shuffle=False, mbps=self.p2p.origin_mbps, segments=segments
            )
            self.feeder.start()

    def _download(self) -> None:
        """Poll libtorrent until every piece is here, reporting progress. No new piece for `deadline_s`
        (and no origin feeder still reading) means the swarm cannot finish: see `_fall_back`."""
        done_reported = 0
        last_progress = time.monotonic()
        last_pieces = -1
        ever_peer = False
        while True:
            self.swarm.pump()
            st = self.handle.status(pieces=True)  # one request per round: the piece map feeds the copier
            if self.hasher is not None:
                self.hasher.offer(st.pieces)
            if st.total_wanted_done > done_reported:
                if self.progress:
                    self.progress(st.total_wanted_done - done_reported)
                done_reported = st.total_wanted_done
            if st.num_pieces != last_pieces:
                last_pieces = st.num_pieces
                last_progress = time.monotonic()
            ever_peer = ever_peer or st.num_peers > 0
            if st.is_seeding or st.num_pieces == self.handle.torrent_file().num_pieces():
                return
            if st.error:
                raise OSError(f"libtorrent: {st.error}")
            if self.feeder is not None and self.feeder.error is not None:
                raise self.feeder.error
            stalled = time.monotonic() - last_progress > self.p2p.deadline_s
            if (self.feeder is None or self.feeder.done) and stalled:
                self._fall_back(st.num_pieces, ever_peer)
            time.sleep(POLL_S)

    def _fall_back(self, have_pieces: int, ever_peer: bool) -> None:
        """The swarm stalled (no peer, a dead origin, only corrupt peers): read the missing pieces from
        the store, in a random order so that several nodes falling back read different ones."""
        from .swarm import StoreFeeder

        deadline_s = self.p2p.deadline_s
        failures = self.swarm.hash_failures.get(self.key, 0)
        if failures:
            self.note = f"{failures} corrupt piece(s) from peers rejected; missing pieces read from the store"
        elif not ever_peer and have_pieces == 0:
            self.note = f"no peer within {deadline_s:g} s; read from the store"
        else:
            self.note = f"swarm stalled for {deadline_s:g} s; missing pieces read from the store"
        if failures:
            # Corrupt peers are still serving: stop asking the swarm, take the rest from the store.
            self.handle.set_upload_mode()
        if self.feeder is not None:
            self.from_store += self.feeder.bytes_read
        self.feeder = StoreFeeder(self.handle, self.store, self.digest, shuffle=True)
        self.feeder.start()

    def _finish(self) -> Result:
        """Verify the whole blob, link it into the cache, announce this node as a seed (it keeps serving
        until `shutdown`), and account for where the bytes came from."""
        if self.feeder is not None:
            self.feeder.stop.set()
            self.feeder.join(5)
            self.from_store += self.feeder.bytes_read
        from_peers = int(self.handle.status().total_payload_download)
        path = self._verified_copy()
        with contextlib.suppress(StoreError, OSError):  # before the leases go: late nodes must see a seed
            self.ann.write("seed")
        self.node.served[self.digest] = Served(self.digest, self.tdigest, self.handle, self.ann, self.discoverer)
        keep_torrent(self.cache, self.tdigest, self.torrent)
        failures = self.swarm.hash_failures.get(self.key, 0)
        if failures and not self.note:
            self.note = f"{failures} corrupt piece(s) from peers rejected"
        self.node.fetches.append(
            {
                "digest": self.digest,
                "origin": self.origin,
                "bytes_from_store": self.from_store,
                "bytes_from_peers": from_peers,
                "note": self.note,
                "time": time.time(),
            }
        )
        return Result(path, self.from_store, from_peers, self.note, self.origin, failures)

    def _verified_copy(self) -> Path:
        """Our copy of the download, in the cache, its sha256 checked: mostly copied and hashed while it
        arrived (`PrefixCopier`). What is hashed is what we wrote, so the helper (which can still
        write its own file) cannot change the blob after the check."""
        assert self.hasher is not None
        if self.hasher.finish() != self.digest:
            # Every piece passed libtorrent's check, so a mismatch is a write not yet visible: flush, copy again.
            self.swarm.flush(self.handle)
            if self.hasher.redo() != self.digest:
                self.hasher.discard()
                raise IntegrityError(f"blob {self.digest[:12]} from the swarm does not match its digest")
        return self.hasher.adopt()

    def _abort(self) -> None:
        """Leave the swarm and drop the partial download (the caller falls back to the store)."""
        if self.feeder is not None:
            self.feeder.stop.set()
        if self.hasher is not None:
            self.hasher.stop.set()
            self.hasher.discard()
        self.discoverer.stop.set()
        self.ann.remove()
        self.swarm.remove(self.handle)  # the helper deletes its partial download


def _check_torrent(torrent: bytes, digest: str) -> None:
    """The torrent comes from the store: it must describe exactly this blob (one file named by the
    digest), so libtorrent writes nothing but that file inside its work directory."""
    import libtorrent as lt

    try:
        ti = lt.torrent_info(lt.bdecode(torrent))  # type: ignore[arg-type]  # the bindings take the dictionary
    except (RuntimeError, TypeError) as e:  # libtorrent: a bad bencoding / not a torrent dictionary
        raise NoSwarm(f"the blob's torrent is unreadable: {e}") from None
    if ti.num_files() != 1 or ti.name() != digest:
        raise NoSwarm("the blob's torrent does not describe this blob")


def _prune_work(root: Path, older_s: float = 3600.0) -> None:
    """Work directories of processes that died mid-fetch (the cache's own entries live elsewhere).
    shutil.rmtree works through directory descriptors here: a link inside is removed, not followed."""
    with contextlib.suppress(OSError):
        for d in root.iterdir():
            with contextlib.suppress(OSError):
                if time.time() - d.lstat().st_mtime > older_s:
                    shutil.rmtree(d, ignore_errors=True)


class _KeptLease:
    """Renews a lease in the background while a long step (a whole-blob download) runs."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="lease")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(LEASE_TTL_S / 3):
            with contextlib.suppress(StoreError, OSError):  # a store hiccup: renew at the next round
                self.lease.renew(LEASE_TTL_S)

    def release(self) -> None:
        self.stop.set()
        with contextlib.suppress(StoreError, OSError):  # an unreleased lease expires on its own
            self.lease.release()


SEGMENT_BYTES = 128 << 20
MAX_SEGMENTS = 8


def segment_count(size: int) -> int:
    """How many nodes may read a blob from the store at once (one segment each): big blobs are read
    in up to 8 segments by different nodes, so no single origin must upload every piece to every
    peer; the segments together are still one copy from the store."""
    return max(1, min(MAX_SEGMENTS, size // SEGMENT_BYTES))


def segment_lease_key(digest: str, k: int) -> str:
    return f"p2p-{digest}" if k == 0 else f"p2p-{digest}-{k}"


class _SegmentClaims:
    """The store-read segments this node took (a lease each, renewed until the fetch ends).

    A node takes the first free segment when it joins; a feeder that finished its segments takes
    the next free ones, so all are read even when the swarm has fewer nodes than segments."""

    def __init__(self, store: Store, digest: str, pieces: int, count: int) -> None:
        self.store, self.digest, self.pieces, self.count = store, digest, pieces, count
        self.kept: list[_KeptLease] = []

    def _take(self, k: int) -> bool:
        lease = self.store.try_lease(segment_lease_key(self.digest, k), LEASE_TTL_S)
        if lease is None:
            return False
        self.kept.append(_KeptLease(lease))
        return True

    def _pieces(self, k: int) -> list[int]:
        return list(range(k * self.pieces // self.count, (k + 1) * self.pieces // self.count))

    def first(self) -> int | None:
        for k in range(self.count):
            if self._take(k):
                return k
        return None

    def iterate(self, first: int) -> Iterator[list[int]]:
        yield self._pieces(first)
        for k in range(first + 1, self.count):
            if self._take(k):
                yield self._pieces(k)

    def release(self) -> None:
        for kept in self.kept:
            kept.release()


def _torrent_for_unpublished(
    p2p: P2PSettings, store: Store, digest: str, cache: BlobCache, progress: Progress | None
) -> Result | dict[str, Any]:
    """A blob published without a torrent (e.g. checkpoint stripes cut on the fly, with no local file).

    The node that takes the blob's lease downloads it from the store (one copy), makes the torrent
    from its verified copy, publishes it and seeds; the others wait for the torrent while that lease
    is alive, then download from the swarm. Returns the lease holder's Result, or the torrent ref.
    """
    lease = store.try_lease(f"p2p-{digest}", LEASE_TTL_S)
    if lease is not None:
        return _publish_as_first_fetcher(p2p, store, digest, cache, progress, lease)
    return _wait_for_torrent(store, digest, p2p.deadline_s)


def _publish_as_first_fetcher(
    p2p: P2PSettings, store: Store, digest: str, cache: BlobCache, progress: Progress | None, lease: Lease
) -> Result:
    """Holding the blob's lease: fetch it from the store, publish its torrent, and seed it from the cache."""
    from .publish import publish_torrent

    kept = _KeptLease(lease)
    try:
        path, n = cache.fetch(store, digest, progress=progress)
        tdigest = publish_torrent(store, digest, path)
    finally:
        kept.release()
    torrent = store.get_blob_bytes(tdigest)
    node = get_node(p2p, store, cache)
    handle = node.swarm.add(_joined(node, torrent, digest), digest, seed_path=path)
    ann = Announcer(store, digest, node.swarm.announce_host, node.swarm.port)
    ann.write("seed")
    discoverer = Discoverer(node, digest, handle, ann)
    discoverer.start()
    node.served[digest] = Served(digest, tdigest, handle, ann, discoverer)
    keep_torrent(cache, tdigest, torrent)
    note = "blob had no torrent: fetched it from the store and published one"
    node.fetches.append({"digest": digest, "origin": True, "bytes_from_store": n, "bytes_from_peers": 0, "note": note})
    return Result(path, n + len(torrent), 0, note, origin=True)


def _wait_for_torrent(store: Store, digest: str, deadline_s: float) -> dict[str, Any]:
    """Another node is making the torrent: wait for its ref while its lease lives (by this node's TTL), at
    most this node's `[p2p] deadline_s`: a forged or far-future lease must not stop the start."""
    missing_since, deadline = None, time.monotonic() + deadline_s
    while True:
        tref = store.read_ref("torrent", digest)
        if tref and tref.get("torrent"):
            return tref
        if time.monotonic() >= deadline:
            raise NoSwarm(f"no torrent was published for this blob within [p2p] deadline_s = {deadline_s:g} s")
        live = store.lease_live(f"p2p-{digest}", store.read_lease(f"p2p-{digest}"), LEASE_TTL_S)
        missing_since = None if live else (missing_since or time.monotonic())
        if missing_since is not None and time.monotonic() - missing_since > 2.0:
            raise NoSwarm("no torrent was published for this blob, and the node making one gave up")
        time.sleep(0.25)


def _downloading_peers(node: Node) -> int:
    """Peers that may still want data from this node: connected and not seeds, or announced as downloading."""
    n = 0
    for s in node.served.values():
        with contextlib.suppress(RuntimeError):  # libtorrent: the handle was removed meanwhile
            n += sum(1 for p in s.handle.get_peer_info() if not p.seed)
        n += s.discoverer.downloading
    return n


def linger(node: Node, cap_s: float) -> float:
    """Keep serving while peers still download (from this node or announced), at most `cap_s` seconds."""
    t0 = time.monotonic()
    quiet_since: float | None = None
    while time.monotonic() - t0 < cap_s:
        node.swarm.pump()
        if _downloading_peers(node) == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= 1.5 * DISCOVER_S:
                break
        else:
            quiet_since = None
        time.sleep(0.1)
    return time.monotonic() - t0


def shutdown(cap_s: float | None = None) -> list[dict[str, Any]]:
    """Linger (bounded), leave every swarm and close the session; returns what was served (for the agent)."""
    global _node
    with _node_lock:
        node, _node = _node, None
    if node is None:
        return []
    if node.served:
        cap = node.p2p.deadline_s if cap_s is None else cap_s
        with contextlib.suppress(RuntimeError):  # libtorrent failing while serving late peers: stop serving them
            linger(node, cap)
    served = [{"digest": s.digest, "torrent": s.torrent_digest} for s in node.served.values()]
    for s in node.served.values():
        s.discoverer.stop.set()
        s.discoverer.join(10)
        s.announcer.remove()
        node.swarm.remove(s.handle)
    node.swarm.close()
    return [{"blobs": served, "fetches": node.fetches}] if served else []
