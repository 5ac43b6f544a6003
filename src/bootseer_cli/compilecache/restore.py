"""The stage's half: fetch the files of a key's index into this node's cache directories.

Every blob is verified against its digest before it appears under its name (written under a temporary
name and renamed, see `nofollow.write_file`), so PyTorch never sees a torn or foreign file. The
directories may be the training user's: nothing below a root is followed if it is a link, a directory
of another uid is refused, and root writes into a user's tree as that user (`nofollow`). A file that
is already there with the listed size is kept (a restart on the same node costs nothing). A blob
that is missing or fails its digest is dropped and the others are restored; a full disk (or any
other local write failure) stops the restore: the start goes on with what was restored.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BlobMissing, IntegrityError, StoreError
from .index import Entry, Index
from .nofollow import Refused, Tree, open_tree, stat_file, usable_file, write_file
from .tree import index_parts

if TYPE_CHECKING:
    from ..store.core import Store

THREADS = 8


@dataclass
class Restored:
    files: int = 0  # fetched from the store
    kept: int = 0  # already on this node
    bytes: int = 0
    digests: dict[str, str] = field(default_factory=dict)  # index path -> digest, for what is now on disk
    dropped: list[str] = field(default_factory=list)  # index paths not restored (unsafe, missing, corrupt)
    over_bound: int = 0  # entries left out: the index holds more than [compile] max_gb
    bad: list[str] = field(default_factory=list)  # digests of blobs that failed verification
    errors: list[str] = field(default_factory=list)  # what went wrong, one line each
    stopped: str = ""  # why the restore stopped early (a full disk)
    skipped: int = 0  # entries of the roots not to fetch (`skip`), missing here
    skipped_bytes: int = 0


def _download(store: Store, e: Entry, fd: int) -> int:
    """Stream blob `e` into `fd`, verified against its digest and listed size (manifests are untrusted)."""
    from ..store.core import CHUNK, blob_path

    h = hashlib.sha256()
    n = 0
    try:
        with store.read_chunks(blob_path(e.digest), CHUNK, f"blob {e.digest[:12]}") as src:
            for chunk in src:
                h.update(chunk)
                n += len(chunk)
                if n > e.size:
                    break
                try:
                    _write_all(fd, chunk)
                except OSError as err:  # the local write (a full disk): the caller stops the restore
                    raise StoreError(f"cannot write blob {e.digest[:12]}: {err.strerror or err}") from err
    except FileNotFoundError:
        raise BlobMissing(f"store {store.uri}: blob {e.digest[:12]} not found") from None
    except OSError as err:
        raise StoreError(f"store {store.uri}: cannot download blob {e.digest[:12]}: {err}") from None
    if n != e.size:
        more = "more than " if n > e.size else ""
        raise IntegrityError(f"blob {e.digest[:12]} has {more}{n} bytes, the index lists {e.size}")
    if h.hexdigest() != e.digest:
        raise IntegrityError(f"blob {e.digest[:12]} from {store.uri} does not match its digest")
    return n


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fetch(store: Store, tree: Tree, parts: list[str], e: Entry) -> int:
    """Fetch one blob to `parts` below the tree's root: no link followed, nothing there unless verified."""
    return write_file(tree, parts, lambda fd: _download(store, e, fd))


def _plan(
    index: Index,
    roots: Mapping[str, Path],
    trees: Mapping[str, Tree],
    max_bytes: int,
    out: Restored,
    skip: frozenset[str] = frozenset(),
) -> list[tuple[str, Tree, list[str], Entry]]:
    """The files to fetch: safe paths only, within the size bound, not already here, not in `skip`."""
    todo: list[tuple[str, Tree, list[str], Entry]] = []
    budget = max_bytes
    for rel, e in sorted(index.entries.items(), key=lambda kv: -kv[1].used):
        found = index_parts(roots, rel)
        if found is None or found[0] not in trees:
            out.dropped.append(rel)
            continue
        if e.size > budget:
            out.over_bound += 1
            continue
        budget -= e.size
        tree, parts = trees[found[0]], found[1]
        st = stat_file(tree, parts)
        if st is not None and usable_file(st, tree) and st.st_size == e.size:
            out.kept += 1
            out.digests[rel] = e.digest
            continue
        if found[0] in skip:
            out.skipped += 1
            out.skipped_bytes += e.size
            budget += e.size
            continue
        todo.append((rel, tree, parts, e))
    return todo


def _open_trees(roots: Mapping[str, Path], out: Restored) -> dict[str, Tree]:
    trees: dict[str, Tree] = {}
    for name, root in roots.items():
        try:
            trees[name] = open_tree(str(root))
        except OSError as err:
            out.errors.append(f"{root}: {err.strerror or err}; not restored")
    return trees


def restore(
    store: Store, index: Index, roots: Mapping[str, Path], max_bytes: int, skip: frozenset[str] = frozenset()
) -> Restored:
    """Restore what `index` lists into `roots`; never raises for the store's or the disk's failures.
    Files of the roots named in `skip` are kept when already here (and counted as restored, so a
    run that reads them refreshes their entries) but not fetched."""
    out = Restored()
    trees = _open_trees(roots, out)
    try:
        todo = _plan(index, roots, trees, max_bytes, out, skip)
        if todo:
            _fetch_all(store, todo, out)
    finally:
        for tree in trees.values():
            tree.close()
    return out


def _fetch_all(store: Store, todo: list[tuple[str, Tree, list[str], Entry]], out: Restored) -> None:
    with ThreadPoolExecutor(max_workers=min(THREADS, len(todo))) as pool:
        futures = [(rel, e, pool.submit(_fetch, store, tree, parts, e)) for rel, tree, parts, e in todo]
        for rel, e, fut in futures:
            if out.stopped:
                fut.cancel()
                continue
            try:
                out.bytes += fut.result()
                out.files += 1
                out.digests[rel] = e.digest
            except IntegrityError as err:
                out.dropped.append(rel)
                out.bad.append(e.digest)
                out.errors.append(str(err))
            except StoreError as err:
                out.dropped.append(rel)
                if _disk_full(err):
                    out.stopped = str(err)
                else:
                    out.errors.append(str(err))
            except Refused as err:  # a link or another uid's directory in the tree: that file is not written
                out.dropped.append(rel)
                out.errors.append(f"{rel}: {err.strerror or err}")
            except OSError as err:  # creating the directory, or the local file system
                out.dropped.append(rel)
                out.stopped = f"{rel}: {err.strerror or err}"


def _disk_full(err: StoreError) -> bool:
    """Store.fetch_blob reports a local write failure as a StoreError; a full disk ends the restore."""
    cause = err.__context__
    if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return os.strerror(errno.ENOSPC) in str(err)
