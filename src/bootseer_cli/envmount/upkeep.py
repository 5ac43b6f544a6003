"""The env capability's doctor line for mount mode: which env mode this node can use, and why not mount."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..upkeep import Check

if TYPE_CHECKING:
    from ..settings import Settings


def doctor(settings: Settings) -> list[Check]:
    """`env mode`: mount with the kernel's driver, mount through FUSE, or extract only (and why)."""
    from .image import missing_builder
    from .mounts import method_here

    how, why = method_here()
    wanted = settings.env.mode
    build = missing_builder()
    note = f"; a builder here cannot make images ({build})" if build else ""
    methods = {"kernel": "kernel squashfs on a loop device + overlayfs", "fuse": "FUSE: squashfuse + fuse-overlayfs"}
    if how:
        return [Check("env mode", "ok", f"mount ({methods[how]}); [env] mode = {wanted}{note}"), *_lowers()]
    status = "warn" if wanted == "mount" else "ok"
    return [
        Check(
            "env mode",
            status,
            f"extract only: {why}; [env] mode = {wanted}",
            "install squashfuse and fuse-overlayfs (and give a container /dev/fuse) to mount envs",
        )
    ]


def _lowers() -> list[Check]:
    """The images this node cache keeps mounted for its next starts (lowers.py), when there are any:
    mounts that outlive the jobs should not surprise whoever cleans the node."""
    from .lowers import IDLE_S, lowers_root
    from .mounts import mount_info

    root = lowers_root()
    try:
        names = [n for n in os.listdir(root) if not n.startswith(".") and not n.endswith(".json")]
    except OSError:
        return []
    mounted = [n for n in names if mount_info(str(root / n)) is not None]
    if not mounted:
        return []
    detail = (
        f"{len(mounted)} image(s) kept mounted at {root} for this node's next starts (their pages stay "
        f"decompressed); a start unmounts one no run has used for {IDLE_S / 3600:.0f} h (unmount them before "
        "removing the node cache by hand)"
    )
    return [Check("env images", "ok", detail)]
