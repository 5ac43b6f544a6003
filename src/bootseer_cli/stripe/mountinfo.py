"""What is mounted where (/proc/self/mountinfo) and which fusermount unmounts it.

Its own module, below both the stripe mount (mount.py) and the writable view over it (overlay.py):
each asks what sits at a mount point and takes the other down, so the two would otherwise import
each other.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def _unescape(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_info(mountpoint: str | Path) -> dict[str, str] | None:
    """The mountinfo entry at `mountpoint` (the last, i.e. topmost), or None."""
    mp = os.path.abspath(mountpoint)
    found = None
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and _unescape(fields[4]) == mp:
                found = {"dev": fields[2], "fstype": rfields[0] if rfields else "", "source": _unescape(rfields[1])}
    return found


def fusermount() -> str:
    """The fusermount that unmounts a FUSE mount of this user (libfuse 3's, else 2's)."""
    return shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
