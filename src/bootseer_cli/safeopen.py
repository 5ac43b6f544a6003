"""Files bootseer reads because a configuration names them: regular files only, never blocking, capped.

A config (`bootseer.toml`) or a file whose bytes go into the env key (`[env] files`, the setup's
requirements) may be chosen by someone other than the process that reads it: a job's user, for the
Slurm prolog's prefetch. `[env] files = ["/dev/zero"]` once kept that prefetch hashing until its
timeout, and a FIFO would block its `open` for ever. So such a file is opened `O_NONBLOCK` (a FIFO
or a device opens at once), `fstat`ed, and refused unless it is a regular file; a config is also
capped in size (it is parsed in memory). Key and secret files are read the same way, and also never
through a link (`follow=False`), and a secret only when no one else may read it (`private=True`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable

CONFIG_MAX_BYTES = 1 << 20  # a bootseer.toml is a few kB; this bounds what a parse can be made to hold
FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(
    path: str | os.PathLike[str],
    *,
    follow: bool = True,
    private: bool = False,
    check: Callable[[os.stat_result], None] | None = None,
) -> int:
    """A descriptor of `path` if it is a regular file; OSError (with a readable strerror) otherwise.

    `follow=False` refuses a link at the last component (ELOOP); `private=True` refuses a file whose
    mode lets its group or others read or write it (a secret others can read is not one); `check` sees
    the descriptor's status (the file actually read, not the one a path named a moment before) and
    raises to refuse it."""
    fd = os.open(path, FLAGS | (0 if follow else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket is never read)")
        if private and st.st_mode & 0o077:
            raise OSError(errno.EACCES, "readable by others (chmod 600 it)")
        if check is not None:
            check(st)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(
    path: str | os.PathLike[str],
    cap: int = CONFIG_MAX_BYTES,
    *,
    follow: bool = True,
    private: bool = False,
    check: Callable[[os.stat_result], None] | None = None,
) -> bytes:
    """The bytes of regular file `path`, refused (OSError EFBIG) when it holds more than `cap`."""
    fd = open_regular(path, follow=follow, private=private, check=check)
    try:
        chunks, n = [], 0
        while chunk := os.read(fd, 1 << 16):
            n += len(chunk)
            if n > cap:
                raise OSError(errno.EFBIG, f"more than {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def sha256_and_head(path: str | os.PathLike[str], head: int) -> tuple[str, bytes]:
    """Hex sha256 of regular file `path` and its first `head + 1` bytes (one read of the file: a
    requirement file is hashed for a key and parsed for what it includes)."""
    fd = open_regular(path)
    try:
        h, kept = hashlib.sha256(), b""
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            if len(kept) <= head:
                kept += chunk[: head + 1 - len(kept)]
        return h.hexdigest(), kept
    finally:
        os.close(fd)
