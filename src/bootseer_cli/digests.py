"""sha256 of files and streams: the one digest bootseer trusts blobs, stripes and cache entries by."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")


def is_digest(v: object) -> bool:
    """Whether `v` is a sha256 digest as bootseer writes them: 64 lowercase hex digits."""
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX


def sha256_file(path: str | os.PathLike[str] | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
