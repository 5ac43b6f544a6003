"""Stamps: which env a tree carries, and what that env put into it.

The stamp (`<first root>/.bootseer-env.json`) says which env keys a tree carries. Beside it,
`.bootseer-env.paths` lists what the env added (with the size and mtime, or link target, each path had
when bootseer wrote it) and deleted. The list serves two rules:

- a stamp holds only while every file it lists is still as written: one missing or changed is a miss
  (restore again), never "env present";
- nothing a user installed is removed without their say: switching the tree to another env (or a
  setup on it) removes only the listed paths that nobody changed since, and says so first.

Both files live in a tree a plain user may write while root reads them: they are read and written
only through `treefiles.py` (no link followed, no FIFO or device read, size-capped, unguessable
temporaries), and a path the paths file names is removed only through no-follow directory
descriptors from the roots (`dirfd.py`), never by path. Every function here takes the tree as one
value (`tree.py`'s `EnvTree`), which reads the paths file once and keeps it until bootseer changes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import IntegrityError
from .dirfd import DirFds, fd_budget
from .format import HARDLINK, ArchiveEntry, Meta, UnsafeArchive
from .manifest import CARRIED_NAME, DIR, FILE, STAMP_NAME, SYMLINK, Manifest, under
from .tree import EnvTree
from .treefiles import STAMP_MAX

MAX_SENTINELS = 512


def _sentinels(entries: Sequence[ArchiveEntry]) -> list[str]:
    """The files whose size and mtime stand for the whole tree: RECORDs first, else a spread sample."""
    files = [e.path for e in entries if e.kind == FILE]
    picks = [p for p in files if p.endswith(".dist-info/RECORD")][:MAX_SENTINELS]
    if len(picks) < 16 and files:
        step = max(1, len(files) // 16)
        picks += [p for p in files[::step] if p not in picks][: 16 - len(picks)]
    return picks


def carried_rows(entries: Sequence[ArchiveEntry]) -> list[list[Any]]:
    """The paths file's rows for `entries`: what each path looks like right after bootseer wrote it.

    Written at the end of every restore: one comprehension, and the hardlinks' targets looked up only
    when there are hardlinks."""
    rows = [[e.path, e.kind, e.size, e.mtime, e.extra if e.kind == SYMLINK else ""] for e in entries]
    links = [i for i, e in enumerate(entries) if e.kind == HARDLINK]
    if links:
        files = {e.path: e for e in entries if e.kind == FILE}
        for i in links:
            e = entries[i]
            t = files.get(e.extra)
            rows[i] = [e.path, HARDLINK, t.size if t else -1, t.mtime if t else -1, e.extra]
    return rows


def _as_written(row: list[Any]) -> bool | None:
    """Whether the path of `row` is still as bootseer wrote it (None: it is gone). Files compare size
    and whole-second mtime (extraction sets the archive's mtime; a capture records the file's own)."""
    path, kind, size, mtime, link = row
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if kind == SYMLINK:
        try:
            return stat.S_ISLNK(st.st_mode) and os.readlink(path) == link
        except OSError:
            return False
    if kind in (FILE, HARDLINK):
        return stat.S_ISREG(st.st_mode) and st.st_size == size and st.st_mtime_ns // 10**9 == mtime
    if kind == DIR:
        return stat.S_ISDIR(st.st_mode)
    return False  # written by an older bootseer: unknown, so not ours to touch


def _only_bytecode(d: str) -> bool:
    """A `__pycache__` holding nothing but bytecode (Python wrote it beside the env's modules)."""
    try:
        return all(n.endswith((".pyc", ".pyo")) and not os.path.isdir(os.path.join(d, n)) for n in os.listdir(d))
    except OSError:
        return False


@dataclass(frozen=True)
class Removable:
    """What switching away from the carried env may remove, and what it must leave.

    `paths` are the env's own files, links and directories that nobody changed since bootseer wrote
    them (a directory only when everything in it is removable too, or bytecode Python wrote there);
    `kept` counts the env's paths that someone changed, and the directories that hold anything else."""

    paths: list[str]
    kept: int


def removable(tree: EnvTree, doc: dict[str, Any], keep: set[str] | frozenset[str] = frozenset()) -> Removable:
    """The carried env's paths (of `doc`, not in `keep`) that may go without removing anything of a user's."""
    roots = tree.roots
    rows = [r for r in doc["entries"] if r[0] not in keep and under(r[0], roots) and r[0] not in roots]
    ok: set[str] = set()
    kept = 0
    dirs = []
    for r in rows:
        if r[1] == DIR:
            dirs.append(r)
            continue
        state = _as_written(r)
        if state:
            ok.add(r[0])
        elif state is False:
            kept += 1
    for r in sorted(dirs, key=lambda q: q[0].count("/"), reverse=True):
        if not _as_written(r):
            continue
        try:
            names = os.listdir(r[0])
        except OSError:
            continue
        inside = [os.path.join(r[0], n) for n in names]
        if all(p in ok or (p.endswith("/__pycache__") and _only_bytecode(p)) for p in inside):
            ok.add(r[0])
        else:
            kept += 1
    return Removable(sorted(ok), kept)


def say_removal(say: Callable[[str], None], gone: Removable, why: str) -> None:
    """The one line said before the carried env's paths go: how many, and how many stay and why."""
    if not gone.paths and not gone.kept:
        return
    stay = f"; {gone.kept} path(s) changed since or holding other files stay" if gone.kept else ""
    say(f"env: {why}: removing {len(gone.paths)} path(s) bootseer wrote there and nobody changed since{stay}")


def _stderr(msg: str) -> None:
    print(f"bootseer: {msg}", file=sys.stderr, flush=True)


def strip_carried(tree: EnvTree, info: Callable[[str], None]) -> None:
    """Before a setup on a tree that carries another env: remove what that env added and nobody
    changed since (so the new baseline is the image again where it can be, and the new snapshot does
    not lean on the old env's files). Anything a user changed or added stays.

    Files and links go first; then the directories the env created, deepest first, each once it is
    empty (bytecode caches Python wrote into them since count as the env's).
    """
    doc = tree.carried()
    if doc is None:
        return
    gone = removable(tree, doc)
    say_removal(info, gone, "the tree carries another env")
    fds = DirFds(tree.roots, fd_budget())
    try:
        dirs = []
        for p in gone.paths:
            with contextlib.suppress(OSError, UnsafeArchive):
                parent, _, name = p.rpartition("/")
                pfd = fds.dir(parent)
                if stat.S_ISDIR(os.stat(name, dir_fd=pfd, follow_symlinks=False).st_mode):
                    dirs.append(p)
                elif name not in ("", ".", ".."):
                    os.unlink(name, dir_fd=pfd)
        for d in sorted(dirs, key=lambda q: q.count("/"), reverse=True):
            _remove_if_empty(fds, d)
    finally:
        fds.close()
    tree.unlink_own(CARRIED_NAME)


def _remove_if_empty(fds: DirFds, d: str) -> bool:
    """Remove directory `d` if nothing but bytecode caches is left in it (each reached without
    following a link: the paths file is the tree's, and may name a path through one)."""
    with contextlib.suppress(OSError, UnsafeArchive):
        parent, _, name = d.rpartition("/")
        if name in ("", ".", ".."):
            return False
        pfd = os.dup(fds.dir(parent))
        try:
            with contextlib.suppress(FileNotFoundError):
                cfd = fds.dir(d + "/__pycache__")
                names = os.listdir(cfd)
                if all(n.endswith((".pyc", ".pyo")) for n in names):
                    for n in names:
                        os.unlink(n, dir_fd=cfd)
                    os.rmdir("__pycache__", dir_fd=fds.dir(d))
            os.rmdir(name, dir_fd=pfd)
        finally:
            os.close(pfd)
        return True
    return False


def switch_deletions(tree: EnvTree, meta: Meta, digest: str, say: Callable[[str], None] = _stderr) -> list[str]:
    """Paths of the env the tree carries now that the snapshot being restored does not have, and
    that nobody changed since bootseer wrote them (said in one line before they go).

    Raises IntegrityError when the old env deleted files of the image that the new one keeps: they
    cannot be brought back from a snapshot (the setup must run instead).
    """
    doc = tree.carried()
    if doc is None or doc.get("blob") == digest:
        return []
    new_paths = {e.path for e in meta.entries}
    new_deleted = set(meta.deletions)
    lost = [p for p in doc.get("deletions") or [] if p not in new_deleted and p not in new_paths]
    lost = [p for p in lost if not any(p == d or p.startswith(d + "/") for d in new_deleted)]
    if lost:
        raise IntegrityError(
            f"this tree carries another env that deleted {len(lost)} file(s) of the image (e.g. {lost[0]}), "
            "which the snapshot cannot bring back"
        )
    gone = removable(tree, doc, new_paths)
    say_removal(say, gone, "switching envs")
    return gone.paths


def _read_stamp(tree: EnvTree) -> object:
    """The stamp's JSON (FileNotFoundError when there is none; OSError or ValueError when unusable)."""
    return json.loads(tree.read_own(STAMP_NAME, STAMP_MAX))


def merged_carried(prev: dict[str, Any], entries: Sequence[ArchiveEntry], deletions: Sequence[str]) -> Carried:
    """What a tree carries once a layer (`entries`, `deletions`) is applied over the env `prev` (a
    carried doc): the parent's rows minus what the layer deleted or rewrote, plus the layer's rows; and
    the deletions of image files (the parent's, and the layer's that were not the parent's own paths)."""

    def gone(p: str) -> bool:
        return p in dels or any(p.startswith(d + "/") for d in dels_dirs)

    dels = set(deletions)
    dels_dirs = [d for d in deletions if d]
    new = {e.path for e in entries}
    prev_rows = [r for r in prev.get("entries") or [] if r[0] not in new and not gone(r[0])]
    prev_paths = {r[0] for r in prev.get("entries") or []}
    image_dels = [d for d in deletions if d not in prev_paths]
    old_dels = [d for d in prev.get("deletions") or [] if isinstance(d, str) and d not in new]
    return Carried(prev_rows + carried_rows(entries), list(dict.fromkeys([*old_dels, *image_dels])))


@dataclass(frozen=True)
class Carried:
    """A carried doc's rows and deletions, computed (a chain of layers) rather than read off one archive."""

    rows: list[list[Any]]
    deletions: list[str]


class StampDraft:
    """What a stamp says that is known before the tree is written: the paths file's JSON text and which
    files stand as sentinels (their sizes and mtimes are read once the tree is written).

    A restore makes it on a thread of its own while its workers write (`start`), instead of after
    them: building and encoding 21k rows took ~50 ms of a torch venv's restore, at its serial end
    where one core of two was idle. `finish` waits for it (or makes it here, if never started)."""

    def __init__(
        self,
        digest: str | None,
        entries: Sequence[ArchiveEntry],
        deletions: Sequence[str] | None = None,
        over: dict[str, Any] | None = None,
        carried: Carried | None = None,
    ) -> None:
        """`over`: the carried doc of the parent env a layer applies over (its rows are merged in);
        `carried`: what the tree carries, already merged (it replaces `entries` and `deletions`)."""
        self.digest = digest
        self._inputs = (entries, deletions, over, carried)
        self._thread: threading.Thread | None = None
        self._made = False
        self.text = ""
        self.doc: dict[str, Any] = {}  # what `text` encodes: the tree keeps it as its carried document
        self.sentinel_paths: list[str] = []

    def start(self) -> None:
        """Make it on a thread (a daemon: a restore that fails half way never waits for it)."""
        if self._thread is None and not self._made:
            self._thread = threading.Thread(target=self._make, name="bootseer-stamp", daemon=True)
            self._thread.start()

    def _make(self) -> None:
        entries, deletions, over, carried = self._inputs
        if carried is None and over is not None:
            carried = merged_carried(over, entries, deletions or ())
        rows = carried.rows if carried is not None else carried_rows(entries)
        dels = carried.deletions if carried is not None else list(deletions or [])
        self.doc = {"blob": self.digest, "entries": rows, "deletions": dels}
        self.text = json.dumps(self.doc, check_circular=False)  # a tree of plain rows: 30 % faster unchecked
        files = (
            [ArchiveEntry(r[0], FILE, 0, 0, 0, "") for r in rows if r[1] == FILE] if carried is not None else entries
        )
        self.sentinel_paths = _sentinels(files)
        self._made = True

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if not self._made:  # never started, or its thread failed: made here, where an error is raised
            self._make()


def write_stamp(
    tree: EnvTree,
    keys: list[str],
    digest: str | None,
    entries: Sequence[ArchiveEntry],
    deletions: Sequence[str] | None = None,
    carried: Carried | None = None,
) -> None:
    """Say, last of all, that this tree carries the env for `keys` (and what the env put in it).

    `carried` replaces what `entries`/`deletions` say the env put there (a layer over its parent)."""
    write_drafted_stamp(tree, keys, StampDraft(digest, entries, deletions, carried=carried))


def write_drafted_stamp(tree: EnvTree, keys: list[str], draft: StampDraft) -> None:
    """`write_stamp` from a draft: the paths file, then the stamp with its sentinels as they are now."""
    draft.finish()
    if os.path.isdir(tree.roots[0]):
        tree.write_own(CARRIED_NAME, draft.text.encode())
        tree.keep_carried(draft.doc)  # what a layer applied next goes over: never read back
    sentinels: dict[str, list[int]] = {}
    for p in draft.sentinel_paths:
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            sentinels[p] = [st.st_size, st.st_mtime_ns]
    doc = {"env_keys": list(dict.fromkeys(keys)), "blob": draft.digest, "written": time.time(), "sentinels": sentinels}
    if os.path.isdir(tree.roots[0]):
        # by temporary name and rename (a reader sees the old stamp or the new one); plain rows: unchecked
        tree.write_own(STAMP_NAME, json.dumps(doc, check_circular=False).encode())


def remove_stamp(tree: EnvTree) -> None:
    tree.unlink_own(STAMP_NAME)


def has_stamp(tree: EnvTree) -> bool:
    """Whether the tree has a stamp at all (readable or not): what `bootseer baseline` would remove."""
    try:
        _read_stamp(tree)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return True


def stamped_blob(tree: EnvTree, env_key: str) -> str | None:
    """The blob of the env `env_key` when this tree carries it intact (stamp and paths file agree), else None."""
    stamp, ok, _ = _stamp_state(tree, env_key)
    if not ok:
        return None
    doc = tree.carried()
    blob = stamp.get("blob") if isinstance(stamp, dict) else None
    if not isinstance(blob, str) or doc is None or doc.get("blob") != blob:
        return None
    return blob


def stamp_state(tree: EnvTree, env_key: str) -> tuple[bool, str]:
    """(True, "") when the tree carries `env_key` and every file the env wrote is still as written
    (the sentinels of a stamp without a paths file); else the reason, "stale …" when the tree changed."""
    _, ok, why = _stamp_state(tree, env_key)
    return ok, why


def _stamp_state(tree: EnvTree, env_key: str) -> tuple[object, bool, str]:
    """`stamp_state`, with the stamp's JSON it read (None when it has none or cannot read it)."""
    try:
        doc = _read_stamp(tree)
    except FileNotFoundError:
        return None, False, "no stamp"
    except (OSError, ValueError):
        return None, False, "unreadable stamp"
    if not isinstance(doc, dict) or env_key not in (doc.get("env_keys") or []):
        return doc, False, "stamp for another env key"
    for p, (size, mtime_ns) in (doc.get("sentinels") or {}).items():
        try:
            st = os.lstat(p)
        except OSError:
            return doc, False, f"stale stamp: {p} is gone"
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            return doc, False, f"stale stamp: {p} changed"
    carried = tree.carried()
    if carried is not None and carried.get("blob") == doc.get("blob"):
        for row in carried["entries"]:
            if row[1] == DIR:
                continue  # a directory's mtime moves whenever Python writes bytecode beside its modules
            state = _as_written(row)
            if state is None:
                return doc, False, f"stale stamp: {row[0]} is gone"
            if state is False and row[1] != "?":
                return doc, False, f"stale stamp: {row[0]} changed"
    return doc, True, ""


def entries_of(after: Manifest, changed: list[str], before: Manifest) -> list[ArchiveEntry]:
    """Entries (as the archive lists them) for a stamp written without an archive: what the setup
    changed, directories included when the setup created them (not in `before`), so that switching
    away from this env removes them too."""
    return [
        ArchiveEntry(p, after[p].kind, after[p].mode, after[p].size, after[p].mtime_ns // 10**9, after[p].target or "")
        for p in changed
        if after[p].kind != DIR or p not in before
    ]


def carried_note(tree: EnvTree) -> str:
    """What bootseer put into this tree ("env <blob> (stamp for <key>)"), or "" when nothing.

    A tree with a stamp or a paths file holds an env that a restore or a setup under `exec` wrote;
    a baseline taken over it is not the image's clean state."""
    doc = tree.carried()
    try:
        stamp = _read_stamp(tree)
    except (OSError, ValueError):
        stamp = None
    if doc is None and not isinstance(stamp, dict):
        return ""
    stamp = stamp if isinstance(stamp, dict) else {}
    blob = (doc or {}).get("blob") or stamp.get("blob") or ""
    keys = stamp.get("env_keys") or []
    what = f"the env {str(keys[0])[:16]}" if keys else "an env"
    return what + (f" (blob {str(blob)[:12]})" if blob else "") + " that bootseer wrote there"
