"""Which libfuse mfusepy loads: libfuse3, where a node has both.

mfusepy looks for libfuse2 first when `FUSE_LIBRARY_PATH` is unset, and a node with Debian's s3fs (or
any FUSE 2 program) installed has both. bootseer's mount options (`max_threads`, `max_read`) are
libfuse3's, so with libfuse2 loaded every mount failed ("unknown option"). bootseer loads mfusepy
only through `load_mfusepy`.
"""

from __future__ import annotations

import ctypes.util
import os
from types import ModuleType


def prefer_libfuse3() -> None:
    """Point mfusepy at libfuse3 unless the user chose a library (`FUSE_LIBRARY_PATH`)."""
    if "FUSE_LIBRARY_PATH" in os.environ:
        return
    lib = ctypes.util.find_library("fuse3")
    if lib:
        os.environ["FUSE_LIBRARY_PATH"] = lib


def load_mfusepy() -> ModuleType:
    """mfusepy, loaded over libfuse3 where there is one."""
    prefer_libfuse3()
    import mfusepy

    return mfusepy
