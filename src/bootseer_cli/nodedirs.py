"""Node-local directories that degrade instead of failing: a read-only or full cache root (Kubernetes'
`readOnlyRootFilesystem` is enough) must never keep a job from starting.

The blob cache and the run directories live under the cache root (`paths.cache_root`). When a
directory there cannot be made or written, this process uses a private scratch directory instead (in
TMPDIR, else /dev/shm, which containers mount writable even on a read-only root): the blobs it fetches
are not kept for the next start, which is what "running without the node cache" costs, and the agent
removes the scratch directories once the job ended (`remove_scratch`: nothing of a start stays in
TMPDIR). The embedded store is never moved to scratch (`paths.default_store_uri`). When no
directory can be made anywhere, the caller gets None and runs without one. Either way one warning says
so, once per process: the same cause would otherwise be reported by every stage that touches the cache.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
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


def made_scratch() -> dict[str, str]:
    """The scratch directories this process made or adopted, by name: `exec` hands them to the agent."""
    return {name: str(p) for name, p in _scratch.items() if p is not None}


def _own_scratch(path: Path) -> bool:
    """A real directory (not a link) of this user, 0700, named as `scratch` names them: safe to use and remove."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    mine = st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o077
    return mine and path.name.startswith("bootseer-")


def adopt_scratch(dirs: dict[str, str]) -> None:
    """Use `exec`'s scratch directories (from agent.json) in this process instead of making new ones;
    one that is not this user's private directory is ignored. No second warning: exec gave it."""
    global _warned
    for name, d in dirs.items():
        p = Path(d)
        if isinstance(name, str) and p.is_absolute() and _own_scratch(p):
            _scratch.setdefault(name, p)
            _warned = True


def remove_scratch() -> list[str]:
    """Remove this process's scratch directories (the agent, once the job ended); what is left, and why.

    Never across a mount (a checkpoint view still mounted below one keeps the whole directory) and never
    through a link (`shutil.rmtree` works on descriptors)."""
    import shutil

    left = []
    for name in list(_scratch):
        p = _scratch.pop(name)
        if p is None or not _own_scratch(p):
            continue
        if _holds_a_mount(p):
            left.append(f"{p} (a mount below it)")
            continue
        try:
            shutil.rmtree(p)
        except OSError as e:
            left.append(f"{p} ({e.strerror or e})")
    return left


@contextlib.contextmanager
def scratch_of_agent(run_dir: Path) -> Iterator[None]:
    """Around the agent: exec's scratch directories (agent.json's `scratch`) are this process's, and
    they go, with any this process made, once the agent ends (after its tasks stopped and unmounted)."""
    import json

    with contextlib.suppress(OSError, ValueError, AttributeError):
        adopt_scratch(json.loads((run_dir / "agent.json").read_text()).get("scratch") or {})
    try:
        yield
    finally:
        for left in remove_scratch():
            print(f"scratch directory left: {left}", flush=True)


def _holds_a_mount(top: Path) -> bool:
    dev = os.lstat(top).st_dev
    try:
        for _, dirnames, _, dfd in os.fwalk(top):
            for d in dirnames:
                if os.stat(d, dir_fd=dfd, follow_symlinks=False).st_dev != dev:
                    return True
    except OSError:  # a directory that cannot be read or a mount that does not answer: leave it all
        return True
    return False


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
    where = f"this start's files go to {fallback} until the job ends" if fallback else "events stay in memory"
    where += "; its store, if any, is still read"
    from .redact import warn

    warn(f"the node cache {directory} is {why}: starting without it ({where})")
