"""The swarm helper: the process that owns the libtorrent session, unprivileged.

libtorrent parses what any peer sends; it runs here, not in bootseer (which may be root in a Slurm
prolog or an init container). bootseer starts this module with a socketpair and a directory, both as
inherited descriptors (`remote.start_helper`); when started as root, it drops to the unprivileged
uid and gid it is given (no supplementary groups, no new privileges) before libtorrent is imported.

What it may touch: its work directory (a descriptor of a directory it owns, where downloads land;
bootseer copies a finished download out while hashing it, and uses it only if the sha256 matches),
and read-only descriptors of verified cache blobs that bootseer passes it to seed. Paths go through
`/proc/self/fd/<n>`, so neither needs a path the helper could otherwise reach. It holds no store
credentials and never sees the swarm secret (only per-blob swarm torrents).

    python -m bootseer_cli.p2p.helper SOCK_FD WORK_FD UID GID
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .wire import Channel, WireError

if TYPE_CHECKING:
    from .swarm import Swarm

PR_SET_NO_NEW_PRIVS = 38


def drop_privileges(uid: int, gid: int) -> None:
    """As root: become uid/gid with no supplementary groups; refuse to go on if root is still reachable."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if uid != 0 and 0 in (*os.getresuid(), *os.getresgid()):
        raise SystemExit("swarm helper: still root after dropping privileges")
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise SystemExit("swarm helper: could regain root")


class Helper:
    """The request loop: one request at a time, libtorrent's alerts drained between requests."""

    def __init__(self, chan: Channel, work_fd: int) -> None:
        self.chan, self.work_fd = chan, work_fd
        self.work = f"/proc/self/fd/{work_fd}"
        self.swarm: Swarm | None = None
        self.handles: dict[int, Any] = {}
        self.dirs: dict[int, str] = {}
        self.fds: dict[int, int] = {}
        self.next_tid = 1

    def loop(self) -> None:
        while True:
            ready, _, _ = select.select([self.chan.sock], [], [], 0.1)
            if self.swarm is not None:
                self.swarm.pump()
            if not ready and not self.chan.buf:
                continue
            header, payload, fds = self.chan.recv()
            op = str(header.get("op"))
            if header.get("oneway"):  # no answer: a failed piece is handed again by the feeder (RETRY_S)
                with contextlib.suppress(Exception):
                    getattr(self, f"op_{op}")(header, payload, fds)
                continue
            try:
                fn = getattr(self, f"op_{op}", None)
                if fn is None:
                    raise ValueError(f"unknown request {op!r}")
                reply = fn(header, payload, fds)
                self.chan.send({"ok": True, **(reply or {})})
            except Exception as e:  # broad on purpose: every failure is a reply, the helper keeps serving
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self.chan.send({"ok": False, "error": f"{type(e).__name__}: {e}"[:500]})
            if op == "close":
                return

    # ---- requests ------------------------------------------------------------------------------
    def op_start(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> dict[str, Any]:
        from .swarm import Swarm

        self.swarm = Swarm(str(h["listen"]), str(h["ports"]), announce_host=str(h["announce"]))
        return {"port": self.swarm.port}

    def _handle(self, h: dict[str, Any]) -> Any:
        return self.handles[int(h["tid"])]

    def op_add(self, h: dict[str, Any], torrent: bytes, fds: list[int]) -> dict[str, Any]:
        assert self.swarm is not None
        digest = str(h["digest"])
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError("not a sha256 digest")
        tid = self.next_tid
        self.next_tid += 1
        name = f"{'seed' if fds else 'dl'}-{tid}"
        os.mkdir(name, 0o700, dir_fd=self.work_fd)
        save = f"{self.work}/{name}"
        if fds:  # seed a verified cache blob: the torrent's one file is the passed descriptor
            self.fds[tid] = fds[0]
            os.symlink(f"/proc/self/fd/{fds[0]}", f"{save}/{digest}")
        handle = self.swarm.add(torrent, Path(save), seed=bool(fds))
        self.handles[tid], self.dirs[tid] = handle, name
        return {"tid": tid, "info_hash": str(handle.info_hash()), "dir": name}

    def op_remove(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> None:
        assert self.swarm is not None
        tid = int(h["tid"])
        handle = self.handles.pop(tid, None)
        if handle is not None:
            self.swarm.remove(handle)
        fd = self.fds.pop(tid, None)
        if fd is not None:
            os.close(fd)
        name = self.dirs.pop(tid, None)
        if name is not None:
            shutil.rmtree(f"{self.work}/{name}", ignore_errors=True)

    def op_connect(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> None:
        assert self.swarm is not None
        self.swarm.connect(self._handle(h), [(str(a), int(b)) for a, b in h["endpoints"]])

    def op_status(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> dict[str, Any]:
        from .swarm import QUERY_PIECES

        st = self._handle(h).status(QUERY_PIECES if h.get("pieces") else 0)
        lt = self.swarm.lt if self.swarm is not None else None
        checking = lt is not None and st.state in (
            lt.torrent_status.checking_files,
            lt.torrent_status.checking_resume_data,
        )
        return {
            "checking": bool(checking),  # the files are still being checked: pieces may yet appear
            "total_wanted_done": int(st.total_wanted_done),
            "num_pieces": int(st.num_pieces),
            "num_peers": int(st.num_peers),
            "is_seeding": bool(st.is_seeding),
            "error": st.errc.message() if st.errc.value() != 0 else "",
            "total_payload_download": int(st.total_payload_download),
            "total_payload_upload": int(st.total_payload_upload),
            "pieces": "".join("1" if p else "0" for p in st.pieces) if h.get("pieces") else "",
        }

    def op_have(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> dict[str, Any]:
        return {"have": bool(self._handle(h).have_piece(int(h["i"])))}

    def op_piece(self, h: dict[str, Any], data: bytes, _f: list[int]) -> None:
        self._handle(h).add_piece(int(h["i"]), data, int(h.get("flags", 0)))

    def op_upload_mode(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> None:
        assert self.swarm is not None
        self._handle(h).set_flags(self.swarm.lt.torrent_flags.upload_mode)

    def op_peers(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> dict[str, Any]:
        peers = [
            {"ip": str(p.ip[0]), "port": int(p.ip[1]), "seed": bool(p.seed), "uploaded": int(p.total_upload)}
            for p in self._handle(h).get_peer_info()
        ]
        return {"peers": peers}

    def op_flush(self, h: dict[str, Any], _p: bytes, _f: list[int]) -> dict[str, Any]:
        assert self.swarm is not None
        return {"flushed": self.swarm.flush(self._handle(h), float(h.get("timeout", 30)))}

    def op_counters(self, _h: dict[str, Any], _p: bytes, _f: list[int]) -> dict[str, Any]:
        assert self.swarm is not None
        with self.swarm.lock:
            return {
                "hash_failures": dict(self.swarm.hash_failures),
                "banned": dict(self.swarm.banned),
                "errors": self.swarm.errors[-5:],
            }

    def op_close(self, _h: dict[str, Any], _p: bytes, _f: list[int]) -> None:
        if self.swarm is not None:
            for handle in self.handles.values():
                self.swarm.remove(handle)
            self.swarm.close()
            self.swarm = None
        deadline = time.monotonic() + 2
        for name in self.dirs.values():
            if time.monotonic() < deadline:
                shutil.rmtree(f"{self.work}/{name}", ignore_errors=True)


def main(argv: list[str]) -> int:
    import socket

    sock_fd, work_fd, uid, gid = (int(x) for x in argv)
    os.chdir("/")
    # The Python side of the session (no libtorrent in it: that loads after the drop), imported while
    # the interpreter's own files are surely readable (an interpreter under /root is not, to nobody).
    import datetime  # noqa: F401  (libtorrent's bindings import it)

    from . import swarm  # noqa: F401

    drop_privileges(uid, gid)
    os.umask(0o077)
    chan = Channel(socket.socket(fileno=sock_fd))
    try:
        Helper(chan, work_fd).loop()
    except (WireError, ConnectionError, KeyboardInterrupt):
        return 0  # bootseer went away: so does its swarm
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
