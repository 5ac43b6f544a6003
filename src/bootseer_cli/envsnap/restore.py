"""Restoring an env snapshot under the roots, all or nothing.

`restore()` opens the blob once where it lies (`delivery.open_blob`: the node cache's file, a local
store's file in place, else a fetch: swarm → store), extracts it while a thread hashes the same
descriptor, checks the digest before the commit (a mismatch undoes the tree, drops a bad cached
copy and tries the store), then stamps the tree. The extraction itself is `extract.py`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..delivery import Blob, DigestMismatch, Download, link_into_cache, open_blob
from ..errors import BootseerError, IntegrityError
from .catalog import FORMAT, REF_KIND
from .manifest import under
from .stamp import StampDraft, remove_stamp, switch_deletions, write_drafted_stamp
from .tree import EnvTree

if TYPE_CHECKING:
    from ..settings import P2PSettings
    from ..store.cache import BlobCache
    from ..store.core import Store


@dataclass
class Restored:
    """What a restore did: counts, where the bytes came from, and how long the fetch and extraction took."""

    digest: str
    files: int
    raw_bytes: int
    source: str
    bytes_from_store: int
    bytes_from_peers: int
    seconds_fetch: float
    seconds_extract: float
    fetch_note: str = ""  # why the swarm was not used, when it was enabled
    layers: int = 0  # links of a chain this restore applied beyond the first (0: a full snapshot)
    present: int = 0  # links of its chain the tree already carried (a parent env in place)
    # the blob bytes this restore used, from wherever they came (the node cache too): what `report`
    # counts as delivered, and as saved when the store did not send them (issue 46: `0 B saved`)
    bytes_read: int = 0


def restore(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    env_key: str,
    tree: EnvTree,
    ref: dict[str, Any] | None = None,
    progress: bool | None = None,
    extra_keys: tuple[str, ...] = (),
) -> Restored | None:
    """Restore the snapshot for `env_key` into `tree` (the caller's: what the tree carries is read at
    most once between its stamp check and the new stamp); None when the store has none.

    Raises IntegrityError/UnsafeArchive/NoSpace/RestoreError when the snapshot cannot be used (any
    other exception a malformed ref or blob provokes is turned into an IntegrityError); the tree is
    then as it was before (the message says so). The caller holds the tree lock.
    """

    if ref is None:
        ref = store.read_ref(REF_KIND, env_key)
        if ref is None:
            return None
    digest = ref.get("blob") if isinstance(ref, dict) else None
    if not isinstance(digest, str) or ref.get("format") != FORMAT:
        raise IntegrityError(f"ref env/{env_key[:16]} is malformed or of an unknown format")
    try:
        return _restore_chain(p2p, store, cache, env_key, tree, ref, progress, extra_keys)
    except BootseerError:
        raise
    except Exception as e:  # whatever a malformed ref or blob provokes: the snapshot is unusable
        raise IntegrityError(f"snapshot {digest[:12]} is unusable: {type(e).__name__}: {e}"[:400]) from None


def _restore_chain(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    env_key: str,
    tree: EnvTree,
    ref: dict[str, Any],
    progress: bool | None,
    extra_keys: tuple[str, ...],
) -> Restored:
    """Apply the links of `ref` (chain.py) that the tree does not carry yet, base first, each one all
    or nothing under its own journal and bounds, stamped as it lands (the stamp of link i says the tree
    carries env i, which it does): a restore killed between two links resumes at the next, one killed
    inside a link has that link undone by the next start's `journal.recover`, and the chain's prefix in
    place is used as it is. A layer is applied over its parent without the switch's removals (the
    parent's files are the layer's base); the stamp lists what the whole chain put into the tree."""
    from .chain import links, present_prefix

    chain = links(env_key, ref, FORMAT)
    start = present_prefix(tree, chain)
    if start == len(chain):  # the tree carries this very env (a caller that did not check): restore it all again
        start = 0
    done: list[Restored] = []
    for i in range(start, len(chain)):
        link = chain[i]
        over = tree.carried() if i > 0 else None  # what link i-1's stamp wrote: kept, not read back
        if i > 0 and (over is None or over.get("blob") != chain[i - 1].blob):
            raise IntegrityError(f"layer {link.blob[:12]}: its parent env is not in the tree")
        keys = (env_key, *extra_keys) if i == len(chain) - 1 else (link.key,)
        done.append(_restore(p2p, store, cache, keys[0], tree, link.ref, link.blob, progress, keys[1:], over))
    # the node cache evicts the least recently touched blob first: touch the child first and the base
    # last, so a child goes before the parent that it and its siblings build on
    for link in reversed(chain[:-1] if len(chain) > 1 else []):
        cache.peek(link.blob)
    last = done[-1]
    return replace(
        last,
        files=sum(r.files for r in done),
        raw_bytes=sum(r.raw_bytes for r in done),
        bytes_from_store=sum(r.bytes_from_store for r in done),
        bytes_from_peers=sum(r.bytes_from_peers for r in done),
        bytes_read=sum(r.bytes_read for r in done),
        seconds_fetch=sum(r.seconds_fetch for r in done),
        seconds_extract=sum(r.seconds_extract for r in done),
        layers=len(chain) - 1,
        present=start,
    )


def entries_hint(ref: dict[str, Any]) -> int:
    """How many entries the ref says its blob lists (bounds the metadata read; never trusted further)."""
    n = ref.get("entries")
    if isinstance(n, int) and n >= 0:
        return n
    files, deletions = ref.get("files"), ref.get("deletions")
    known = [x for x in (files, deletions) if isinstance(x, int) and x >= 0]
    return 2 * sum(known)  # refs from before "entries": directories are not counted in "files"


def _restore(
    p2p: P2PSettings,
    store: Store,
    cache: BlobCache,
    env_key: str,
    tree: EnvTree,
    ref: dict[str, Any],
    digest: str,
    progress: bool | None,
    extra_keys: tuple[str, ...],
    over: dict[str, Any] | None = None,
) -> Restored:
    """Open the blob (cache, local store in place, or a fetch), extract it while it is hashed; a
    digest mismatch found at the end undoes the tree, drops a bad cached copy and tries the store.

    `over`: the carried doc of the parent env this layer applies over (no switch, a merged stamp)."""
    from ..gcpause import collector_paused

    size = ref.get("size") if isinstance(ref.get("size"), int) else None
    for attempt in range(2):
        t0 = time.monotonic()
        b = open_blob(p2p, store, cache, digest, size, progress, cached=attempt == 0)  # a fetch: collected as usual
        try:
            # the metadata, the plan, the workers' reports and the stamp: tens of thousands of objects
            # that form no cycles (see gcpause.py)
            with collector_paused():
                restored, draft = _restore_from(b, tree, ref, digest, progress, t0, over)
            link_into_cache(cache, b, digest)
            if isinstance(b.verifier, Download):
                b.verifier.keep(cache)
        except BootseerError as e:
            if b.verifier is None or b.verifier.ok():
                raise
            if isinstance(b.verifier, Download) and b.verifier.error:
                b.verifier.check()  # the StoreError of the download (the tree is already undone)
            if b.fetched.source == "cache":  # a bad cached copy: drop it, read the store's
                cache.drop(Path(b.fetched.path), os.fstat(b.fd).st_ino, digest)
                continue
            with contextlib.suppress(BootseerError, OSError):
                store.delete_blob(digest)  # the next capture replaces it
            if isinstance(e, DigestMismatch):
                raise
            raise DigestMismatch(f"blob {digest[:12]} does not match its digest ({e})") from None
        finally:
            b.close()
        with collector_paused():
            write_drafted_stamp(tree, [env_key, *extra_keys], draft)
        return restored
    raise DigestMismatch(f"blob {digest[:12]} does not match its digest")


def _restore_from(
    b: Blob,
    tree: EnvTree,
    ref: dict[str, Any],
    digest: str,
    progress: bool | None,
    t0: float,
    over: dict[str, Any] | None,
) -> tuple[Restored, StampDraft]:
    """Read the metadata (bounded, checked for safety by the plan) and extract from the open blob; the
    stamp's draft is made beside the workers. `over`: as for `_restore` (no switch: a layer)."""
    from ..progress import byte_bar
    from .extract import extract
    from .reader import read_meta

    t1 = time.monotonic()
    v = b.verifier
    # the hash starts once the metadata's bytes are read: it runs beside their decoding and the plan, on
    # a core those leave idle, and reads the blob into the page cache ahead of the workers
    roots = tree.roots
    meta = read_meta(v.tail if isinstance(v, Download) else b.fd, entries_hint(ref), v.start if v else None)
    if any(not under(r, roots) for r in meta.roots):
        raise IntegrityError(
            f"the snapshot was captured for roots {', '.join(meta.roots)}, which this node's roots "
            f"({', '.join(roots)}) do not contain; nothing restored"
        )
    switch = switch_deletions(tree, meta, digest) if over is None else []
    draft = StampDraft(digest, meta.entries, meta.deletions, over=over)

    def beside_workers() -> None:  # called once the workers are forked: no thread here at a fork
        if v is not None:
            v.start()  # (started at the metadata's read already, but for a download)
        draft.start()

    remove_stamp(tree)
    planned = replace(meta, deletions=(*meta.deletions, *switch)) if switch else meta
    raw = ref.get("bytes")
    with byte_bar(raw if isinstance(raw, int) and raw > 0 else None, "restore", enabled=progress) as advance:
        ex = extract(
            b.fd,
            planned,
            roots,
            progress=advance,
            verify=v.check if v else None,
            start_verify=beside_workers,
            arriving=isinstance(v, Download),
        )
    t2 = time.monotonic()
    f = b.fetched
    restored = Restored(
        digest, ex.files, ex.raw_bytes, f.source, f.bytes_from_store, f.bytes_from_peers, t1 - t0, t2 - t1, f.note
    )
    restored.bytes_read = v.size if isinstance(v, Download) else os.fstat(b.fd).st_size
    return restored, draft
