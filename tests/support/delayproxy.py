"""A TCP proxy on loopback that delays every request: latency where the kernel has no netem.

Each chunk the client sends (an HTTP request, in practice) waits `delay_ms` before it is forwarded;
responses flow back undelayed. So every ranged GET a lazy loader makes costs one round trip, as it
would to a remote bucket.

Both legs set TCP_NODELAY: a relay forwards a response in the pieces it receives (headers, then
body), and with Nagle the second small piece waits for the client's delayed ACK (up to 40 ms).
Without it a request at `delay_ms=10` cost about 25 ms (rclone mount and s3fs: 47-59 ms per 20 kB
file of 2 requests, 23 ms with TCP_NODELAY; JuiceFS at `delay_ms=0`: 16-40 ms per file, 2-3 ms with
it, 2.4 ms without the proxy).

    with DelayProxy(("127.0.0.1", s3_port), delay_ms=5) as proxy:
        endpoint = proxy.endpoint  # "127.0.0.1:<free port>"
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time


class _Conn:
    """A relayed connection: its two sockets, and how many of its two directions have ended."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.socks, self.ended = (client, server), 0

    def close(self) -> None:
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()


class DelayProxy:
    """Threads: one acceptor, two pumps per connection. `stop()` closes everything."""

    def __init__(self, upstream: tuple[str, int], delay_ms: float = 5.0) -> None:
        self.upstream = upstream
        self.delay_s = delay_ms / 1000.0
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)
        self.port = self.listener.getsockname()[1]
        self.requests = 0
        self.lines: list[str] = []  # the request line of each chunk that starts one (what was asked, for messages)
        self.bytes_down = 0  # response bytes relayed (approximate under concurrency: for benchmarks)
        self.slow: dict[str, float] = {}  # request-line substring -> seconds that request waits instead
        self._conns: set[_Conn] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> DelayProxy:
        threading.Thread(target=self._accept, daemon=True, name="delayproxy").start()
        return self

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError as e:
                if self._stopped.is_set() or e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                time.sleep(0.05)  # out of fds for a moment: the connections ending now free some
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
                for s in (client, server):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                client.close()
                continue
            conn = _Conn(client, server)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._pump, args=(client, server, True, conn), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False, conn), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delayed: bool, conn: _Conn) -> None:
        try:
            while data := src.recv(1 << 16):
                if delayed:
                    self.requests += 1
                    delay = self.delay_s
                    if data[:4] in (b"GET ", b"PUT ", b"HEAD", b"POST", b"DELE"):
                        line = data.split(b"\r\n", 1)[0][:160].decode("latin-1")
                        self.lines.append(line)
                        delay = next((s for k, s in self.slow.items() if k in line), delay)
                    time.sleep(delay)
                else:
                    self.bytes_down += len(data)  # one pump thread per connection: += races only across them
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            self._done(conn)

    def _done(self, conn: _Conn) -> None:
        """One direction of `conn` has ended; once both have, close its two sockets. They were kept until
        `stop()` before, and rclone's mount (which drops a connection whenever it abandons a ranged GET)
        ran the process out of fds within a few `import torch` runs: accept() failed, the proxy stopped
        accepting, and every later request hung (the rclone "hangs" of docs/notes/hotblocks.md run 7)."""
        with self._lock:
            conn.ended += 1
            if conn.ended < 2:
                return
            self._conns.discard(conn)
        conn.close()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns = set()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
