"""Which directories hold an image's hot blocks: `[image] roots`, or the places a training start reads.

The defaults are what a Python training job's start reads from the image: the interpreter's prefix
(and its base, for a venv), the system library directories, and CUDA's when present. Only the
directories that exist here are returned, each once.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SYSTEM_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")


def default_roots() -> list[str]:
    candidates = [sys.prefix, sys.base_prefix, *SYSTEM_LIB_DIRS]
    cuda = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidates.append(cuda)
    return _existing(candidates)


def resolve_roots(cfg: Any, override: list[str] | None = None) -> list[str]:
    roots = override or cfg.get("image", "roots")
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
