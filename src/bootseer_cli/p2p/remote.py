"""bootseer's side of the swarm helper (helper.py): starts it unprivileged and speaks to its session.

`RemoteSwarm` and `RemoteHandle` offer what fetch.py and seed.py used of libtorrent's session and
torrent handles, as requests over a socketpair. Everything the helper answers is data to check, not
to trust: counters and piece maps only steer the fetch loop, and a download is used only after
`copy_out` hashed the bytes it copied into a root-owned file (the helper keeps write access to its
own files, so the verified copy must be ours, not a link to theirs).

The helper runs as `[p2p] user` (default `nobody`) when bootseer is root, else as the caller. Its
work directory is `<cache>/.p2p/helper-<id>`, made here, owned by that user, mode 0700, and passed
as a descriptor (the cache's parents may be closed to it); it goes when the session closes.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ..errors import ConfigError
from .wire import Channel, WireError

START_S = 20.0
CALL_S = 60.0  # the longest answer: a flush (30 s) on a busy helper
ANSWER_HEADER = 1 << 20  # the helper's answers are small JSON documents, with no payload
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class HelperGone(OSError):
    """The swarm helper exited, or broke the protocol: this process's swarm is over."""


@dataclass(frozen=True)
class TorrentMeta:
    """The parts of a torrent the fetch needs (libtorrent's torrent_info names, so callers read alike)."""

    pieces: int
    plen: int
    size: int

    @classmethod
    def parse(cls, torrent: bytes) -> TorrentMeta:
        import libtorrent as lt  # bdecode only: no session in this process

        info = cast("dict[bytes, Any]", lt.bdecode(torrent))[b"info"]  # a torrent the store's digest names
        size, plen = int(info[b"length"]), int(info[b"piece length"])
        return cls(-(-size // plen), plen, size)

    def num_pieces(self) -> int:
        return self.pieces

    def piece_length(self) -> int:
        return self.plen

    def total_size(self) -> int:
        return self.size

    def piece_size(self, i: int) -> int:
        return min(self.plen, self.size - i * self.plen)


@dataclass(frozen=True)
class Status:
    total_wanted_done: int
    num_pieces: int
    num_peers: int
    is_seeding: bool
    error: str
    total_payload_download: int
    total_payload_upload: int
    pieces: list[bool]
    checking: bool = False  # libtorrent still checks the files it has (pieces may yet turn up)


@dataclass(frozen=True)
class Peer:
    ip: str
    port: int
    seed: bool
    total_upload: int


def helper_ids(user: str) -> tuple[int, int]:
    """uid and gid the helper runs as: `[p2p] user` when this process is root, else our own."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise ConfigError(f"[p2p] user {user!r} does not exist on this node") from None
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        raise ConfigError(f"[p2p] user {user!r} is root: the swarm must run unprivileged")
    return pw.pw_uid, pw.pw_gid


def _work_dir(root: Path, uid: int, gid: int) -> tuple[Path, int]:
    """`root/helper-<id>`, new, owned by the helper, 0700, and a descriptor of it (no link followed)."""
    root.mkdir(parents=True, exist_ok=True)
    parent = os.open(root, DIR_FLAGS)
    try:
        if not stat.S_ISDIR(os.fstat(parent).st_mode):
            raise OSError(f"{root} is not a directory")
        name = f"helper-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)
    return root / name, fd


class RemoteSwarm:
    """The session in the helper, seen from here (thread-safe: one request at a time)."""

    def __init__(self, listen_host: str, ports: str | int, announce_host: str, work_root: Path, user: str) -> None:
        uid, gid = helper_ids(user)
        self.announce_host = announce_host
        self.lock = threading.Lock()
        self.work, self.work_fd = _work_dir(work_root, uid, gid)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115  (the helper writes it; closed in _cleanup)
        env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL") if k in os.environ}
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bootseer_cli.p2p.helper",
                    str(theirs.fileno()),
                    str(self.work_fd),
                    str(uid),
                    str(gid),
                ],
                pass_fds=(theirs.fileno(), self.work_fd),
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
            )
        except BaseException:
            self._cleanup()
            raise
        finally:
            theirs.close()
        self.chan = Channel(ours, max_header=ANSWER_HEADER, max_payload=0)
        self.broken = ""
        # Asked now, answered on first use: the helper starts (Python, libtorrent, listen) while the
        # caller reads the blob's torrent from the store.
        self._port = 0
        self._starting = True
        start = {"op": "start", "listen": listen_host, "ports": str(ports), "announce": announce_host, "fds": 0}
        self.chan.send(start)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        with self.lock:
            self._check()
        return self._port

    def _started(self) -> None:
        """Wait (holding the lock) for the answer to the start request, at most START_S."""
        if not self._starting:
            return
        self._starting = False
        self.chan.sock.settimeout(START_S)
        try:
            reply, _, _ = self.chan.recv()
        except (OSError, WireError) as e:
            self.broken = f"did not start ({e or type(e).__name__})"
            raise self._gone(self.broken) from None
        finally:
            self.chan.sock.settimeout(CALL_S)
        if not reply.get("ok"):
            raise self._gone(f"did not start: {str(reply.get('error', ''))[:300]}")
        self._port = int(reply["port"])

    def _gone(self, why: str) -> HelperGone:
        with contextlib.suppress(OSError, ValueError):
            self.stderr.seek(0)
            tail = self.stderr.read()[-300:].decode(errors="replace")
            tail = "".join(c if c.isprintable() else " " for c in tail).strip()
            if tail:
                why = f"{why}: {tail.splitlines()[-1] if tail.splitlines() else tail}"
        return HelperGone(f"the swarm helper {why}")

    def call(self, header: dict[str, Any], payload: bytes = b"", fds: tuple[int, ...] = ()) -> dict[str, Any]:
        """One request; its answer, or RuntimeError (what libtorrent raised there) or HelperGone."""
        with self.lock:
            self._check()
            try:
                self.chan.send({**header, "fds": len(fds)}, payload, fds)
                reply, _, extra = self.chan.recv()
            except (OSError, WireError) as e:  # a timeout too: a late answer would pair with the next request
                self.broken = f"stopped answering ({e or type(e).__name__})"
                raise self._gone(self.broken) from None
        for fd in extra:  # the helper passes us nothing: close what it sent anyway
            os.close(fd)
        if not reply.get("ok"):
            raise RuntimeError(str(reply.get("error", "failed"))[:500])
        return reply

    def _check(self) -> None:
        """Holding the lock: the helper has started and the channel is still in step."""
        if self.broken:
            raise self._gone(self.broken)
        self._started()

    def send_oneway(self, header: dict[str, Any], payload: bytes = b"") -> None:
        with self.lock:
            self._check()
            try:
                self.chan.send({**header, "oneway": True, "fds": 0}, payload)
            except OSError as e:
                self.broken = f"stopped reading ({e or type(e).__name__})"
                raise self._gone(self.broken) from None

    # ---- session -------------------------------------------------------------------------------
    def add(self, torrent: bytes, digest: str, seed_path: Path | None = None) -> RemoteHandle:
        """Download `torrent` into the helper's work directory, or seed the verified blob at `seed_path`
        (opened here, read-only and without following a link, and passed as a descriptor)."""
        fds: tuple[int, ...] = ()
        if seed_path is not None:
            fd = os.open(seed_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(f"{seed_path} is not a regular file")
            fds = (fd,)
        try:
            reply = self.call({"op": "add", "digest": digest}, torrent, fds)
        finally:
            for fd in fds:
                os.close(fd)
        meta = TorrentMeta.parse(torrent)
        return RemoteHandle(self, int(reply["tid"]), str(reply["info_hash"]), meta, str(reply["dir"]), digest)

    def remove(self, handle: RemoteHandle) -> None:
        with contextlib.suppress(RuntimeError, HelperGone):  # already gone, or the helper with it
            self.call({"op": "remove", "tid": handle.tid})

    def connect(self, handle: RemoteHandle, endpoints: list[tuple[str, int]]) -> None:
        eps = [[h, p] for h, p in endpoints if not (h == self.announce_host and p == self.port)]
        if eps:
            self.call({"op": "connect", "tid": handle.tid, "endpoints": eps})

    def pump(self) -> None:
        """Nothing to do here: the helper drains libtorrent's alerts itself."""

    def counters(self) -> dict[str, Any]:
        return self.call({"op": "counters"})

    @property
    def hash_failures(self) -> dict[str, int]:
        raw = self.counters().get("hash_failures", {})
        return {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def flush(self, handle: RemoteHandle, timeout: float = 30.0) -> bool:
        return bool(self.call({"op": "flush", "tid": handle.tid, "timeout": timeout}).get("flushed"))

    def open_download(self, handle: RemoteHandle) -> int:
        """A read-only descriptor of the handle's download, reached without following links (the
        helper owns the directory and could swap a file for one)."""
        d = os.open(handle.dir, DIR_FLAGS, dir_fd=self.work_fd)
        try:
            fd = os.open(handle.digest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
        finally:
            os.close(d)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError("the swarm's download is not a regular file")
        return fd

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, HelperGone):
            self.chan.sock.settimeout(10)
            self.call({"op": "close"})
        self._starting = False
        with contextlib.suppress(OSError):
            self.chan.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._cleanup()

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.work_fd)
        shutil.rmtree(self.work, ignore_errors=True)  # fd-based on Linux: no link in it is followed
        with contextlib.suppress(OSError):
            self.stderr.close()


class RemoteHandle:
    """One torrent in the helper's session."""

    def __init__(
        self, swarm: RemoteSwarm, tid: int, info_hash: str, meta: TorrentMeta, dirname: str, digest: str
    ) -> None:
        self.swarm, self.tid, self._info_hash, self.meta = swarm, tid, info_hash, meta
        self.dir, self.digest = dirname, digest

    def info_hash(self) -> str:
        return self._info_hash

    def torrent_file(self) -> TorrentMeta:
        return self.meta

    def status(self, pieces: bool | int = False) -> Status:  # libtorrent's query flags: any bit asks for pieces
        r = self.swarm.call({"op": "status", "tid": self.tid, "pieces": pieces})
        bits = str(r.get("pieces", ""))
        have = [c == "1" for c in bits[: self.meta.pieces]] if pieces else []
        have += [False] * (self.meta.pieces - len(have)) if pieces else []
        return Status(
            int(r["total_wanted_done"]),
            min(int(r["num_pieces"]), self.meta.pieces),
            int(r["num_peers"]),
            bool(r["is_seeding"]),
            str(r.get("error", ""))[:300],
            int(r["total_payload_download"]),
            int(r["total_payload_upload"]),
            have,
            bool(r.get("checking", False)),
        )

    def have_piece(self, i: int) -> bool:
        return bool(self.swarm.call({"op": "have", "tid": self.tid, "i": i}).get("have"))

    def add_piece(self, i: int, data: bytes, flags: int = 0) -> None:
        """One way, not waiting for an answer: the store feeder streams pieces, and checks later which
        stuck (a piece the helper could not take is handed again)."""
        self.swarm.send_oneway({"op": "piece", "tid": self.tid, "i": i, "flags": flags}, data)

    def set_upload_mode(self) -> None:
        self.swarm.call({"op": "upload_mode", "tid": self.tid})

    def get_peer_info(self) -> list[Peer]:
        peers = self.swarm.call({"op": "peers", "tid": self.tid}).get("peers", [])
        return [Peer(str(p["ip"]), int(p["port"]), bool(p["seed"]), int(p["uploaded"])) for p in peers[:1000]]
