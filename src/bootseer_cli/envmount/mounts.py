"""Mounting an env image: the read-only lower (squashfs) and the writable overlay over it at a root.

The lower: root uses the kernel's squashfs driver on a loop device (`mount -o loop`: the fastest
reads, the page cache shared with every process), and falls back to FUSE where the kernel refuses
(no loop device in a container); a plain user mounts it with `squashfuse_ll` (or `squashfuse`).
The overlay: root uses the kernel's overlayfs, then `fuse-overlayfs` where the kernel refuses the
upper directory (a node cache on a container's overlayfs root); a plain user uses fuse-overlayfs.
The kernel overlay's source is `bootseer-env-rw`; every mount is also known by its device number
(mountinfo's major:minor), recorded when it is made, so a teardown never unmounts what another run
mounted at the same path later (ideas from stripe/overlay.py, which does the same for checkpoints).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time

from ..errors import BootseerError

SOURCE_RW = "bootseer-env-rw"
KERNEL_OVERLAY_OPTIONS = "index=off,xino=off,metacopy=off,redirect_dir=off"
MOUNT_TIMEOUT_S = 30.0


def mount_info(mountpoint: str) -> dict[str, str] | None:
    from ..stripe.mountinfo import mount_info as info

    return info(mountpoint)


def _fusermount() -> str:
    return shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"


def _squashfuse() -> str | None:
    return shutil.which("squashfuse_ll") or shutil.which("squashfuse")


def _kernel_has(fs: str) -> bool:
    """`fs` in /proc/filesystems (a module not loaded yet may still load: the mount then says)."""
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == fs for line in f if line.strip())
    except OSError:
        return False


def fuse_missing() -> str:
    """Why a FUSE mount of the image cannot be made here ("" when it can)."""
    if _squashfuse() is None:
        return "squashfuse is not installed (apt-get install squashfuse)"
    if shutil.which("fuse-overlayfs") is None:
        return "fuse-overlayfs is not installed (apt-get install fuse-overlayfs)"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount is not installed (apt-get install fuse3)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        return f"/dev/fuse cannot be opened ({e.strerror}; a container needs --device /dev/fuse)"
    return ""


def kernel_missing() -> str:
    """Why the kernel's squashfs driver on a loop device cannot be used here ("" when it can)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("mount") is None:
        return "mount is not installed"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control)"
    if not _kernel_has("squashfs") or not _kernel_has("overlay"):
        return "the kernel lists no squashfs or overlay filesystem"
    return ""


def method_here() -> tuple[str, str]:
    """("kernel" | "fuse", "") for how this node would mount an env image, or ("", why not)."""
    k = kernel_missing()
    if not k:
        return "kernel", ""
    f = fuse_missing()
    return ("fuse", "") if not f else ("", f if k == "not root" else f"{k}; {f}")


def _run(argv: list[str]) -> str:
    """Run a mount command; "" on success, else its last line of output."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if r.returncode == 0:
        return ""
    lines = (r.stderr or r.stdout).strip().splitlines()
    return lines[-1] if lines else f"{argv[0]} exit {r.returncode}"


def _mounted(argv: list[str], mountpoint: str, before: str | None) -> tuple[str, str]:
    """(device, "") when `argv` made a new mount at `mountpoint`, else ("", why); a half-made one is undone."""
    why = _run(argv)
    info = mount_info(mountpoint)
    dev = info["dev"] if info is not None and info["dev"] != before else ""
    if not why and dev:
        return dev, ""
    if dev:
        umount(mountpoint, dev)
    return "", why or f"{argv[0]} made no mount at {mountpoint}"


def mount_lower(image: str, lower: str) -> tuple[str, str]:
    """Mount `image` read-only at `lower`: (device, "kernel" | "fuse"); raises with every reason."""
    before = (mount_info(lower) or {}).get("dev")
    reasons = []
    if not kernel_missing():
        dev, why = _mounted(["mount", "-t", "squashfs", "-o", "loop,ro,nodev,nosuid", image, lower], lower, before)
        if dev:
            return dev, "kernel"
        reasons.append(f"kernel: {why}")
    fm = fuse_missing()
    if not fm:
        dev, why = _mounted([_squashfuse() or "squashfuse", image, lower], lower, before)
        if dev:
            return dev, "fuse"
        reasons.append(f"squashfuse: {why}")
    else:
        reasons.append(fm)
    raise BootseerError("; ".join(reasons))


def mount_overlay(lowerdirs: list[str], upper: str, work: str, mountpoint: str) -> tuple[str, str]:
    """The writable view at `mountpoint` over `lowerdirs` (top first): (device, "kernel" | "fuse");
    raises with every reason."""
    paths = [*lowerdirs, upper, work, mountpoint]
    if any(c in p for p in paths for c in ",:"):
        raise BootseerError(f"cannot overlay {mountpoint}: a path holds ',' or ':'")
    opts = f"lowerdir={':'.join(lowerdirs)},upperdir={upper},workdir={work}"
    attempts: list[tuple[str, list[str]]] = []
    if os.geteuid() == 0:
        kernel = ["mount", "-t", "overlay", "-o", f"{opts},{KERNEL_OVERLAY_OPTIONS}", SOURCE_RW, mountpoint]
        attempts.append(("kernel", kernel))
    if shutil.which("fuse-overlayfs"):
        attempts.append(("fuse", ["fuse-overlayfs", "-o", opts, mountpoint]))
    before = (mount_info(mountpoint) or {}).get("dev")
    reasons = []
    for how, argv in attempts:
        dev, why = _mounted(argv, mountpoint, before)
        if dev:
            return dev, how
        reasons.append(f"{argv[0]}: {why}")
    raise BootseerError(f"cannot overlay {mountpoint}: {'; '.join(reasons) or 'fuse-overlayfs is not installed'}")


def devices_at(mountpoint: str) -> list[str]:
    """The devices mounted at `mountpoint`, bottom to top (two runs' overlays can stack on one root)."""
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" - ")[0].split()
            if len(fields) >= 5 and fields[4].replace("\\040", " ") == mountpoint:
                out.append(fields[2])
    return out


def umount(mountpoint: str, dev: str) -> bool:
    """Unmount the mount with device `dev` at `mountpoint` (only that one: what another run mounted there
    since is left alone); False when it is not there; raises while another mount covers it (a later
    run's overlay stacked on the same root), so the caller keeps its record. Normal unmount, then lazy."""
    if dev not in devices_at(mountpoint):
        return False
    info = mount_info(mountpoint)
    if info is None or info["dev"] != dev:
        raise BootseerError(f"{mountpoint}: covered by a later mount; taken down once that one is gone")
    fuse = info["fstype"].startswith("fuse")
    attempts = [[_fusermount(), "-u"], [_fusermount(), "-uz"]] if fuse else [["umount"], ["umount", "-l"]]
    for argv in attempts:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([*argv, mountpoint], capture_output=True, timeout=MOUNT_TIMEOUT_S, cwd="/")
        for _ in range(100):
            now = mount_info(mountpoint)
            if now is None or now["dev"] != dev:
                return True
            time.sleep(0.02)
    raise BootseerError(f"cannot unmount {mountpoint}")
