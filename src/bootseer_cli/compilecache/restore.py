"""The stage's half: fetch the files of a key's index into this node's cache directories.

Every blob is verified against its digest before it appears under its name (`Store.fetch_blob`
writes a temporary file and renames it), so PyTorch never sees a torn or foreign file. A file that
is already there with the listed size is kept (a restart on the same node costs nothing). A blob
that is missing or fails its digest is dropped and the others are restored; a full disk (or any
other local write failure) stops the restore: the start goes on with what was restored.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IntegrityError, StoreError
from .index import Entry, Index
from .tree import local_path

if TYPE_CHECKING:
    from ..store import Store

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


def _fetch(store: Store, path: Path, e: Entry) -> int:
    """Fetch one blob to `path`; its size must be the listed size (manifests are untrusted)."""
    n = store.fetch_blob(e.digest, path)
    if n != e.size:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"blob {e.digest[:12]} has {n} bytes, the index lists {e.size}")
    return n


def _plan(index: Index, roots: Mapping[str, Path], max_bytes: int, out: Restored) -> list[tuple[str, Path, Entry]]:
    """The files to fetch: safe paths only, within the size bound, not already here."""
    todo: list[tuple[str, Path, Entry]] = []
    budget = max_bytes
    for rel, e in sorted(index.entries.items(), key=lambda kv: -kv[1].used):
        path = local_path(roots, rel)
        if path is None:
            out.dropped.append(rel)
            continue
        if e.size > budget:
            out.over_bound += 1
            continue
        budget -= e.size
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_size == e.size:
                out.kept += 1
                out.digests[rel] = e.digest
                continue
        except OSError:
            pass
        todo.append((rel, path, e))
    return todo


def restore(store: Store, index: Index, roots: Mapping[str, Path], max_bytes: int) -> Restored:
    """Restore what `index` lists into `roots`; never raises for the store's or the disk's failures."""
    out = Restored()
    todo = _plan(index, roots, max_bytes, out)
    if not todo:
        return out
    with ThreadPoolExecutor(max_workers=min(THREADS, len(todo))) as pool:
        futures = [(rel, e, pool.submit(_fetch, store, path, e)) for rel, path, e in todo]
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
            except OSError as err:  # creating the directory, or the local file system
                out.dropped.append(rel)
                out.stopped = f"{rel}: {err.strerror or err}"
    return out


def _disk_full(err: StoreError) -> bool:
    """Store.fetch_blob reports a local write failure as a StoreError; a full disk ends the restore."""
    cause = err.__context__
    if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return os.strerror(errno.ENOSPC) in str(err)
