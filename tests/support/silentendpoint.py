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
