"""A fresh ext4 filesystem for each timed restore step (`bench_envsnap.py --vs-tar --fresh-fs`).

Why: a restore timed into a path whose previous tree was deleted a moment before measures ext4's
inode allocator more than the restore. ext4 skips free inodes whose deletion is recent
(`recently_deleted`: within 60 s, or 300 s more while the inode table block is dirty), one buffer
cache lookup per skipped inode, and each step deletes ~20k of them. On this machine that grew a
`tar -xf` of the torch venv from 1.6 s to 4.4 s over a few minutes of rounds (45 % of tar's CPU in
`find_get_block_common`/`recently_deleted`, perf), whichever method ran. A node restoring an env
has not just deleted 20k inodes under it; a fresh filesystem per step is that node, for every
method alike. The filesystem is a loop device over a file beside the benchmark's work; its inode
tables are initialised at mkfs, so no background initialisation runs during a step.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class FreshFs:
    """An ext4 image mounted at `mountpoint`, made anew by `renew()` (root only)."""

    SIZE = 6 << 30  # sparse: only what a step writes takes disk; a larger tree asks for more

    def __init__(self, image: Path, mountpoint: Path, size: int = SIZE) -> None:
        self.image, self.mountpoint, self.size = image, mountpoint, size

    def _umount(self) -> None:
        if os.path.ismount(self.mountpoint):
            subprocess.run(["umount", str(self.mountpoint)], check=True)

    def renew(self) -> None:
        """Unmount the last one, make an empty ext4 and mount it (no `lost+found`: an empty target)."""
        self._umount()
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        # A new file, not the old one reused: the last loop device detaches only after its umount
        # returns, and until then `mount -o loop` reuses it for the same file (its stale blocks: the
        # old filesystem, whose lost+found is gone) and mkfs would write under its cache. The old
        # file is emptied before it is unlinked, so its blocks are freed now, not when that loop
        # device lets the inode go, which would be during the next timed step.
        if self.image.exists():
            os.truncate(self.image, 0)
        self.image.unlink(missing_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size)
        mkfs = ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(self.image)]
        subprocess.run(mkfs, check=True)
        subprocess.run(["mount", "-o", "loop", str(self.image), str(self.mountpoint)], check=True)
        (self.mountpoint / "lost+found").rmdir()

    def close(self) -> None:
        self._umount()
        self.image.unlink(missing_ok=True)
