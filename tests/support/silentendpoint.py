"""A loopback endpoint that never answers, for tests and benchmarks of a store that is down without
saying so: "hung" takes every connection and sends nothing (a hung proxy or load balancer);
"drops-syn" never completes a connection (its accept queue is kept full, so the kernel drops SYNs,
as a firewall that drops packets does)."""

from __future__ import annotations

import contextlib
import socket
import threading


class SilentEndpoint:
    """The endpoint at 127.0.0.1:`port`, silent the way `how` says ("hung" or "drops-syn"), until `close`."""

    def __init__(self, how: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        if how == "hung":
            self.sock.listen(64)
            threading.Thread(target=self._hold, daemon=True).start()
        else:
            self.sock.listen(0)
            for _ in range(3):  # fill the queue: later SYNs go unanswered
                c = socket.socket()
                c.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    c.connect(("127.0.0.1", self.port))
                self.held.append(c)

    def _hold(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.sock.accept()[0])

    def close(self) -> None:
        for c in self.held:
            c.close()
        self.sock.close()


class StallingProxy:
    """A loopback proxy in front of an S3 server that passes everything until `stall()`; from then on
    each new connection's response stops after `cap` bytes and the connection stays open, silent (a
    store that answers small requests, then stops sending a blob part way: a hung proxy, an overloaded
    server)."""

    def __init__(self, upstream: tuple[str, int], cap: int = 64 << 10) -> None:
        self.upstream, self.cap = upstream, cap
        self.stalling = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.stalling.set()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client = self.sock.accept()[0]
                server = socket.create_connection(self.upstream)
                self.conns += [client, server]
                cap = self.cap if self.stalling.is_set() else None
                threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, cap), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, cap: int | None) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while piece := src.recv(1 << 16):
                if cap is not None and sent + len(piece) > cap:
                    dst.sendall(piece[: cap - sent])
                    return  # nothing more, and nothing closed: the reader hears silence
                dst.sendall(piece)
                sent += len(piece)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.close()
