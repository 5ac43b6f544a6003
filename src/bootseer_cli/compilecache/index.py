"""The published index of a compile key: which file (index path) has which blob, and when it was last used.

Concurrency: per-node shards merged on read, not a lease around one index object. Every publisher
writes a new shard `refs/compile/<key>/<time>-<node>-<id>.json` holding the merged index it computed
(what it read plus what it adds, pruned), and only then deletes the shards it had read. A shard is
thus deleted only after a shard holding its entries exists, and a shard written meanwhile by another
node (one this publisher did not read) is left alone, so two nodes publishing at once lose nothing,
with no coordination at all. A lease would serialize the nodes of a job that all publish after the
same `ready`: on object stores taking one costs a settle time (a second) and a failed take must
wait or give up; a holder that dies blocks the others until the lease expires. The cost of shards is
that a reader lists the prefix and merges the few shards it finds; each publish compacts them back
to one. A reader that lists just before a compaction and reads just after it misses those entries
for one start (a cache miss, never a wrong file).

Merging keeps, per path, the entry used most recently (same path, other content: the newer wins).
Pruning drops the least recently used entries until the total fits the size bound.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import IntegrityError, StoreError

if TYPE_CHECKING:
    from ..store.core import Store

INDEX_VERSION = 1
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Entry:
    digest: str
    size: int
    used: float  # unix time this entry was last published or seen used

    def as_json(self) -> dict[str, object]:
        return {"digest": self.digest, "size": self.size, "used": self.used}


@dataclass
class Index:
    """The merged entries of a key and the shards they were read from (to be compacted away)."""

    entries: dict[str, Entry]
    shards: list[str]
    skipped: int = 0  # shards or entries that were unreadable or invalid
    # Whether the run that wrote the newest shard compiled (read or built Inductor's files); None where
    # no shard says (older ones). A key whose last run compiled nothing does not need the precompiled
    # headers restored (~150 MB, only ever read by a compile): see publish.compiled.
    compiled: bool | None = None

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries.values())


def prefix(key: str) -> str:
    return f"refs/compile/{key}/"


def surely_empty(store_uri: str | None, domain: str, key: str) -> bool:
    """True when the store is a local directory holding no index for `key` in `domain`.

    Answered with one stat and without opening the store, whose import of pyarrow alone costs more
    than the stage may (0.2 s) on a start with nothing to restore. Any other store: False (ask it).
    """
    from urllib.parse import unquote, urlparse

    from ..paths import default_store_uri

    uri = store_uri or default_store_uri()
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        root = Path(unquote(parsed.path))
    elif parsed.scheme == "":
        root = Path(uri).expanduser()
    else:
        return False
    try:
        return not any((root / domain / prefix(key)).iterdir())
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _entry(value: object) -> Entry | None:
    """An entry from untrusted JSON, or None when it is malformed."""
    if not isinstance(value, dict):
        return None
    digest, size, used = value.get("digest"), value.get("size"), value.get("used")
    if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
        return None
    if not (isinstance(size, int) and size >= 0 and isinstance(used, int | float)):
        return None
    return Entry(digest, size, float(used))


def merge(*sources: Mapping[str, Entry]) -> dict[str, Entry]:
    """The union; per path the most recently used entry wins."""
    out: dict[str, Entry] = {}
    for src in sources:
        for rel, e in src.items():
            cur = out.get(rel)
            if cur is None or e.used > cur.used or (e.used == cur.used and e.digest > cur.digest):
                out[rel] = e
    return out


def prune(entries: Mapping[str, Entry], max_bytes: int) -> dict[str, Entry]:
    """The most recently used entries whose sizes add up to at most `max_bytes`."""
    kept: dict[str, Entry] = {}
    total = 0
    for rel, e in sorted(entries.items(), key=lambda kv: (-kv[1].used, kv[0])):
        if total + e.size <= max_bytes:
            kept[rel] = e
            total += e.size
    return kept


def _parse_shard(doc: Mapping[str, object]) -> tuple[dict[str, Entry], int] | None:
    """(entries, invalid entries) of a shard; None when it is not a shard this version can read."""
    entries = doc.get("entries")
    if doc.get("v") != INDEX_VERSION or not isinstance(entries, dict):
        return None
    out: dict[str, Entry] = {}
    bad = 0
    for rel, value in entries.items():
        e = _entry(value)
        if e is None or not isinstance(rel, str):
            bad += 1
        else:
            out[rel] = e
    return out, bad


def read_index(store: Store, key: str) -> Index:
    """Every shard of `key`, merged. Unreadable shards are counted and left out (a miss, not a failure)."""
    index = Index(entries={}, shards=[])
    newest = float("-inf")
    for rel in store.list(prefix(key)):
        if not rel.endswith(".json"):
            continue
        try:
            # A compile cache is code (Inductor imports its .py and loads its .so): a shard is used only if
            # it verifies for this domain (trust.py), never from another domain; a forged one is a warning
            doc = store.get_doc(rel, across=False)
        except IntegrityError:
            doc = None
        if doc is None:  # compacted away between the listing and the read, torn, or refused
            index.skipped += store.exists(rel)
            continue
        parsed = _parse_shard(doc)
        if parsed is None:
            index.skipped += 1
            continue
        entries, bad = parsed
        index.skipped += bad
        written, compiled = doc.get("written"), doc.get("compiled")
        if isinstance(compiled, bool) and isinstance(written, int | float) and written >= newest:
            newest, index.compiled = float(written), compiled
        index.entries = merge(index.entries, entries)
        index.shards.append(rel)
    return index


def write_index(
    store: Store,
    key: str,
    node: str,
    entries: Mapping[str, Entry],
    replaces: Iterable[str],
    compiled: bool | None = None,
) -> str:
    """Write `entries` as a new shard, then delete the shards it replaces (see the module docstring);
    `compiled`: whether the writer's run compiled (`Index.compiled`), not recorded when None."""
    rel = f"{prefix(key)}{time.time() * 1000:015.0f}-{node}-{uuid.uuid4().hex[:8]}.json"
    doc = {
        "v": INDEX_VERSION,
        "key": key,
        "node": node,
        "written": time.time(),
        "entries": {r: e.as_json() for r, e in sorted(entries.items())},
    }
    if compiled is not None:
        doc["compiled"] = compiled
    store.put_doc(rel, doc)
    for old in replaces:
        if old != rel:
            with contextlib.suppress(StoreError, OSError):  # left for the next compaction: merged again, harmless
                store.delete(old)
    return rel
