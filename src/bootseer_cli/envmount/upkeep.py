"""The env capability's doctor line for mount mode: which env mode this node can use, and why not mount."""

from __future__ import annotations

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
        return [Check("env mode", "ok", f"mount ({methods[how]}); [env] mode = {wanted}{note}")]
    status = "warn" if wanted == "mount" else "ok"
    return [
        Check(
            "env mode",
            status,
            f"extract only: {why}; [env] mode = {wanted}",
            "install squashfuse and fuse-overlayfs (and give a container /dev/fuse) to mount envs",
        )
    ]
