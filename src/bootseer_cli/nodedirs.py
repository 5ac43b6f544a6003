"""Node-local directories that degrade instead of failing: a read-only or full cache root (Kubernetes'
`readOnlyRootFilesystem` is enough) must never keep a job from starting.

The blob cache and the run directories live under the cache root (`paths.cache_root`). When a
directory there cannot be made or written, this process uses a private scratch directory instead (in
TMPDIR, else /dev/shm, which containers mount writable even on a read-only root): the blobs it fetches
are not kept for the next start, which is what "running without the node cache" costs. When no
directory can be made anywhere, the caller gets None and runs without one. Either way one warning says
so, once per process: the same cause would otherwise be reported by every stage that touches the cache.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from pathlib import Path

# Below this much free space a cache directory counts as full: a blob or an event would not fit.
FULL_BELOW_BYTES = 16 << 20

_usable: dict[Path, str] = {}  # directory -> "" (usable) or why not; probed once per process
_scratch: dict[str, Path | None] = {}
_warned = False


def why_unusable(directory: Path) -> str:
    """The empty string when `directory` can be made and written here; else "read-only", "full" or "not writable".

    Asked of the nearest directory that exists, without creating anything (a start with nothing to do
    leaves no trace). Not from mode bits alone: root ignores them, but not a read-only mount, which
    statvfs and access(2) both report."""
    if directory in _usable:
        return _usable[directory]
    existing = directory
    try:
        while not existing.exists() and existing != existing.parent:  # EACCES on the way up raises
            existing = existing.parent
        st = os.statvfs(existing)
        if st.f_flag & os.ST_RDONLY:
            why = "read-only"
        elif not os.access(existing, os.W_OK | os.X_OK):
            why = "not writable"
        elif st.f_bavail * st.f_frsize < FULL_BELOW_BYTES:
            why = "full"
        else:
            why = ""
    except PermissionError:  # a directory on the way that this user cannot enter
        why = "not writable"
    except OSError as e:
        why = describe_oserror(e)
    _usable[directory] = why
    return why


def describe_oserror(e: OSError) -> str:
    """A write failure in a word or two: read-only and full are what a user can act on."""
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "read-only"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "full"
    return e.strerror or type(e).__name__


def scratch(name: str) -> Path | None:
    """A private (0700) directory for this process named after `name`, outside the cache root; None when
    nothing is writable. A new name each time (mkdtemp): never a predictable path another user made."""
    if name in _scratch:
        return _scratch[name]
    found: Path | None = None
    for base in (tempfile.gettempdir(), "/dev/shm"):
        try:
            found = Path(tempfile.mkdtemp(prefix=f"bootseer-{name}-", dir=base))
            break
        except OSError:
            continue
    _scratch[name] = found
    return found


def usable_or_scratch(directory: Path, name: str) -> Path | None:
    """`directory` when it is usable; else a scratch directory (or None), with the one warning."""
    why = why_unusable(directory)
    if not why:
        return directory
    fallback = scratch(name)
    warn_once(directory, why, fallback)
    return fallback


def warn_once(directory: Path, why: str, fallback: Path | None) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    where = f"its files for this start go to {fallback}" if fallback else "no run directory, events stay in memory"
    print(
        f"bootseer: warning: the node cache {directory} is {why}: starting without it ({where})",
        file=sys.stderr,
        flush=True,
    )
