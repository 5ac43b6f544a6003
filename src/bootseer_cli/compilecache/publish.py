"""The agent's half: publish what the run added or changed, merged into the key's index.

Only files that are new or changed since the stage's baseline are hashed and uploaded (a warm start
uploads nothing). Restored files that PyTorch read (their atime moved, see `tree`) refresh their
entry's last-used time, but only when the index's time is older than `REFRESH_S`: a warm restart of
many nodes then writes one index shard an hour, not one per node.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IntegrityError
from .index import Entry, Index, merge, prune, read_index, write_index
from .nofollow import Tree, open_file, open_tree
from .tree import HEADERS, SHARED_ROOTS, Baseline, index_parts, walk

if TYPE_CHECKING:
    from ..store.core import Store

REFRESH_S = 3600.0
CHUNK = 1 << 20


@dataclass
class Published:
    files: int = 0  # new or changed files published
    bytes: int = 0
    refreshed: int = 0  # restored entries seen used
    entries: int = 0  # entries in the index written
    total_bytes: int = 0
    pruned: int = 0
    shard: str = ""  # the index shard written ("" when there was nothing to publish)
    skipped: int = 0  # files that changed while they were read, or were too large


def _chunks(fd: int) -> Iterator[bytes]:
    """The file's bytes from its start, read through the descriptor that was checked (`nofollow`)."""
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        offset += len(chunk)
        yield chunk


def _upload(store: Store, fd: int, size: int, bad: set[str]) -> str:
    """Upload one open file as a blob; a blob known to be corrupt is replaced, not trusted by its size."""
    h = hashlib.sha256()
    for chunk in _chunks(fd):
        h.update(chunk)
    digest = h.hexdigest()
    if digest in bad:
        store.delete_blob(digest)
    store.put_blob_stream(digest, _chunks(fd), size=size)  # hashed again on the way: a change is caught
    return digest


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns) == (b.st_dev, b.st_ino, b.st_size, b.st_mtime_ns)


def changes(roots: Mapping[str, Path], base: Baseline) -> tuple[dict[str, tuple[Path, os.stat_result]], list[str]]:
    """(index path -> (file, stat) for files new or changed since the baseline, restored files read since).

    A precompiled header is not read on a cache hit (Inductor only checks that it exists, and builds
    it when it does not, before it loads any C++ kernel, cached or not): restored headers count as used
    when any other restored file was read, so that pruning does not take the largest file first.
    A header that was in TMPDIR before the stage (an earlier run on this node built it) and that this
    run read is published too (`_found_before`).
    """
    changed: dict[str, tuple[Path, os.stat_result]] = {}
    used: list[str] = []
    headers: list[str] = []
    before: dict[str, tuple[Path, os.stat_result]] = {}
    for rel, path, st in walk(roots):
        was = base.files.get(rel)
        if was is None or (st.st_size, st.st_mtime_ns) != was[:2]:
            changed[rel] = (path, st)
        elif rel not in base.digests:
            if rel.partition("/")[0] in SHARED_ROOTS:
                before[rel] = (path, st)
        elif st.st_atime_ns > was[2]:
            used.append(rel)
        elif rel.startswith(f"{HEADERS}/"):
            headers.append(rel)
    if any(not rel.startswith(f"{HEADERS}/") for rel in used):
        used += headers
    changed.update(_found_before(before, base))
    return changed, used


def _found_before(
    before: Mapping[str, tuple[Path, os.stat_result]], base: Baseline
) -> dict[str, tuple[Path, os.stat_result]]:
    """The headers this run used of those TMPDIR held before the stage and the index lacks.

    The header directory is shared by every torch on the node, so a header found there is this key's
    only when this run read it: GCC reads `<hash>.h.gch` for every kernel it compiles with it (its atime,
    backdated by the baseline, moves; a full cache hit compiles nothing and reads none, and then the next
    node that builds it publishes it). Its `<hash>.h` goes with it (Inductor checks that both exist).
    Under `noatime` no read shows and nothing found before is published.
    """
    out: dict[str, tuple[Path, os.stat_result]] = {}
    for rel, (path, st) in before.items():
        if rel.endswith(".gch") and st.st_atime_ns > base.files[rel][2]:
            out[rel] = (path, st)
            header = rel[: -len(".gch")]
            if header in before:
                out[header] = before[header]
    return out


# The roots a run that compiles reads or writes: Inductor's cache (a hit reads its graphs and kernels)
# and its precompiled headers (built by a run that loads a C++ kernel).
COMPILE_ROOTS = frozenset({"inductor", HEADERS})


def compiled(changed: Mapping[str, object], used: list[str]) -> bool:
    """Whether the run compiled: it wrote or read a file of Inductor's (a job started without
    `torch.compile` touches neither). Recorded in the index shard (`Index.compiled`), so the next start
    of the key restores the precompiled headers only when the last run compiled. Under `noatime` a full
    cache hit shows no read: that run counts as not compiling, and the next one builds its header (seconds)."""
    return any(rel.partition("/")[0] in COMPILE_ROOTS for rel in (*changed, *used))


def upload_changes(
    store: Store,
    roots: Mapping[str, Path],
    changed: Mapping[str, tuple[Path, os.stat_result]],
    base: Baseline,
    max_bytes: int,
    now: float,
) -> tuple[dict[str, Entry], int]:
    """Upload the changed files; returns their entries and how many were skipped.

    Each file is opened again from its root without following links (`nofollow.open_file`) and sent
    only if it is still the file the walk saw (device, inode, size, mtime): a file swapped for a link,
    a FIFO or another file since then (by the user who owns the tree) is skipped, never followed."""
    fresh: dict[str, Entry] = {}
    skipped = 0
    bad = set(base.bad)
    trees: dict[str, Tree] = {}
    try:
        for rel, (_path, st) in sorted(changed.items()):
            if st.st_size > max_bytes:
                skipped += 1
                continue
            try:
                digest = _upload_one(store, roots, trees, rel, st, bad)
            except (IntegrityError, OSError):  # rewritten, removed or swapped while read: the next publish has it
                digest = None
            if digest is None:
                skipped += 1
                continue
            fresh[rel] = Entry(digest, st.st_size, now)
    finally:
        for tree in trees.values():
            tree.close()
    return fresh, skipped


def _upload_one(
    store: Store, roots: Mapping[str, Path], trees: dict[str, Tree], rel: str, st: os.stat_result, bad: set[str]
) -> str | None:
    """Upload `rel` if it is still the file `st` describes; its digest, or None when it is not."""
    found = index_parts(roots, rel)
    if found is None:
        return None
    name, parts = found
    if name not in trees:
        trees[name] = open_tree(str(roots[name]))
    fd, now_st = open_file(trees[name], parts)
    try:
        return _upload(store, fd, st.st_size, bad) if _same(st, now_st) else None
    finally:
        os.close(fd)


def publish(store: Store, key: str, node: str, roots: Mapping[str, Path], base: Baseline, max_bytes: int) -> Published:
    """Publish this run's additions; the baseline is advanced to what was published (for a later call).

    Raises StoreError or OSError: the caller (an agent task) logs it; nothing is half-published, as
    the index shard is written after the blobs it names.
    """
    now = time.time()
    out = Published()
    changed, used = changes(roots, base)
    base.compiled = base.compiled or compiled(changed, used)  # the run so far (this task publishes twice)
    fresh, out.skipped = upload_changes(store, roots, changed, base, max_bytes, now)
    out.files, out.bytes = len(fresh), sum(e.size for e in fresh.values())
    index = read_index(store, key)
    for rel in used:
        cur = index.entries.get(rel)
        if cur is not None and cur.digest == base.digests[rel] and now - cur.used > REFRESH_S:
            fresh.setdefault(rel, Entry(cur.digest, cur.size, now))
            out.refreshed += 1
    new = {r: e for r, e in fresh.items() if index.entries.get(r) is None or index.entries[r].digest != e.digest}
    if new or out.refreshed or _flag_changed(index, base):
        merged = merge(index.entries, fresh)
        kept = prune(merged, max_bytes)
        out.pruned = len(merged) - len(kept)
        out.shard = write_index(store, key, node, kept, index.shards, compiled=base.compiled)
        out.entries, out.total_bytes = len(kept), sum(e.size for e in kept.values())
    _advance(base, roots, changed, fresh)
    return out


def _flag_changed(index: Index, base: Baseline) -> bool:
    """Whether a shard must be written only to change `Index.compiled` (what the next start restores):
    a compiling run after one that did not, or a run that did not compile though it was given the
    headers (a publisher given none, e.g. a node that restored nothing, has nothing to say)."""
    if not index.entries:
        return False
    if base.compiled:
        return index.compiled is False
    return index.compiled is not False and any(rel.partition("/")[0] == HEADERS for rel in base.digests)


def _advance(
    base: Baseline,
    roots: Mapping[str, Path],
    changed: Mapping[str, tuple[Path, os.stat_result]],
    fresh: Mapping[str, Entry],
) -> None:
    """Record the published files (as they were stat'ed before upload: a later rewrite is a later change)
    and the atimes now, so a second publish sends only what changes or is used after this one."""
    for rel, e in fresh.items():
        base.digests[rel] = e.digest
        if rel in changed:  # not a refreshed entry: its file is unchanged, only its atime moves (below)
            st = changed[rel][1]
            base.files[rel] = (st.st_size, st.st_mtime_ns, st.st_atime_ns)
    for rel, _path, st in walk(roots):
        if rel in base.files and rel not in changed:
            size, mtime, _ = base.files[rel]
            base.files[rel] = (size, mtime, st.st_atime_ns)
