"""Where bootseer keeps node-local state. One place, so tests can move it with XDG_CACHE_HOME."""

from __future__ import annotations

from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """The node-local root: blob cache, run directories, the embedded store."""
    return Path(platformdirs.user_cache_dir("bootseer", appauthor=False))


def default_store_uri() -> str:
    return (cache_root() / "store").as_uri()


def blob_cache_dir() -> Path:
    return cache_root() / "blobs"


def runs_dir() -> Path:
    return cache_root() / "runs"
