"""An overlay's upper directory as the kernel's overlayfs and fuse-overlayfs write it: their marks for
a deletion and an opaque directory, and a walk over it that follows no link. The write-back reads an
upper directory to push it (writeback.py); a node's kept save is one, checked before it is stacked
again (kept.py)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque")
WHITEOUT = ".wh."  # fuse-overlayfs's whiteout files where it cannot make a 0/0 device (a plain user)
OPAQUE_FILE = ".wh..wh..opq"


def walk(root: Path) -> Iterator[tuple[str, str, os.stat_result]]:
    """(relative path, name, lstat) of everything under `root`, parents first; links are not followed."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(root / rel_dir if rel_dir else root) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            st = e.stat(follow_symlinks=False)
            yield rel, e.name, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(rel)
