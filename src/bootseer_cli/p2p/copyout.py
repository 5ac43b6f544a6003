"""Copying a blob out of the swarm helper's download into the node cache, hashed as it is written.

The helper (unprivileged) owns its download and can write it at any time, so bootseer never uses
that file: it reads it through a descriptor opened without following links, writes its own copy in
the cache and hashes exactly the bytes it wrote. The copy goes into the cache under the blob's
digest only when that hash is the digest.

The node cache may be a directory its user can write while root fetches into it, so the copy (and the
torrent kept beside it) is written as every node-cache writer writes (`cachedir`): into the fan-out
directory entered without following a link and checked as ours, under an O_EXCL temporary name, then
renamed in place within that directory. A planted `sha256/<xx> -> /etc/cron.d` is refused, not followed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StoreError

if TYPE_CHECKING:
    from ..store.cache import BlobCache
    from .remote import RemoteHandle, RemoteSwarm


RUN_BYTES = 8 << 20  # one read, hash and write per run of contiguous pieces, up to this much
FRESH_S = 0.3  # a piece map offered by the fetch loop younger than this is used instead of asking again


class PrefixCopier(threading.Thread):
    """Our copy of the blob while it arrives: reads the contiguous prefix of verified pieces from the
    helper's download (a descriptor opened without following links), writes it to a temporary file in
    the cache and hashes what it wrote, so the check at the end has little left to do (the store path
    hashes while it streams; without this the swarm path would pay a full extra pass).

    Each byte is read once (into one reused buffer, in runs of up to RUN_BYTES), hashed from that
    buffer and written from it. The piece map comes from the fetch loop (`offer`), which asks the
    helper anyway: one status request per round instead of two; without a recent offer it asks itself."""

    def __init__(self, swarm: RemoteSwarm, handle: RemoteHandle, cache: BlobCache, digest: str) -> None:
        super().__init__(name="prefix-copy", daemon=True)
        self.swarm, self.handle, self.cache, self.digest = swarm, handle, cache, digest
        ti = handle.torrent_file()
        self.n, self.plen, self.size = ti.num_pieces(), ti.piece_length(), ti.total_size()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self._offered: tuple[float, Sequence[bool]] | None = None
        self._wake = threading.Event()
        self._buf = memoryview(bytearray(max(self.plen, RUN_BYTES - RUN_BYTES % self.plen)))
        self.dfd = cache.dir_fd(digest)  # no-follow, ours (UnsafeCacheDir otherwise); closed by adopt/discard
        self.tmp = f".{digest}.p2p-{uuid.uuid4().hex[:8]}"
        try:
            fd = os.open(
                self.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self.dfd
            )
        except BaseException:
            os.close(self.dfd)
            raise
        self.out = os.fdopen(fd, "r+b", buffering=0)  # closed by adopt/discard
        self.src: int | None = None
        self._reset()

    def _reset(self) -> None:
        self.h = hashlib.sha256()
        self.next = 0
        self.out.seek(0)
        self.out.truncate()

    def offer(self, have: Sequence[bool]) -> None:
        """The piece map the fetch loop just got from the helper."""
        self._offered = (time.monotonic(), have)
        self._wake.set()

    def _advance(self, have: Sequence[bool]) -> None:
        with self.lock:
            if self.next >= self.n or not have[self.next]:
                return
            if self.src is None:
                self.src = self.swarm.open_download(self.handle)
            per_run = len(self._buf) // self.plen
            while self.next < self.n and have[self.next] and not self.stop.is_set():
                end = self.next + 1
                while end < self.n and end - self.next < per_run and have[end]:
                    end += 1
                want = min(end * self.plen, self.size) - self.next * self.plen
                view = self._buf[:want]
                got = os.preadv(self.src, [view], self.next * self.plen)
                # A short read (not yet on disk) is hashed as read: the check fails, `redo` reads again.
                self.h.update(view[:got])
                self._write(view[:got])
                self.next = end

    def _write(self, view: memoryview) -> None:
        while view:
            n = self.out.write(view)
            view = view[n or 0 :]

    def run(self) -> None:
        while self.next < self.n:
            self._wake.wait(0.1)
            self._wake.clear()
            if self.stop.is_set():
                return
            offered = self._offered
            # The file may not exist yet (OSError), the helper may fail a request (RuntimeError):
            # try again next round; `finish` copies whatever is left anyway.
            with contextlib.suppress(OSError, RuntimeError):
                if offered is not None and time.monotonic() - offered[0] < FRESH_S:
                    self._advance(offered[1])
                else:
                    self._advance(self.handle.status(pieces=True).pieces)

    def finish(self) -> str:
        self.stop.set()
        self._wake.set()
        self.join()
        self.stop.clear()
        self._advance([True] * self.n)
        return self.h.hexdigest()

    def redo(self) -> str:
        """Copy and hash the whole download again (after a flush), reopened."""
        with self.lock:
            if self.src is not None:
                os.close(self.src)
                self.src = None
            self._reset()
        self._advance([True] * self.n)
        return self.h.hexdigest()

    def _close(self) -> None:
        if self.src is not None:
            with contextlib.suppress(OSError):
                os.close(self.src)
            self.src = None
        self.out.close()

    def adopt(self) -> Path:
        """Into the cache, by the digest it was checked against (renamed within the fan-out directory)."""
        self._close()
        try:
            return self.cache.adopt_at(self.dfd, self.tmp, self.digest)
        finally:
            self._close_dir()

    def _close_dir(self) -> None:
        if self.dfd >= 0:
            os.close(self.dfd)
            self.dfd = -1

    def discard(self) -> None:
        self.stop.set()
        self._wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(10)
        with self.lock:
            self._close()
        if self.dfd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp, dir_fd=self.dfd)
            self._close_dir()


def keep_torrent(cache: BlobCache, tdigest: str, torrent: bytes) -> None:
    """The torrent is a blob too: cache it so the agent can seed without asking the store.

    Written as every node-cache writer writes (`cachedir`): its fan-out directory entered without
    following a link, an O_EXCL temporary there, renamed in place. A cache it cannot write safely
    (a planted link, another user's directory) only means the torrent is read from the store later."""
    if cache.get(tdigest) is not None:
        return
    try:
        dfd = cache.dir_fd(tdigest)
    except (StoreError, OSError):  # StoreError: UnsafeCacheDir
        return
    tmp = f".{tdigest}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        with os.fdopen(fd, "wb") as f:
            f.write(torrent)
        cache.adopt_at(dfd, tmp, tdigest)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
    finally:
        os.close(dfd)
