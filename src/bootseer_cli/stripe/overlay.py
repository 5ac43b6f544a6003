"""The writable checkpoint directory: an overlay over the read-only stripe mount.

A trainer resumes from `out_dir/ckpt.pt` (or `checkpoint-N/`, `last.ckpt`) and saves the next one into
the same directory, so `$BOOTSEER_CKPT_DIR` must take writes. Why an overlay rather than write-back
inside our own FUSE server: the lower layer is the read-only stripe mount (fusefs.py), so a resume
reads the restored checkpoint from the stripes through the very same page cache and read-ahead as
the plain mount; the upper layer is a directory on local disk, so a save is a write to local disk
by the kernel (kernel overlayfs, for root) or by fuse-overlayfs's C code (a plain user), never a
copy through Python. The upper directory is then exactly "what the job wrote" (its files, and
whiteouts for what it deleted), which is what the write-back push (writeback.py) needs, without a
journal of writes of our own.

Mount options for the kernel overlay: `redirect_dir=off` (renaming a restored directory fails with
EXDEV, which `mv` and `shutil.move` answer with a copy, so the upper directory never holds an xattr
redirect the write-back would have to follow), `metacopy=off` (an upper file
always holds its data), `index=off` and `xino=off` (no state outside the upper and work dirs).

The upper and work directories live under `<cache root>/ckpt-write/<run id>/` (local disk, 0700,
beside the write-back's journal); the overlay's mount point is the run's checkpoint directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import BootseerError

SOURCE = "bootseer-ckpt-rw"  # the kernel overlay's source in mountinfo: how a sweep knows it is ours
FUSE_OVERLAY = "fuse.fuse-overlayfs"  # has no fsname option: known by its type, at our own mount points
KERNEL_OPTIONS = "redirect_dir=off,metacopy=off,index=off,xino=off"
MOUNT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class WriteDirs:
    """One run's local-disk side of the writable view: `upper`, `work`, and the write-back journal."""

    root: Path

    @property
    def upper(self) -> Path:
        return self.root / "upper"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def journal(self) -> Path:
        return self.root / "journal.json"


def write_root() -> Path:
    """Where every run's write-back directory lives (the node's cache root: local disk, this user's)."""
    from ..paths import cache_root

    return cache_root() / "ckpt-write"


def write_dirs(run: str, overlay: bool = True) -> WriteDirs:
    """This run's write-back directory, created private (0700, no link followed on the way), with the
    overlay's upper and work directories unless `overlay` is False (a pull: the journal alone)."""
    from ..paths import make_private_dir

    root = make_private_dir(write_root() / run)
    for d in ("upper", "work") if overlay else ():
        with contextlib.suppress(FileExistsError):
            os.mkdir(root / d, 0o700)
    return WriteDirs(root)


def overlay_missing(euid: int | None = None) -> str:
    """Why no writable overlay can be made here ("" when one can): root uses the kernel's, a plain
    user fuse-overlayfs (a Debian package)."""
    if (os.geteuid() if euid is None else euid) == 0:
        return ""
    if shutil.which("fuse-overlayfs") is None:
        return "fuse-overlayfs is not installed (apt-get install fuse-overlayfs)"
    return ""


def is_overlay(info: dict[str, str] | None) -> bool:
    """A writable checkpoint view of bootseer's: a kernel overlay by its source, fuse-overlayfs by its
    type (asked only of this run's mount point or a run's private `ckpt-<run id>`)."""
    return bool(info) and (info["source"].startswith(SOURCE) or info["fstype"] == FUSE_OVERLAY)  # type: ignore[index]


def mount_overlay(lower: str, dirs: WriteDirs, mountpoint: str, above: tuple[str, ...] = ()) -> str:
    """Mount the writable view at `mountpoint`; returns the mount's device number (mountinfo major:minor).
    `above`: read-only directories stacked over `lower`, the first on top (kept.py's local copy).

    Root tries the kernel's overlayfs first, then fuse-overlayfs where installed (the kernel refuses an
    upper directory on an overlayfs, e.g. a container's root filesystem; fuse-overlayfs takes it).
    Paths go into one comma-separated option string, so a path holding ',' or ':' is refused rather
    than quoted (they are ours: the runtime and cache directories, and the configured mount point)."""
    paths = [*above, lower, str(dirs.upper), str(dirs.work), mountpoint]
    if any(c in p for p in paths for c in ",:"):
        raise BootseerError(f"cannot overlay {mountpoint}: a path holds ',' or ':'")
    opts = f"lowerdir={':'.join([*above, lower])},upperdir={dirs.upper},workdir={dirs.work}"
    attempts = [["fuse-overlayfs", "-o", opts, mountpoint]]
    if os.geteuid() == 0:
        kernel = ["mount", "-t", "overlay", "-o", f"{opts},{KERNEL_OPTIONS}", SOURCE, mountpoint]
        attempts = [kernel] + (attempts if shutil.which("fuse-overlayfs") else [])
    why = ""
    for argv in attempts:
        dev, why = _try_mount(argv, mountpoint)
        if dev:
            return dev
    raise BootseerError(f"cannot overlay {mountpoint}: {why}")


def _try_mount(argv: list[str], mountpoint: str) -> tuple[str, str]:
    """(device number, "") when `argv` mounted our overlay at `mountpoint`, else ("", why)."""
    from .mountinfo import fusermount as _fusermount
    from .mountinfo import mount_info

    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return "", str(e)
    info = mount_info(mountpoint)
    if r.returncode == 0 and is_overlay(info):
        return info["dev"], ""  # type: ignore[index]
    if info is not None:  # something did appear: not left over the mount point the pull falls back to
        for undo in ([_fusermount(), "-uz"], ["umount", "-l"]):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([*undo, mountpoint], capture_output=True, timeout=MOUNT_TIMEOUT_S)
    lines = (r.stderr or r.stdout).strip().splitlines()
    return "", lines[-1] if lines else f"{argv[0]} exit {r.returncode}"


def umount_overlay(mountpoint: str, dev: str = "") -> bool:
    """Unmount the writable view at `mountpoint` (only the one with device `dev`, when given); False
    when it is not there. A normal unmount first, then a lazy one (a process still in the directory)."""
    from .mountinfo import fusermount as _fusermount
    from .mountinfo import mount_info

    info = mount_info(mountpoint)
    if not is_overlay(info) or (dev and info["dev"] != dev):  # type: ignore[index]
        return False
    fuse = info["fstype"].startswith("fuse")  # type: ignore[index]
    attempts = [[_fusermount(), "-u"], [_fusermount(), "-uz"]] if fuse else [["umount"], ["umount", "-l"]]
    for argv in attempts:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([*argv, mountpoint], capture_output=True, timeout=MOUNT_TIMEOUT_S)
        for _ in range(50):
            now = mount_info(mountpoint)
            if now is None or now["dev"] != info["dev"]:  # type: ignore[index]
                return True
            time.sleep(0.02)
    raise BootseerError(f"cannot unmount the checkpoint overlay at {mountpoint}")
