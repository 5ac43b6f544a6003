"""Manifests of directory trees, and the difference between two of them.

A snapshot is the difference between a tree before the setup (the baseline) and after it, so the
scan must see everything a setup can do to a tree: new and changed files, symlinks, hardlinks, mode
changes, type changes (a directory replaced by a file) and deletions (an upgrade removes the old
version's files). It must also be fast on a tree of 100k files, which is why it is one `lstat` per
entry through `os.scandir` and entries are plain tuples, not objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import zlib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

# Kinds of entries.
FILE, DIR, SYMLINK, OTHER = "f", "d", "l", "o"

# Names bootseer keeps at the top of a root; never part of a snapshot.
STAMP_NAME = ".bootseer-env.json"
CARRIED_NAME = ".bootseer-env.paths"
JOURNAL_NAME = ".bootseer-env.journal"
UNDO_PREFIX = ".bootseer-undo-"


class Entry(NamedTuple):
    """One path's state. `target` is a symlink's target; dev/ino/nlink find hardlinks.

    A NamedTuple: the scan builds one per entry on the capture's serial path (and a baseline's load
    one per row), ~0.4 µs where a frozen dataclass of eight fields cost ~1.3 µs."""

    kind: str
    mode: int
    size: int
    mtime_ns: int
    dev: int = 0
    ino: int = 0
    nlink: int = 1
    target: str = ""

    def same_content(self, other: Entry) -> bool:
        """Whether `other` can be taken as unchanged (directories: only their mode matters)."""
        if self.kind != other.kind or self.mode != other.mode:
            return False
        if self.kind == DIR:
            return True
        if self.kind == SYMLINK:
            return self.target == other.target
        return (self.size, self.mtime_ns, self.ino, self.dev) == (other.size, other.mtime_ns, other.ino, other.dev)


Manifest = dict[str, Entry]


def under(path: str, roots: Iterable[str]) -> bool:
    """Whether `path` is one of `roots` or lies below one (lexically: no symlink is resolved)."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def below_any(path: str, tops: Collection[str]) -> bool:
    """Whether an ancestor of `path` (not `path` itself) is in `tops`: one set lookup per component,
    for many paths against many tops (`under` is a scan of the roots)."""
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        if parent in tops:
            return True
        parent = os.path.dirname(parent)
    return False


def _entry(st: os.stat_result, path: str, dir_fd: int | None = None) -> Entry:
    """`path`'s entry from its lstat (`path` is a name in `dir_fd` when that is given)."""
    m = st.st_mode
    if stat.S_ISREG(m):
        kind = FILE
    elif stat.S_ISDIR(m):
        kind = DIR
    elif stat.S_ISLNK(m):
        return Entry(SYMLINK, 0o777, 0, st.st_mtime_ns, target=os.readlink(path, dir_fd=dir_fd))
    else:
        kind = OTHER
    return Entry(
        kind, stat.S_IMODE(m), st.st_size if kind == FILE else 0, st.st_mtime_ns, st.st_dev, st.st_ino, st.st_nlink
    )


# A capture opens what the scan saw as a file without following a link and without blocking: a FIFO
# swapped in for a file would block a plain open(2) until some writer came (a hang), a device could
# do anything on open. O_NONBLOCK changes nothing for a regular file's reads.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotRegular(OSError):
    """What the scan saw as a regular file is something else now (a FIFO, device, socket)."""


def open_regular(path: str, dir_fd: int | None = None) -> int:
    """A read descriptor on the regular file `path`, never through a final symlink and never blocking
    on open; NotRegular (naming the path) for anything else, FileNotFoundError if it is gone."""
    return open_regular_stat(path, dir_fd)[0]


def open_regular_stat(path: str, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """`open_regular`, with the `fstat` of what was opened (the capture's one stat per file)."""
    fd = os.open(path, READ_FLAGS, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(f"{path} is not a regular file any more (a fifo, device or socket put there?)")
    return fd, st


def read_small(path: str, limit: int = 1 << 20) -> bytes:
    """Up to `limit` bytes of the regular file `path` (opened as `open_regular` does)."""
    fd = open_regular(path)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


SCAN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_scanned_dir(d: str, want: Entry | None) -> int | None:
    """A descriptor on directory `d`, only if it is still the directory its parent's listing showed
    (same device and inode): one swapped for a symlink or another directory since is not entered,
    so the scan never lists, and the capture never reads, a tree outside the roots for others."""
    try:
        fd = os.open(d, SCAN_DIR_FLAGS if want is not None else SCAN_DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:  # gone, unreadable, or a symlink now (ELOOP)
        return None
    st = os.fstat(fd)
    if want is not None and (st.st_dev, st.st_ino) != (want.dev, want.ino):
        os.close(fd)
        return None
    return fd


def scan(
    roots: Iterable[str | os.PathLike[str]],
    exclude: Iterable[str] = (),
    on_entry: Callable[[str, Entry], None] | None = None,
) -> Manifest:
    """Every entry under `roots` (the roots themselves included), by absolute path.

    Symlinks are recorded, never followed, also when one is swapped in for a directory while the
    scan runs: each directory is listed through a no-follow descriptor checked against the entry
    the scan saw. `exclude` holds absolute paths not to descend into (bootseer's own cache when it
    lies under a root). A missing root yields nothing. `on_entry` is called with each entry as it is
    recorded (the capture starts writing its large files while the scan goes on).
    """
    out: Manifest = {}
    skip = {os.path.abspath(p) for p in exclude}
    for root in roots:
        root = os.path.abspath(root)
        try:
            st = os.lstat(root)
        except FileNotFoundError:
            continue
        out[root] = _entry(st, root)
        if on_entry is not None:
            on_entry(root, out[root])
        if not stat.S_ISDIR(st.st_mode):
            continue
        stack: list[tuple[str, Entry | None]] = [(root, None)]  # the root is configured: it may be a link
        while stack:
            d, want = stack.pop()
            fd = _open_scanned_dir(d, want)
            if fd is None:
                continue
            top = d == root
            base = d if d.endswith("/") else d + "/"
            try:
                with os.scandir(fd) as it:
                    for e in it:
                        p = base + e.name
                        if top and (
                            e.name in (STAMP_NAME, CARRIED_NAME) or e.name.startswith((UNDO_PREFIX, JOURNAL_NAME))
                        ):
                            continue  # bootseer's own names at the top of a root
                        if p in skip:
                            continue
                        try:
                            st = e.stat(follow_symlinks=False)
                            ent = _entry(st, e.name, fd)
                        except FileNotFoundError:
                            continue  # removed while we looked: it is not part of the tree
                        out[p] = ent
                        if on_entry is not None:
                            on_entry(p, ent)
                        if ent.kind == DIR:
                            stack.append((p, ent))
            finally:
                os.close(fd)
    return out


@dataclass
class Diff:
    """What changed between two manifests, in an order safe to replay (parents before children)."""

    changed: list[str] = field(default_factory=list)  # added or changed paths (any kind), sorted
    deleted: list[str] = field(default_factory=list)  # paths gone, top-most only (children implied)

    def __bool__(self) -> bool:
        return bool(self.changed or self.deleted)


def diff(before: Manifest, after: Manifest) -> Diff:
    """Added/changed entries of `after`, and entries of `before` gone from it.

    A directory whose mode did not change is not listed (its mtime changes with its contents and
    says nothing); a new directory is, so an empty one and its mode come back too. Deletions keep
    only the top-most path of a deleted subtree: removing it removes the rest.
    """
    changed = [p for p, e in after.items() if (b := before.get(p)) is None or not e.same_content(b)]
    changed.sort()
    gone = {p for p in before if p not in after}
    deleted: list[str] = []
    for p in sorted(gone):
        parent = os.path.dirname(p)
        while parent not in gone and parent not in ("/", ""):
            parent = os.path.dirname(parent)
        if parent not in gone:  # no ancestor is deleted too: p is the top of its subtree
            deleted.append(p)
    # A path whose kind changed (directory → file) is both re-created and, for its old children,
    # deleted; the children are covered by deleting below it, which the restore does first.
    return Diff(changed=changed, deleted=deleted)


def hardlink_groups(manifest: Manifest, paths: Iterable[str]) -> dict[str, str]:
    """For regular files among `paths` that share an inode, map each later path to the first one."""
    first: dict[tuple[int, int], str] = {}
    links: dict[str, str] = {}
    for p in sorted(paths):
        e = manifest[p]
        if e.kind != FILE or e.nlink < 2:
            continue
        k = (e.dev, e.ino)
        if k in first:
            links[p] = first[k]
        else:
            first[k] = p
    return links


# ---- persistence (the `bootseer baseline` file) ------------------------------------------------


def save(manifest: Manifest, path: Path, roots: list[str], extra: dict[str, Any] | None = None) -> None:
    """Write a manifest compactly (zlib'd JSON rows), by temporary name and rename."""
    rows = [[p, e.kind, e.mode, e.size, e.mtime_ns, e.dev, e.ino, e.nlink, e.target] for p, e in manifest.items()]
    doc = {"format": 1, "roots": roots, "rows": rows, "extra": extra or {}}
    data = zlib.compress(json.dumps(doc).encode(), 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)  # O_EXCL, unguessable: no link followed
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load(path: Path) -> tuple[Manifest, list[str], dict[str, Any]]:
    doc = json.loads(zlib.decompress(path.read_bytes()))
    return {r[0]: Entry(*r[1:]) for r in doc["rows"]}, list(doc["roots"]), dict(doc.get("extra") or {})
