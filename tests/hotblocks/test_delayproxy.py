"""The delaying proxy the loader tests and benchmarks put in front of the S3 server.

It kept every relayed connection's sockets until it was stopped, and rclone's mount drops a connection
whenever it abandons a ranged GET: within a few `import torch` runs the benchmark process was out of
fds, accept() failed, the proxy stopped accepting, and every later request hung (the rclone "hangs" of
docs/notes/hotblocks.md run 7).
"""

from __future__ import annotations

import os
import socket
import threading
import time

from tests.support.delayproxy import DelayProxy


def _echo_server() -> tuple[socket.socket, threading.Event]:
    """A server that answers each connection's first chunk and then closes it."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                if data := c.recv(1024):
                    c.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, stop


def test_the_proxy_closes_each_connection_once_both_ends_are_done() -> None:
    srv, stop = _echo_server()
    proxy = DelayProxy(srv.getsockname(), delay_ms=0).start()
    try:
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(300):
            with socket.create_connection(("127.0.0.1", proxy.port)) as c:
                c.sendall(b"GET / HTTP/1.1\r\n\r\n")
                assert c.recv(1024).startswith(b"GET")
        # the last few may still be closing
        deadline = time.time() + 5
        while len(os.listdir("/proc/self/fd")) > fds + 8 and time.time() < deadline:
            time.sleep(0.05)
        assert len(os.listdir("/proc/self/fd")) <= fds + 8, "the proxy keeps the sockets of ended connections"
        assert proxy.requests == 300
    finally:
        proxy.stop()
        stop.set()
        srv.close()
