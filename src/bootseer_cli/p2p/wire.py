"""Messages between bootseer and its swarm helper: JSON headers, raw payloads, file descriptors.

A frame is `>II` (header length, payload length), a JSON object, then the payload bytes (a torrent,
a piece). File descriptors travel as SCM_RIGHTS with the first bytes of their frame; the reader
queues them in arrival order and a header says how many it carries. JSON, never pickle: the helper
is the less trusted side, and what it says must not be able to run code in the root process.
Sizes are capped on read, so a confused or hostile peer of the socket cannot make us allocate much.
"""

from __future__ import annotations

import array
import json
import socket
import struct
from collections import deque
from typing import Any

HEAD = struct.Struct(">II")
MAX_HEADER = 4 << 20
MAX_PAYLOAD = 64 << 20
MAX_FDS = 8
BIG_PAYLOAD = 64 << 10


class WireError(OSError):
    """The other side closed the channel or broke the framing."""


class Channel:
    """One end of a socketpair, framed (not thread-safe: callers hold their own lock)."""

    def __init__(self, sock: socket.socket, max_header: int = MAX_HEADER, max_payload: int = MAX_PAYLOAD) -> None:
        self.sock = sock
        self.max_header, self.max_payload = max_header, max_payload
        self.buf = bytearray()
        self.fds: deque[int] = deque()

    def send(self, header: dict[str, Any], payload: bytes = b"", fds: tuple[int, ...] = ()) -> None:
        head = json.dumps(header, separators=(",", ":")).encode()
        frame = HEAD.pack(len(head), len(payload)) + head
        if fds:
            socket.send_fds(self.sock, [frame[:1]], list(fds))
            frame = frame[1:]
        self.sock.sendall(frame)
        if payload:
            self.sock.sendall(payload)

    def _fill(self, need: int) -> None:
        while len(self.buf) < need:
            fds = array.array("i")
            data, anc, _flags, _addr = self.sock.recvmsg(
                max(need - len(self.buf), 1 << 16), socket.CMSG_SPACE(MAX_FDS * fds.itemsize)
            )
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
            self.fds.extend(fds)
            if not data:
                raise WireError("the swarm channel closed")
            self.buf += data

    def _payload(self, plen: int) -> bytes:
        """The frame's payload, the buffer holding what follows the header. A big one (a piece) is read
        straight into its own buffer: no growing of `buf`, no copies of slices of it."""
        if plen <= len(self.buf) or plen < BIG_PAYLOAD:
            self._fill(plen)
            payload = bytes(self.buf[:plen])
            del self.buf[:plen]
            return payload
        out = bytearray(plen)
        view = memoryview(out)
        got = len(self.buf)
        view[:got] = self.buf
        self.buf.clear()
        while got < plen:  # exactly the payload: the next frame's bytes (and descriptors) stay queued
            n = self.sock.recv_into(view[got:], plen - got)
            if not n:
                raise WireError("the swarm channel closed")
            got += n
        return bytes(out)

    def recv(self) -> tuple[dict[str, Any], bytes, list[int]]:
        """The next frame: header, payload, and the descriptors its header says it carries."""
        self._fill(HEAD.size)
        hlen, plen = HEAD.unpack_from(self.buf)
        if hlen > self.max_header or plen > self.max_payload:
            raise WireError(f"a swarm frame of {hlen}+{plen} bytes is over the limit")
        self._fill(HEAD.size + hlen)
        raw = bytes(self.buf[HEAD.size : HEAD.size + hlen])
        del self.buf[: HEAD.size + hlen]
        payload = self._payload(plen) if plen else b""
        try:
            header = json.loads(raw)
        except ValueError:
            raise WireError("a swarm frame's header is not JSON") from None
        if not isinstance(header, dict):
            raise WireError("a swarm frame's header is not an object")
        n = header.get("fds", 0)
        if not isinstance(n, int) or not 0 <= n <= MAX_FDS or n > len(self.fds):
            raise WireError("a swarm frame names descriptors it did not carry")
        return header, payload, [self.fds.popleft() for _ in range(n)]

    def close(self) -> None:
        self.sock.close()
