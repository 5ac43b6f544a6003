"""Where bootseer keeps node-local state. One place, so tests can move it with XDG_CACHE_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def configured_cache_root() -> Path:
    """Where the node-local root is meant to be (XDG_CACHE_HOME/bootseer), usable or not."""
    return Path(platformdirs.user_cache_dir("bootseer", appauthor=False))


def cache_root() -> Path:
    """The node-local root: blob cache, run directories, the embedded store.

    When the configured one is read-only or full, a private scratch directory for this process instead,
    with one warning (`nodedirs`): every stage that keeps a file there then works without the node cache
    rather than failing, each with its own warning, or keeping the job from starting."""
    from .nodedirs import usable_or_scratch

    configured = configured_cache_root()
    return usable_or_scratch(configured, "cache") or configured


def default_store_uri() -> str:
    return (cache_root() / "store").as_uri()


def blob_cache_dir() -> Path:
    return cache_root() / "blobs"


def runs_dir() -> Path:
    return cache_root() / "runs"


def runtime_dir() -> Path:
    """The private per-user runtime directory (for mount points): never a shared, predictable path.

    `$XDG_RUNTIME_DIR/bootseer` when the session has one (0700, the user's own); for root
    `/run/bootseer/<uid>`; for other users platformdirs' runtime dir (`/run/user/<uid>/bootseer`)
    when its parent exists, else a `runtime` directory under the user's own cache root. Created
    0700 (and checked) when a mount point under it is prepared (`stripe.mount.safe_mountpoint`).
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "bootseer"
    uid = os.geteuid()
    if uid == 0:
        return Path("/run/bootseer") / str(uid)
    user_run = Path(platformdirs.user_runtime_dir("bootseer", appauthor=False))
    return user_run if user_run.parent.is_dir() else cache_root() / "runtime"


def default_mountpoint() -> str:
    """`[checkpoint] mountpoint` when the config does not set one."""
    return str(runtime_dir() / "ckpt")
