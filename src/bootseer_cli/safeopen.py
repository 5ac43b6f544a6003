"""Files bootseer reads because a configuration names them: regular files only, never blocking, capped.

A config (`bootseer.toml`) or a file whose bytes go into the env key (`[env] files`, the setup's
requirements) may be chosen by someone other than the process that reads it: a job's user, for the
Slurm prolog's prefetch. `[env] files = ["/dev/zero"]` once kept that prefetch hashing until its
timeout, and a FIFO would block its `open` for ever. So such a file is opened `O_NONBLOCK` (a FIFO
or a device opens at once), `fstat`ed, and refused unless it is a regular file; a config is also
capped in size (it is parsed in memory).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

CONFIG_MAX_BYTES = 1 << 20  # a bootseer.toml is a few kB; this bounds what a parse can be made to hold
FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(path: str | os.PathLike[str]) -> int:
    """A descriptor of `path` if it is a regular file; OSError (with a readable strerror) otherwise."""
    fd = os.open(path, FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket is never read)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(path: str | os.PathLike[str], cap: int = CONFIG_MAX_BYTES) -> bytes:
    """The bytes of regular file `path`, refused (OSError EFBIG) when it holds more than `cap`."""
    fd = open_regular(path)
    try:
        chunks, n = [], 0
        while chunk := os.read(fd, 1 << 16):
            n += len(chunk)
            if n > cap:
                raise OSError(errno.EFBIG, f"larger than {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def sha256_regular(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of regular file `path` (a device or FIFO is refused, not read)."""
    fd = open_regular(path)
    try:
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)
