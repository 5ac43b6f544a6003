"""The files a run wrote into its checkpoint directory, kept on the node after the write-back pushed them.

A job that restarts on the same node resumes from the save it just wrote there. Without this copy the
next start reads that save back through the stripe mount, from the store, although the bytes are on
local disk: for a checkpoint of hundreds of GB, a restart would fetch it again. So when the write-back
has pushed an overlay's upper directory as tag T, the upper directory is not removed but renamed into
`<cache root>/ckpt-kept/<entry>/upper` (`keep`), beside a `tag.json` naming (checkpoint, T); and the
next start that mounts exactly T on this node stacks it as the top lower layer of the writable view,
over the stripe mount (`judge`): the merged view is T's, its newest files read from local disk.

When the copy is used: every regular file in it has the size and mtime (in ns) that T's signed manifest
records for that path, every directory is a directory of T, and it holds nothing else than the
overlay's whiteouts (0/0 character devices, for paths T does not have) and, for a plain user's view
(fuse-overlayfs), fuse-overlayfs's own marker files. Anything else (a file changed since the push, a
link, a path T lacks, marker files under root's kernel overlay) and the copy is not used: the view is
T's stripes alone, as without a copy. This is the env stamp's rule (size and mtime of files only this
user can write: the copy lies in the user's private cache), not a digest check. A copy that holds every
file and directory of T and no whiteout is all of T (`judge` says WHOLE): the view then stacks it alone,
with no stripe mount under it.

How many: one per checkpoint name. `keep` retires the name's older copies, except one a live run still
has under its view: each start that stacks a copy holds a shared lock on the copy's `lock` file (handed
to its agent, released when the agent ends) and a copy is retired only under an exclusive one.
`[checkpoint] keep_local = false` keeps nothing (the staging copy is removed as before); `bootseer
cache info` counts the copies and `bootseer cache prune --max-size 0` removes every one no run holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .upperdir import OPAQUE_FILE, WHITEOUT, walk

if TYPE_CHECKING:
    from .layout import FileEntry, Manifest

TAG_FILE = "tag.json"
LOCK_FILE = "lock"
PART = "part"  # `judge`: usable stacked over the tag's stripes
WHOLE = "whole"  # `judge`: the copy alone is the tag


def kept_root() -> Path:
    """Where the kept copies live: the node cache root, on the same disk as the write-back's staging."""
    from ..paths import cache_root

    return cache_root() / "ckpt-kept"


def _prefix(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16] + "-"


def keep(upper: Path, name: str, tag: str, retire_to: Path, pushed: Manifest | None = None) -> Path | None:
    """Move `upper` (pushed as `name:tag`, whose manifest is `pushed`) into a new kept entry, then retire
    the name's other entries that no run holds (renamed into `retire_to`, the caller's directory of
    things to remove). Returns the entry, or None when it could not be made (the caller removes `upper`
    as before)."""
    from ..paths import make_private_dir

    try:
        base = make_private_dir(kept_root())
        entry = base / f"{_prefix(name)}{os.urandom(6).hex()}"
        os.mkdir(entry, 0o700)
        _write_tag(entry, name, tag)
        os.rename(upper, entry / "upper")
    except OSError:
        return None
    if pushed is not None:
        _drop_whiteouts(entry / "upper", pushed)
    for other in _entries(name):
        if other != entry:
            _retire(other, retire_to)
    return entry


def _drop_whiteouts(upper: Path, pushed: Manifest) -> None:
    """Remove the copy's whiteouts and fuse-overlayfs's marker files: each names a path the tag lacks
    (the tag was pushed from this very view, where they deleted it), so over the tag's stripes they hide
    nothing, and as the view's only layer they would be the bottom layer's, which not every overlay
    hides. Without them, a save that deleted the checkpoint it replaced (Lightning's `save_top_k`, HF's
    `save_total_limit`) still leaves a copy that is all of its tag (`judge`: WHOLE)."""
    files = {f.path for f in pushed.files}
    dirs = set(pushed.dirs)
    with contextlib.suppress(OSError):
        marks = [
            rel
            for rel, name, st in walk(upper)
            if rel not in files
            and rel not in dirs
            and (
                (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0)
                or (stat.S_ISREG(st.st_mode) and name.startswith(WHITEOUT))
            )
        ]
        for rel in marks:
            os.unlink(upper / rel)


def _write_tag(entry: Path, name: str, tag: str) -> None:
    fd = os.open(entry / TAG_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"name": name, "tag": tag}, f)


def _entries(name: str) -> list[Path]:
    """The kept entries of checkpoint `name` (any tag)."""
    prefix = _prefix(name)
    with contextlib.suppress(OSError), os.scandir(kept_root()) as it:
        return [Path(e.path) for e in it if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)]
    return []


def _tag_of(entry: Path) -> tuple[str, str] | None:
    try:
        fd = os.open(entry / TAG_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            doc = json.load(f)
        return str(doc["name"]), str(doc["tag"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _lock(entry: Path, how: int) -> int | None:
    """An fd holding `how` (LOCK_SH or LOCK_EX, never waiting) on the entry's lock file, or None."""
    try:
        fd = os.open(entry / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _retire(entry: Path, retire_to: Path) -> None:
    """Take `entry` out of use unless a live run holds it (its shared lock)."""
    fd = _lock(entry, fcntl.LOCK_EX)
    if fd is None:
        return
    try:
        os.rename(entry, retire_to / f".done-kept-{entry.name}")
    except OSError:
        shutil.rmtree(entry, ignore_errors=True)
    finally:
        os.close(fd)


def usage() -> tuple[int, int]:
    """(copies, bytes) kept on this node, every checkpoint's (for `bootseer cache info`)."""
    count = size = 0
    with contextlib.suppress(OSError), os.scandir(kept_root()) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                count += 1
                size += _size(Path(e.path))
    return count, size


def _size(top: Path) -> int:
    with contextlib.suppress(OSError):
        return sum(st.st_size for _, _, st in walk(top) if stat.S_ISREG(st.st_mode))
    return 0


def drop_unheld() -> tuple[int, int]:
    """Remove every kept copy no live run holds (`bootseer cache prune --max-size 0`): (copies, bytes)."""
    count = size = 0
    entries: list[Path] = []
    with contextlib.suppress(OSError), os.scandir(kept_root()) as it:
        entries = [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
    for entry in entries:
        fd = _lock(entry, fcntl.LOCK_EX)
        if fd is None:
            continue
        try:
            got = _size(entry)
            shutil.rmtree(entry, ignore_errors=True)
            count, size = count + 1, size + got
        finally:
            os.close(fd)
    return count, size


@dataclass(frozen=True)
class Held:
    """A kept copy a start stacks under its view: the copy, the fd of its shared lock, and whether it
    holds all of the tag (`whole`: the view needs no stripe mount below it, see `judge`)."""

    upper: Path
    fd: int
    whole: bool


def hold_for(m: Manifest) -> Held | None:
    """The kept copy of exactly `m.name:m.tag`, usable over `m`'s stripes, with an fd holding its shared
    lock (the caller hands it to the agent: the copy stays while the run's view stands); else None."""
    for entry in _entries(m.name):
        if _tag_of(entry) != (m.name, m.tag):
            continue
        fd = _lock(entry, fcntl.LOCK_SH)
        if fd is None:
            continue
        verdict = judge(entry / "upper", m) if os.path.isdir(entry) else ""  # still there after the lock: not retired
        if verdict:
            return Held(entry / "upper", fd, verdict == WHOLE)
        os.close(fd)
    return None


def judge(upper: Path, m: Manifest, fuse_markers: bool | None = None) -> str:
    """ "" (not usable: stacked over `m`'s stripes it would show something else than `m`), PART (usable
    over `m`'s stripes; see the module's docstring) or WHOLE: the copy alone is `m`.

    WHOLE: every file of `m` is in the copy with its size and mtime, every directory of `m` is there,
    and the copy holds no whiteout or marker at all. A job whose saves rewrite the whole checkpoint
    (Lightning's `last.ckpt`, nanoGPT's `ckpt.pt`) leaves such a copy, and its restart then needs
    neither the stripe mount's server nor the store: the copy is the view's only lower layer. A
    whiteout there would be the bottom layer's, which the overlays do not all hide, so none is allowed.

    `fuse_markers`: whether fuse-overlayfs will read it (a plain user's view; default: not root),
    which understands its own `.wh.` marker files where the kernel's overlay would show them."""
    markers = os.geteuid() != 0 if fuse_markers is None else fuse_markers
    files = {f.path: f for f in m.files}
    dirs = set(m.dirs)
    seen_files = seen_dirs = 0
    hides = False
    try:
        for rel, name, st in walk(upper):
            if stat.S_ISDIR(st.st_mode):
                if rel not in dirs:
                    return ""
                seen_dirs += 1
                continue
            if not _shows(rel, name, st, files, dirs, markers):
                return ""
            if stat.S_ISREG(st.st_mode) and not name.startswith(WHITEOUT):
                seen_files += 1
            else:
                hides = True
    except OSError:
        return ""
    whole = not hides and seen_files == len(files) and seen_dirs == len(dirs)
    return WHOLE if whole else PART


def _shows(rel: str, name: str, st: os.stat_result, files: dict[str, FileEntry], dirs: set[str], markers: bool) -> bool:
    """Whether a non-directory `rel` of the copy agrees with the manifest.

    The copy is a subset of T (the write-back pushed the view it was part of), so stacked over T's
    stripes it can only show T, as long as every file in it is T's (same size and mtime) and each
    whiteout hides a path T lacks anyway. Opaque directories need no check: below the copy, T's own
    directory holds exactly what the copy's does. fuse-overlayfs's marker files (`.wh.NAME`,
    `.wh..wh..opq`) are whiteouts and opaque marks to fuse-overlayfs only (`markers`): the kernel's
    overlay (root's) would show them as files, so there they make the copy unusable."""
    if stat.S_ISREG(st.st_mode) and name.startswith(WHITEOUT):
        if not markers:
            return False
        hidden = rel[: len(rel) - len(name)] + name[len(WHITEOUT) :]
        return name == OPAQUE_FILE or (hidden not in files and hidden not in dirs)
    if stat.S_ISREG(st.st_mode):
        f = files.get(rel)
        return f is not None and f.size == st.st_size and f.mtime_ns == st.st_mtime_ns
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout, in both overlays
        return rel not in files and rel not in dirs
    return False
