"""The libtorrent side: datacenter session settings, one torrent per blob, and feeding pieces from the store.

Settings (measured on these machines, see docs/p2p.md): TCP only (uTP was 7x slower on loopback),
several connections per IP (nodes behind one address, and every test node on 127.0.0.1), no DHT,
LSD, UPnP or NAT-PMP (nothing is announced outside the job), protocol encryption forced both ways
(RC4 keyed by a DH exchange and the secret info-hash, secret.py: a host that knows only the store
cannot join or read the swarm), every peer unchoked, large send buffers and disk queues, and quick
reconnects so a peer that restarts its session (exec → agent) is found again within a second or two.

This module imports libtorrent's session, so only the unprivileged helper (helper.py) runs it;
bootseer itself talks to the helper (remote.py).

Pieces that come from the store (the origin, or a node that falls back) are written with
`add_piece`, which libtorrent hashes like any downloaded piece and then announces to the peers: the
swarm can serve the first pieces while the origin is still reading the last ones.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import libtorrent as lt

    from ..store.core import Store
    from ..store.guard import Ranged
    from .remote import RemoteHandle, TorrentMeta

MiB = 1 << 20


def piece_size_for(size: int) -> int:
    """1 MiB pieces up to 256 MiB, 2 MiB up to 1 GiB, 4 MiB above: a few hundred pieces for big blobs,
    so rarest-first has room to spread them, without piece hashes dominating small ones."""
    if size <= 256 * MiB:
        return MiB
    if size <= 1024 * MiB:
        return 2 * MiB
    return 4 * MiB


def make_torrent(path: Path, digest: str) -> bytes:
    """A v1 torrent for the blob at `path`, named by its digest, byte-identical on every publisher.

    The single file is named after the digest so that a seeder can point libtorrent at its blob
    cache directory directly. No creation date, creator or trackers: two nodes that publish the same
    blob make the same torrent, hence the same swarm.
    """
    import libtorrent as lt

    size = path.stat().st_size
    if size == 0:
        raise ValueError("an empty blob has no torrent")
    piece = piece_size_for(size)
    ct = lt.create_torrent([lt.create_file_entry(digest, size)], piece, lt.create_torrent.v1_only)
    ct.set_creation_date(0)
    with open(path, "rb") as f:
        for i in range(ct.num_pieces()):
            ct.set_hash(i, hashlib.sha1(f.read(piece)).digest())
    return bytes(lt.bencode(ct.generate()))


def parse_ports(spec: str | int) -> tuple[int, int]:
    text = str(spec).strip()
    lo_s, _, hi_s = text.partition("-")
    try:
        lo = int(lo_s)
        hi = int(hi_s) if hi_s else lo
    except ValueError:
        raise ConfigError(f"[p2p] port {text!r} is not a port or a range like 6881-6891") from None
    if not (0 <= lo <= hi < 65536):
        raise ConfigError(f"[p2p] port {text!r} is not a port or a range like 6881-6891")
    return lo, hi


def listen_interfaces(listen_host: str, port: int) -> str:
    """libtorrent's `listen_interfaces` for one host and the first port to try (IPv6 in brackets)."""
    host = f"[{listen_host}]" if ":" in listen_host else listen_host
    return f"{host}:{port}"


def session_settings(listen_host: str, port_lo: int, port_hi: int) -> dict[str, Any]:
    import libtorrent as lt

    return {
        "listen_interfaces": listen_interfaces(listen_host, port_lo),
        "max_retry_port_bind": port_hi - port_lo,
        "enable_outgoing_utp": False,
        "enable_incoming_utp": False,
        "enable_outgoing_tcp": True,
        "enable_incoming_tcp": True,
        "allow_multiple_connections_per_ip": True,
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "dht_bootstrap_nodes": "",
        "out_enc_policy": int(lt.enc_policy.forced),
        "in_enc_policy": int(lt.enc_policy.forced),
        "allowed_enc_level": int(lt.enc_level.rc4),
        "prefer_rc4": True,
        "choking_algorithm": int(lt.choking_algorithm_t.fixed_slots_choker),
        "unchoke_slots_limit": -1,
        "send_buffer_watermark": 16 * MiB,
        "send_buffer_low_watermark": 2 * MiB,
        "send_buffer_watermark_factor": 150,
        "max_queued_disk_bytes": 256 * MiB,
        "max_out_request_queue": 1500,
        "max_allowed_in_request_queue": 4000,
        "request_queue_time": 2,
        "min_reconnect_time": 1,
        "peer_connect_timeout": 3,
        "connection_speed": 200,
        "smooth_connects": False,
        "piece_timeout": 5,
        "request_timeout": 10,
        "rate_limit_ip_overhead": False,
        "aio_threads": 4,
        "hashing_threads": 2,
        "alert_mask": int(
            lt.alert_category.error | lt.alert_category.peer | lt.alert_category.status | lt.alert_category.storage
        ),
        "alert_queue_size": 10000,
        "user_agent": "bootseer",
    }


class Swarm:
    """One libtorrent session for this process: every blob it downloads or seeds is a torrent in it."""

    def __init__(self, listen_host: str, ports: str | int, announce_host: str | None = None) -> None:
        import libtorrent as lt

        self.lt = lt
        lo, hi = parse_ports(ports)
        self.session = lt.session(session_settings(listen_host, lo, hi))  # type: ignore[call-overload]  # a dict does
        self.announce_host = announce_host or listen_host
        self.lock = threading.Lock()
        self.hash_failures: dict[str, int] = {}  # per info-hash (hex)
        self.banned: dict[str, int] = {}
        self.errors: list[str] = []
        self._flushed: dict[str, threading.Event] = {}
        self._ports_lost: list[int] | None = []  # while starting: ports another socket took (see below)
        self._wait_listening(listen_host, lo, hi)

    def _wait_listening(self, listen_host: str, lo: int, hi: int) -> None:
        """Wait until the session listens on a port of `lo`-`hi` (5 s, and at least 1 s after a port is
        skipped); OSError when it does not.

        libtorrent moves on to the next port only when `bind` fails. Sessions of one host that start
        at the same moment (the nodes of a test on one machine, two jobs starting on one host) can both
        bind the same free port, as both sockets set SO_REUSEADDR and neither listens yet; the first to
        `listen` gets it, the other's `listen` fails with "address in use", and libtorrent tries no
        other port: that process would not join the swarm at all (its fetch falls back to the store,
        and it serves no peer). So a port lost that way is skipped here: the session listens again
        from the next one, until the range is spent.
        """
        deadline = time.time() + 5
        first = lo
        try:
            while time.time() < deadline:
                self.pump()
                port = self.session.listen_port()
                if port and self.session.is_listening():
                    self.port = int(port)
                    return
                with self.lock:
                    lost = [p for p in self._ports_lost or [] if p >= first]
                    self._ports_lost = []
                if lost:
                    first = max(lost) + 1
                    if first > hi:
                        break  # the range is spent
                    settings = {
                        "listen_interfaces": listen_interfaces(listen_host, first),
                        "max_retry_port_bind": hi - first,
                    }
                    self.session.apply_settings(settings)
                    deadline = max(deadline, time.time() + 1.0)
                time.sleep(0.02)
        finally:
            self._ports_lost = None  # started (or given up): later listen failures are only reported
        raise OSError(f"libtorrent could not listen on a port in {lo}-{hi}: {'; '.join(self.errors[-3:])}")

    # ---- torrents ------------------------------------------------------------------------------
    def _params(self, torrent: bytes, save_path: Path, seed: bool) -> lt.add_torrent_params:
        lt = self.lt
        atp = lt.add_torrent_params()
        atp.ti = lt.torrent_info(lt.bdecode(torrent))
        atp.save_path = str(save_path)
        flags = lt.torrent_flags.update_subscribe
        if seed:
            flags |= lt.torrent_flags.seed_mode
        atp.flags = flags
        return atp

    def add(self, torrent: bytes, save_path: Path, seed: bool = False) -> lt.torrent_handle:
        """Add a torrent (downloading into `save_path`, or seeding the file already there)."""
        save_path.mkdir(parents=True, exist_ok=True)
        return self.session.add_torrent(self._params(torrent, save_path, seed))

    def remove(self, handle: lt.torrent_handle) -> None:
        with contextlib.suppress(RuntimeError):  # libtorrent: the handle is already gone
            self.session.remove_torrent(handle)

    def connect(self, handle: lt.torrent_handle, endpoints: list[tuple[str, int]]) -> None:
        for host, port in endpoints:
            if host == self.announce_host and port == self.port:
                continue
            # libtorrent: a host that is not an IP address (TypeError), a removed handle (RuntimeError)
            with contextlib.suppress(TypeError, RuntimeError):
                handle.connect_peer((host, port))

    # ---- alerts --------------------------------------------------------------------------------
    def pump(self) -> None:
        """Drain libtorrent's alerts, keeping the counters the fetch reports (hash failures, bans)."""
        lt = self.lt
        with self.lock:
            for a in self.session.pop_alerts():
                if isinstance(a, lt.hash_failed_alert):
                    key = str(a.handle.info_hash())
                    self.hash_failures[key] = self.hash_failures.get(key, 0) + 1
                elif isinstance(a, lt.peer_ban_alert):
                    key = str(a.handle.info_hash())
                    self.banned[key] = self.banned.get(key, 0) + 1
                elif isinstance(a, lt.save_resume_data_alert | lt.save_resume_data_failed_alert):
                    event = self._flushed.get(str(a.handle.info_hash()))
                    if event is not None:
                        event.set()
                elif isinstance(a, lt.listen_failed_alert | lt.file_error_alert | lt.torrent_error_alert):
                    self.errors.append(a.message())
                    if self._ports_lost is not None and _port_taken(lt, a):
                        self._ports_lost.append(int(a.port))

    def flush(self, handle: lt.torrent_handle, timeout: float = 30.0) -> bool:
        """Wait until every piece libtorrent has verified is on disk (a piece counts as "have" once it is
        hashed, which can be before its last write lands). True when the flush was confirmed."""
        key = str(handle.info_hash())
        event = self._flushed[key] = threading.Event()
        try:
            handle.save_resume_data(self.lt.save_resume_flags_t.flush_disk_cache)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                self.pump()
                if event.wait(0.02):
                    return True
            return False
        finally:
            self._flushed.pop(key, None)

    def close(self) -> None:
        with self.lock:
            session = getattr(self, "session", None)
            self.session = None
        if session is not None:
            session.pause()
            del session  # the session's destructor closes its sockets and files


def _port_taken(lt: ModuleType, alert: object) -> bool:
    """A TCP listener that failed because another socket holds its port (a `listen_failed_alert`)."""
    return (
        isinstance(alert, lt.listen_failed_alert)
        and alert.socket_type == lt.socket_type_t.tcp
        and alert.error.value() == errno.EADDRINUSE
    )


RETRY_S = 3.0
READ_AHEAD = 16 * MiB
OVERWRITE_EXISTING = 1  # lt.add_piece_flags_t.overwrite_existing (kept numeric: libtorrent loads lazily)
QUERY_PIECES = 8  # lt.torrent_handle.query_pieces


class StoreFeeder(threading.Thread):
    """Reads pieces of a blob from the store and hands them to libtorrent (`add_piece`).

    The origin reads them in order; a node that falls back reads only the pieces it still lacks, in
    a random order (so several such nodes read different pieces and trade the rest). `mbps` caps the
    rate (`[p2p] origin_mbps`), so the origin leaves room for the job's other traffic.
    """

    IN_FLIGHT = 16

    def __init__(
        self,
        handle: lt.torrent_handle | RemoteHandle,
        store: Store,
        digest: str,
        shuffle: bool,
        mbps: float = 0.0,
        on_error: Callable[[BaseException], None] | None = None,
        segments: Iterator[list[int]] | None = None,
    ) -> None:
        super().__init__(name=f"feeder-{digest[:8]}", daemon=True)
        self.handle = handle
        self.store = store
        self.digest = digest
        self.shuffle = shuffle
        self.mbps = mbps
        self.on_error = on_error
        self.segments = segments  # claimed lazily (leases); None: every piece
        self.claimed = 0
        self.bytes_read = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.done = False
        self._random: Ranged | None = None  # the blob in the store, opened on the first read

    def _read(self, ti: lt.torrent_info | TorrentMeta, i: int, ahead: bool = True) -> bytes:
        """Piece `i` from the store. Runs of pieces in order are read ahead in one ranged request of up
        to READ_AHEAD bytes (a request per piece left the link idle between requests); a piece out of
        order is one ranged read."""
        from ..store.core import blob_path

        if i in self._ahead:
            return self._ahead.pop(i)
        if self._random is None:  # each call into the store has store.guard's deadline: a store may stall
            self._random = self.store.open_ranged(blob_path(self.digest), f"blob {self.digest[:12]}")
        plen, n = ti.piece_length(), ti.num_pieces()
        run = [i]
        while (
            ahead
            and len(run) * plen < READ_AHEAD
            and self._next_in_order.get(run[-1]) == run[-1] + 1
            and run[-1] + 1 < n
        ):
            run.append(run[-1] + 1)
        sizes = [ti.piece_size(j) for j in run]
        src = self._random
        try:
            buf = src.read_at(sum(sizes), i * plen)
        except OSError:
            self._random = None  # not closed here: a read that overran may still be using it
            raise
        if len(buf) != sum(sizes):
            raise OSError(f"short read of pieces {run[0]}-{run[-1]} of blob {self.digest[:12]}")
        self.bytes_read += len(buf)  # what the store sent, used or not
        view, pos = memoryview(buf), 0
        for j, size in zip(run, sizes, strict=True):
            self._ahead[j] = bytes(view[pos : pos + size])
            pos += size
        return self._ahead.pop(i)

    def _add(self, ti: lt.torrent_info | TorrentMeta, i: int, flags: int) -> None:
        # Under a rate cap, piece by piece: the cap paces the requests (read-ahead would make it bursty).
        self.handle.add_piece(i, self._read(ti, i, ahead=not flags and self.mbps <= 0), flags)

    def _settle(self, ti: lt.torrent_info | TorrentMeta, pending: dict[int, float]) -> None:
        """Drop the pieces libtorrent now has; hand again, overwriting, any that did not stick (e.g. its
        blocks were mixed with a corrupt peer's and the piece failed its check). One status query per
        round: every call into libtorrent waits for its network thread, which is busy serving peers."""
        have = self._have = self.handle.status(QUERY_PIECES).pieces
        for j, t in list(pending.items()):
            if have[j]:
                del pending[j]
            elif time.monotonic() - t > RETRY_S:
                self._add(ti, j, OVERWRITE_EXISTING)
                pending[j] = time.monotonic()
        if len(pending) >= self.IN_FLIGHT:
            self.stop.wait(0.02)

    def run(self) -> None:
        self._random = None
        self._ahead: dict[int, bytes] = {}
        self._next_in_order: dict[int, int] = {}
        try:
            ti = self.handle.torrent_file()
            assert ti is not None  # added with its torrent_info (or the helper's TorrentMeta)
            n = ti.num_pieces()
            if self.segments is None:
                order = list(range(n))
                if self.shuffle:
                    random.shuffle(order)
                plans: Iterator[list[int]] = iter([order])
            else:
                plans = self.segments
            pending: dict[int, float] = {}  # piece -> when it was handed to libtorrent
            t0 = time.monotonic()
            try:
                for order in plans:
                    self.claimed += 1
                    self._have = self.handle.status(QUERY_PIECES).pieces
                    self._next_in_order = dict(itertools.pairwise(order))
                    for i in order:
                        if self.stop.is_set():
                            return
                        # The piece map of the last status query (one query per round, not one per
                        # piece): a piece that came from a peer since then is at worst read twice.
                        if self._have[i]:
                            self._ahead.pop(i, None)
                            continue
                        while len(pending) >= self.IN_FLIGHT and not self.stop.is_set():
                            self._settle(ti, pending)
                        self._add(ti, i, 0)
                        pending[i] = time.monotonic()
                        if self.mbps > 0:
                            ahead = self.bytes_read * 8 / (self.mbps * 1e6) - (time.monotonic() - t0)
                            if ahead > 0:
                                self.stop.wait(ahead)
                while pending and not self.stop.is_set():
                    self._settle(ti, pending)
                    self.stop.wait(0.02)
            finally:
                if self._random is not None:
                    with contextlib.suppress(OSError):
                        self._random.close()
            self.done = True
        except BaseException as e:  # broad on purpose: every failure goes to the fetch loop, which falls back
            self.error = e
            if self.on_error:
                self.on_error(e)
