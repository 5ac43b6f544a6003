"""Which directories hold an image's hot blocks, and whether this process may record them.

The roots are `[image] roots`, or the places a training start reads from the image: the
interpreter's prefix (and its base, for a venv), the system library directories, and CUDA's when
present. Only the directories that exist here are returned, each once.

Recording needs the truth from `mincore`, which the kernel hides from a caller that neither owns a
file nor may write it (see pagecache.py): `prepare_recording` walks the roots and says why a record
would be refused, before anything is evicted or run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .pagecache import FileInfo, untrusted_files, walk_files

if TYPE_CHECKING:
    from ..settings import ImageSettings

SYSTEM_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")


def default_roots() -> list[str]:
    """The directories a Python training start reads from when `[image] roots` is not set."""
    candidates = [sys.prefix, sys.base_prefix, *SYSTEM_LIB_DIRS]
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidates.append(cuda)
    return _existing(candidates)


def resolve_roots(image: ImageSettings, override: Sequence[str] | None = None) -> list[str]:
    """The roots to record or replay: `override` (e.g. `--root`), else `[image] roots`, else the defaults."""
    roots = override or image.roots
    return _existing([os.path.expanduser(r) for r in roots]) if roots else default_roots()


def _existing(paths: list[str]) -> list[str]:
    """Existing paths, absolute, deduplicated by their real path (/lib is /usr/lib on merged /usr)."""
    out: list[str] = []
    seen: set[str] = set()
    for p in paths:
        real = os.path.realpath(p)
        if real in seen or not os.path.exists(real):
            continue
        seen.add(real)
        out.append(os.path.abspath(p))
    return out


def refusal(files: list[FileInfo], untrusted: list[FileInfo]) -> str:
    """The one-line reason an unprivileged record is refused (what mincore would do, and the fixes)."""
    return (
        f"not recording hot blocks as uid {os.geteuid()}: for files one neither owns nor may write, the kernel's "
        f"mincore reports every page resident ({len(untrusted)} of {len(files)} files under the roots, e.g. "
        f"{untrusted[0].path}); run as root, or set [image] roots to directories this user owns"
    )


def prepare_recording(roots: list[str]) -> tuple[list[FileInfo], str | None]:
    """Walk the roots and check the privilege; returns (files, refusal or None)."""
    files = list(walk_files(roots))
    bad = untrusted_files(files)
    return files, (refusal(files, bad) if bad else None)
