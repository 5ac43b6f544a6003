"""Where bootseer keeps node-local state. One place, so tests can move it with XDG_CACHE_HOME."""

from __future__ import annotations

import contextlib
import os
import stat
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


def store_flag_problem(value: str) -> str | None:
    """Why `--store VALUE` names no store, or None. A flag's value is checked before any stage runs: the
    fast parser took `bootseer exec --store -- CMD` as a store named `--`, and a bare relative path
    (`--store cache`) as a store that moves with the working directory, so every stage ran against a
    directory nobody meant (issue 46)."""
    if not value.strip() or value.startswith("-"):
        return "needs a store URI (file://…, s3://…, gs://…, hdfs://… or an absolute path)"
    if "://" not in value and not os.path.isabs(os.path.expanduser(value)):
        return f"{value!r} is a relative path; give an absolute path or a URI (file:///…, s3://…)"
    return None


def default_store_uri() -> str:
    """The embedded store: always under the configured cache root, usable or not. A read-only cache (a
    node image's, a shared read-only mount) still holds a readable store: restores use it, and a publish
    there fails with one warning. It was swapped for the process's scratch directory, so the snapshot it
    held was never used, the setup ran on every start and its snapshot went to TMPDIR (issue 46)."""
    return (configured_cache_root() / "store").as_uri()


def blob_cache_dir() -> Path:
    return cache_root() / "blobs"


def runs_dir() -> Path:
    return cache_root() / "runs"


def _own_private_dir(path: str) -> bool:
    """`path` is a real directory (lstat: not a link) of this user, mode 0700: a runtime dir we may use.

    An `XDG_RUNTIME_DIR` inherited through `su` or `sudo -E` names another user's directory; root
    must not create mount points in it (that user could swap a component for a link to /etc)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def runtime_dir() -> Path:
    """The private per-user runtime directory (for mount points): never a shared, predictable path.

    `$XDG_RUNTIME_DIR/bootseer` when that directory is this user's own, 0700, and not a link (one of
    another user's, inherited through su/sudo -E, is ignored); for root `/run/bootseer/<uid>`; for
    other users `/run/user/<uid>/bootseer` when that is theirs, else a `runtime` directory under the
    user's own cache root. Created 0700 (and checked, `make_private_dir`) when a mount point under it
    is prepared.
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and _own_private_dir(xdg):
        return Path(xdg) / "bootseer"
    uid = os.geteuid()
    if uid == 0:
        return Path("/run/bootseer") / str(uid)
    user_run = f"/run/user/{uid}"
    return Path(user_run) / "bootseer" if _own_private_dir(user_run) else cache_root() / "runtime"


def default_mountpoint() -> str:
    """`[checkpoint] mountpoint` when the config does not set one: the base of the per-run mount
    points (`<runtime>/ckpt-<run id>`, stripe/stage.py); the checkpoint stage never mounts at this path itself."""
    return str(runtime_dir() / "ckpt")


class UnsafePath(OSError):
    """A path component someone else controls (a planted link, another user's writable directory)."""


def _trusted(st: os.stat_result) -> bool:
    """Owned by root or by us, and nobody else may replace what is in it (not group/other-writable
    unless sticky): the checks of a safe path walk."""
    if st.st_uid not in (0, os.geteuid()):
        return False
    return not (stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)


def make_private_dir(path: str | Path) -> Path:
    """Create `path` (missing components 0700) walking from / with lstat, and return it.

    A link is followed only when root or this user owns it (system links like /var/run → /run); every
    directory on the way must be root's or ours and not writable by others unless sticky; the last
    one must be ours, 0700. Anything else raises `UnsafePath`: root never creates or mounts through a
    component another user could have planted."""
    path = os.path.abspath(path)
    cur = "/"
    for name in Path(path).parts[1:]:
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(nxt, 0o700)
            st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, os.geteuid()):
                raise UnsafePath(f"{nxt} is a symbolic link owned by uid {st.st_uid}; refusing to follow it")
            nxt = os.path.realpath(nxt)
            st = os.lstat(nxt)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{nxt} is not a directory")
        if not _trusted(st):
            raise UnsafePath(f"{nxt} is owned by uid {st.st_uid} or writable by others; refusing it")
        cur = nxt
    st = os.lstat(cur)
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{cur} is owned by uid {st.st_uid}, not by this user")
    if st.st_mode & 0o077:
        os.chmod(cur, 0o700)
    return Path(cur)
