"""Freshness of signed documents: a replayed older one is refused by a reader that saw a newer one.

A signature says who wrote a document, not when: a store writer without the key could keep the bytes
of an old signed `latest` (or any ref replaced in place) and put them back later, and every verifying
reader used the older checkpoint or env. So a signed document carries `seq`, a number its writer
makes above the one of the document it replaces (its signing time, or just above the replaced one's
when the writer's clock is behind: clocks differ between nodes). A reader keeps, in its node cache,
the highest `seq` it has used per store, domain and path, and refuses a lower one (a miss, with a
warning). A node that never saw the newer document cannot tell; every node that did, can.

The marks are small files below the node cache root, which its user (or another user, when root
reads) may write: they are read and written only through no-follow directory descriptors (`cachedir`),
non-blocking and capped, and replaced by unguessable temporaries renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

SEQ_FIELD = "seq"
MARK_MAX = 64  # a float's text
SEEN_DIR = "seen"


def next_seq(replaced: bytes | None) -> float:
    """The `seq` of a document that replaces the raw document `replaced` (None: a new one)."""
    now = time.time()
    prev = seq_of_raw(replaced)
    return max(now, prev + 0.001) if prev is not None else now


def seq_of_raw(data: bytes | None) -> float | None:
    if not data:
        return None
    import json

    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return seq_of(doc) if isinstance(doc, dict) else None


def seq_of(doc: Mapping[str, object]) -> float | None:
    v = doc.get(SEQ_FIELD)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Seen:
    """The highest `seq` used per (store, domain, path) on this node, below `root` (the node cache)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _name(self, uri: str, domain: str, rel: str) -> Path:
        h = hashlib.sha256(f"{uri}\0{domain}\0{rel}".encode()).hexdigest()[:40]
        return self.root / SEEN_DIR / h[:2] / h

    def stale(self, uri: str, domain: str, rel: str, doc: Mapping[str, object]) -> str:
        """Why `doc` is older than one this node used ("" when it is not), recording it when newer.

        A mark that cannot be read or written is no mark: freshness never stops a start."""
        seq = seq_of(doc)
        dest = self._name(uri, domain, rel)
        high = self._read(dest)
        if high is not None and (seq is None or seq < high):
            return f"older (seq {seq or 0:.3f}) than one this node already used (seq {high:.3f}): a replay?"
        if seq is not None and (high is None or seq > high):
            from .errors import StoreError

            with contextlib.suppress(OSError, StoreError):
                self._write(dest, seq)
        return ""

    def _read(self, dest: Path) -> float | None:
        from .errors import StoreError
        from .store.cachedir import open_regular, parent_fd

        try:
            with parent_fd(dest, self.root, create=False) as dfd:
                fd = open_regular(dest.name, dfd)
                try:
                    return float(os.read(fd, MARK_MAX).decode())
                finally:
                    os.close(fd)
        except (OSError, ValueError, StoreError):  # StoreError: a link or another user's directory on the way
            return None

    def _write(self, dest: Path, seq: float) -> None:
        from .store.cachedir import parent_fd

        with parent_fd(dest, self.root) as dfd:
            tmp = f".{dest.name}.{secrets.token_hex(8)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            try:
                try:
                    os.write(fd, repr(seq).encode())
                finally:
                    os.close(fd)
                os.rename(tmp, dest.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
