"""A loopback TCP forwarder that slows what clients send (an upload over a slow link), for real.

proxy = Throttle(("127.0.0.1", server_port), up_bps=256_000).start()   # clients use proxy.port
Responses travel at full speed; requests (a PUT's body) at `up_bps` bytes per second per connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

CHUNK = 16 << 10


class Throttle:
    def __init__(self, upstream: tuple[str, int], up_bps: int) -> None:
        self.upstream = upstream
        self.up_bps = up_bps
        self.port = 0
        self._listener: socket.socket | None = None

    def start(self) -> Throttle:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        self.port = s.getsockname()[1]
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, up, self.up_bps), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, 0), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, bps: int) -> None:
        t0, sent = time.monotonic(), 0
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
                sent += len(data)
                if bps:
                    ahead = sent / bps - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
