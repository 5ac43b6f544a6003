"""The write-back: what a job wrote into its checkpoint directory becomes a new tag, pushed behind it.

Each run that hands a job a checkpoint directory writes a small journal first
(`<cache root>/ckpt-write/<run id>/journal.json`: the checkpoint's name, the tag it restored, the tag
the write-back will push, and where the job's writes are: the overlay's upper directory, or the
pulled directory). The agent's "ckpt-writeback" task holds the journal's lock while the launcher
runs and, once it has ended, pushes; the journal goes only after the manifest is in the store. An
agent that dies (the node, SIGKILL) leaves the journal, and the next start of a job with the same
checkpoint finishes that push before it resolves `latest`, so the job resumes from its newest state.
A push cut off half-way is resumed by pushing the same tag again: the stripes already uploaded are
found on their targets (hashed, not uploaded again), and a manifest already there means it is done.

What the new tag holds: the **merged view**, the directory exactly as the job saw it (the restored
files it did not replace or delete, plus what it wrote), so a resume from `latest` sees everything
the job would. Unchanged files cannot reuse the parent's stripes: a manifest is one logical stream
dealt round-robin over whole stripe blobs (layout.py), so a stripe mixes cells of many files and a
new stream changes every stripe; sharing would need a manifest format every reader must learn. The
unchanged files are therefore re-pushed, read through the parent's verified read engine (never a
local copy), and the typical save (`ckpt.pt` replaced, or a new `checkpoint-N/`) is mostly local.

Nothing a job wrote is deleted before it is in the store: the overlay's upper directory (bootseer's
own staging copy of the job's writes) is renamed aside only after the tag's manifest is written, and
removed by the agent after that (`discard_done`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from .layout import FileEntry, Manifest, manifest_rel
from .push import Origin
from .upperdir import OPAQUE_FILE, OPAQUE_XATTRS, WHITEOUT, walk

if TYPE_CHECKING:
    from ..settings import CheckpointSettings
    from ..store.core import Store
    from .push import Progress
    from .reader import Reader

JOURNAL_VERSION = 1
RECOVER_LIMIT = 16  # write-backs finished per start (each may be a whole checkpoint)
SCAN_LIMIT = 1024  # journal directories read per start (a few hundred bytes each)
DONE_PREFIX = ".done-"  # a finished write-back's directory, renamed aside until `discard_done` removes it

View = tuple[list[tuple[str, Origin, int]], list[str], bool]  # files (sorted), dirs, changed


@dataclass(frozen=True)
class Journal:
    """One pending write-back (the journal's fields)."""

    kind: str  # "overlay": `path` is the upper directory; "pull": the pulled directory; "new": a first
    # start's directory (no tag yet: empty when the job began, so whatever is in it is the job's)
    name: str
    parent_tag: str
    tag: str
    path: str
    owner: str = ""  # "pid start-time" of the launcher
    mountpoint: str = ""  # the overlay's (mount mode): a dead run's is taken down by the next start

    def to_doc(self) -> dict[str, Any]:
        return {"version": JOURNAL_VERSION, **self.__dict__}

    @classmethod
    def load(cls, path: Path) -> Journal:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("version") != JOURNAL_VERSION:
            raise ValueError(f"{path}: not a write-back journal")
        keys = ("kind", "name", "parent_tag", "tag", "path", "owner", "mountpoint")
        return cls(**{k: str(doc.get(k, "")) for k in keys})


def begin(root: Path, journal: Journal) -> Path:
    """Write `journal` into `root/journal.json` (whole, by rename; 0600): before the job starts."""
    path = root / "journal.json"
    tmp = root / f".journal.{os.urandom(8).hex()}.tmp"  # unguessable, O_EXCL: never someone's file or link
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(journal.to_doc(), f)
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def locked(root: Path, wait: bool) -> Iterator[bool]:
    """The journal's lock (a `lock` file beside it): held by the agent from its start to the end of its
    push, so a next start never pushes the same writes at the same time. Yields whether it is held."""
    fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _opaque(path: Path) -> bool:
    for attr in OPAQUE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
    return False


def _ancestors(rel: str) -> Iterator[str]:
    parts = rel.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def overlay_view(parent: Manifest, upper: Path, log: Callable[[str], None]) -> View:
    """The merged view of the parent checkpoint under the overlay's `upper` directory.

    Whiteouts (a 0/0 character device, or fuse-overlayfs's `.wh.NAME` file) hide a lower entry and
    everything under it; an opaque directory hides the lower entries below it; an upper file or
    directory replaces a lower entry of the same path. A link to a file of the view is that file's
    content (`_resolve_links`); other links and special files are left out (said)."""
    files: dict[str, tuple[Origin, int]] = {}
    links: dict[str, str] = {}
    dirs: set[str] = set()
    gone: set[str] = set()  # whited out, or replaced by an upper file: nothing of the lower at or below
    opaque: set[str] = set()  # upper directories whose lower contents are hidden
    for rel, name, st in walk(upper):
        rel_dir = rel.rpartition("/")[0]
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            gone.add(rel)
        elif name == OPAQUE_FILE:
            opaque.add(rel_dir)
        elif name.startswith(WHITEOUT):
            gone.add(f"{rel_dir}/{name[len(WHITEOUT) :]}" if rel_dir else name[len(WHITEOUT) :])
        elif stat.S_ISREG(st.st_mode):
            files[rel] = (upper / rel, st.st_size)
            gone.add(rel)
        elif stat.S_ISDIR(st.st_mode):
            dirs.add(rel)
            if _opaque(upper / rel):
                opaque.add(rel)
        elif stat.S_ISLNK(st.st_mode):
            links[rel] = os.readlink(upper / rel)
            gone.add(rel)
        else:
            log(f"checkpoint write-back: {rel} is not a regular file or directory; left out")

    def hidden(rel: str, is_file: bool) -> bool:
        if rel in gone or (is_file and rel in dirs):
            return True
        return any(a in gone or a in opaque or a in files for a in _ancestors(rel))

    written = bool(files)
    for f in parent.files:
        if not hidden(f.path, True) and f.path not in files:
            files[f.path] = (f, f.size)
    dirs |= {d for d in parent.dirs if not hidden(d, False) and d not in files}
    written = _resolve_links(files, links, log) or written
    view = [(rel, origin, size) for rel, (origin, size) in sorted(files.items())]
    changed = written or len(view) != len(parent.files) or dirs != set(parent.dirs)
    return view, sorted(dirs), changed


def _resolve_links(files: dict[str, tuple[Origin, int]], links: dict[str, str], log: Callable[[str], None]) -> bool:
    """A relative link to a file of the view (Lightning's `last.ckpt` may be one) becomes a file with
    that file's content, read from where that file is; a link that leaves the directory, is absolute, or
    names no file of the view is left out (said): a manifest holds files, and a link is never followed
    out of the job's directory. True when any link was added."""
    import posixpath

    added = False
    for rel, target in sorted(links.items()):
        to = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        found = None if target.startswith("/") or to.startswith("..") else files.get(to)
        if found is None:
            log(f"checkpoint write-back: {rel} is a link to {target}, not to a file of the checkpoint; left out")
            continue
        files[rel] = found
        added = True
    return added


def local_view(dest: Path, log: Callable[[str], None]) -> tuple[list[tuple[str, Origin, int]], list[str]]:
    """Every regular file and directory under `dest` (a pulled directory); links as `_resolve_links`."""
    files: dict[str, tuple[Origin, int]] = {}
    links: dict[str, str] = {}
    dirs: list[str] = []
    for rel, _name, st in walk(dest):
        if stat.S_ISREG(st.st_mode):
            files[rel] = (dest / rel, st.st_size)
        elif stat.S_ISDIR(st.st_mode):
            dirs.append(rel)
        elif stat.S_ISLNK(st.st_mode):
            links[rel] = os.readlink(dest / rel)
        else:
            log(f"checkpoint write-back: {rel} is not a regular file or directory; left out")
    _resolve_links(files, links, log)
    return [(rel, origin, size) for rel, (origin, size) in sorted(files.items())], sorted(dirs)


def finish(
    store: Store,
    settings: CheckpointSettings,
    root: Path,
    log: Callable[[str], None],
    progress: Progress | None = None,
) -> Manifest | None:
    """Push the write-back of journal directory `root` (the caller holds its lock); None when the job
    changed nothing (or the tag is already in the store). The journal directory goes once it is done."""
    from .catalog import Targets, load_manifest
    from .pull import is_current_tree, write_marker
    from .reader import open_reader

    j = Journal.load(root / "journal.json")
    if store.exists(manifest_rel(j.name, j.tag)) or not os.path.isdir(j.path):
        _done(root)  # pushed already (a push cut off after its manifest), or nothing left to push
        return None
    lower = None
    if j.kind == "overlay":
        parent = load_manifest(store, j.name, j.parent_tag)
        files, dirs, changed = overlay_view(parent, Path(j.path), log)
        if changed and any(isinstance(o, FileEntry) for _, o, _ in files):
            lower = open_reader(parent, Targets(store, list(settings.targets)))
    elif j.kind == "new":  # a first start: the job's directory was empty; nothing in it, nothing to push
        files, dirs = local_view(Path(j.path), log)
        changed = bool(files) and not is_current_tree(Path(j.path))
    else:
        changed = not is_current_tree(Path(j.path))
        files, dirs = local_view(Path(j.path), log) if changed else ([], [])
    if not changed:
        _done(root)
        return None
    try:
        m = _push(store, settings, j, files, dirs, lower, progress)
    finally:
        if lower is not None:
            lower.close()
    if j.kind in ("pull", "new"):
        write_marker(Path(j.path), m)  # the directory now holds this tag: clean again, and current
    elif settings.keep_local:  # the next start on this node reads this save from local disk (kept.py)
        from .kept import keep

        keep(Path(j.path), j.name, m.tag, retire_to=root.parent, pushed=m)
    _done(root)
    return m


def _push(
    store: Store,
    settings: CheckpointSettings,
    j: Journal,
    files: list[tuple[str, Origin, int]],
    dirs: list[str],
    lower: Reader | None,
    progress: Progress | None,
) -> Manifest:
    from ..store.core import Store as _Store
    from .push import push_files

    return push_files(
        store,
        files,
        dirs,
        j.name,
        j.tag,
        stripes=settings.stripes,
        cell_size=settings.cell_size,
        targets=[_Store(u) for u in settings.targets] or None,
        progress=progress,
        lower=lower,
    )


def _done(root: Path) -> None:
    """The write-back is in the store (or there was none): the journal goes, and the directory (for an
    overlay, its upper directory: bootseer's staging copy of what is now a tag) is renamed aside for
    `discard_done` to remove.

    Not removed here: unlinking a checkpoint the job fsync-ed costs ~0.3 s per GB on ext4, which is no
    part of the push (the tag is in the store already) and, for an earlier run's write-back finished by
    a start (`finish_pending`), would hold that start; the agent removes it once its event is recorded."""
    with contextlib.suppress(OSError):
        (root / "journal.json").unlink()
    aside = root.parent / f"{DONE_PREFIX}{root.name}-{os.urandom(4).hex()}"
    try:
        os.rename(root, aside)
    except OSError:
        shutil.rmtree(root, ignore_errors=True)


def discard_done() -> int:
    """Remove the write-back directories `_done` renamed aside (this user's, under `write_root()`);
    the number removed. `shutil.rmtree` walks them by directory fd, following no link."""
    from .overlay import write_root

    gone = 0
    with contextlib.suppress(OSError), os.scandir(write_root()) as it:
        for e in list(it):
            if e.name.startswith(DONE_PREFIX) and e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
                gone += 1
    return gone


def owner_alive(j: Journal) -> bool:
    from .rundirs import _start_time

    pid, _, start = j.owner.partition(" ")
    return bool(start) and pid.isdigit() and _start_time(int(pid)) == start


def _take_down(root: Path) -> None:
    """An ended run's writable view still mounted (its agent died): unmounted before its upper
    directory is read (what the job wrote stays there; the overlay only showed it)."""
    from .mount import mount_info
    from .overlay import is_overlay, umount_overlay

    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, BootseerError):
        j = Journal.load(root / "journal.json")
        info = mount_info(j.mountpoint) if j.mountpoint else None
        if is_overlay(info):
            umount_overlay(j.mountpoint, dev=info["dev"])  # type: ignore[index]


def pending(name: str) -> list[Path]:
    """Journal directories of checkpoint `name` whose launcher has ended (at most RECOVER_LIMIT)."""
    from .overlay import write_root

    found = []
    with contextlib.suppress(OSError), os.scandir(write_root()) as it:
        runs = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        for e in runs[:SCAN_LIMIT]:  # run ids sort by time: oldest first
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                j = Journal.load(Path(e.path) / "journal.json")
                if j.name == name and not owner_alive(j):
                    found.append(Path(e.path))
    return found[:RECOVER_LIMIT]


def finish_pending(
    store: Store, settings: CheckpointSettings, name: str, log: Callable[[str], None], progress: Progress | None
) -> list[Manifest]:
    """Finish the write-backs an earlier run of checkpoint `name` left (its agent died): before `latest`
    is resolved, so this start resumes from what that job saved. One that fails is kept, and said."""
    done = []
    for root in pending(name):
        with locked(root, wait=False) as held:
            if not held:
                continue  # its agent is still pushing it
            _take_down(root)
            t0 = time.time()
            try:
                m = finish(store, settings, root, log, progress)
            except (BootseerError, OSError, ValueError) as e:
                log(f"checkpoint: the write-back in {root} is not pushed yet ({e}); kept for the next start")
                continue
            if m is not None:
                log(f"checkpoint: pushed what an earlier run wrote as {m.name}:{m.tag} in {time.time() - t0:.1f} s")
                done.append(m)
    return done
