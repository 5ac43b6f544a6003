"""The contract between bootseer's upkeep verbs and the capabilities: what a capability's `gc_keep`,
`prefetch` and `doctor` hooks (named in its row of the capability table) take and give back.

`bootseer gc`, `bootseer prefetch` and `bootseer doctor` iterate the table and call each hook; the
hooks live in the capability's own package (`envsnap/upkeep.py`, …) and depend on this module only,
as a stage depends on `stage.py` only. So a new capability brings its own gc rule, its own prefetch
and its own checks, and none of the three verbs names it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .digests import is_digest
from .errors import BootseerError, ConfigError, IntegrityError, StoreError

if TYPE_CHECKING:
    from .settings import P2PSettings, Settings
    from .store.cache import BlobCache
    from .store.core import Store

DAY_S = 86400.0
DEFAULT_KEEP_DAYS = 30.0
DEFAULT_KEEP_TAGS = 5
GRACE_S = 3600.0


# ---- gc ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """How much to keep. `now` is a parameter so that a test can age things without waiting."""

    keep_days: float = DEFAULT_KEEP_DAYS
    keep_tags: int = DEFAULT_KEEP_TAGS
    grace_s: float = GRACE_S
    now: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not self.keep_days >= 0:
            raise ConfigError(f"--keep-days {self.keep_days}: expected a number of days >= 0")
        if self.keep_tags < 1:
            raise ConfigError(f"--keep-tags {self.keep_tags}: keep at least the newest tag (>= 1)")

    @property
    def cutoff(self) -> float:
        return self.now - self.keep_days * DAY_S


KEEP_EVERYTHING = Policy(keep_days=math.inf, keep_tags=1 << 30)


@dataclass(frozen=True)
class Doomed:
    """One thing gc removes: store paths on `target` ("" = the main store) or a node-local directory."""

    kind: str  # env | hot | compile | torrent | ckpt | events | stripe | blob | run
    name: str
    bytes: int
    rels: tuple[str, ...] = ()
    target: str = ""
    local: str = ""
    last_used: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "bytes": self.bytes, "last_used": self.last_used or None}


@dataclass(frozen=True)
class Kept:
    """One ref a keep policy keeps, and which policy: `gc` lists them beside what goes (issue 46)."""

    kind: str
    name: str
    why: str  # "used within 30 days", "one of the newest 5 tags", …
    last_used: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "why": self.why, "last_used": self.last_used or None}


def within(policy: Policy) -> str:
    """The words of the keep-days policy: `used within 30 days`."""
    return f"used within {policy.keep_days:g} day{'' if policy.keep_days == 1 else 's'}"


@dataclass
class Scan:
    """What one pass over the store found: what goes (blobs aside), and the names still in use."""

    doomed: list[Doomed] = field(default_factory=list)
    live: set[str] = field(default_factory=set)  # blob digests on the main store still named
    live_stripes: set[tuple[str, str]] = field(default_factory=set)  # (target, digest) off the main store
    held: list[str] = field(default_factory=list)  # why something old was kept (leases)
    building: bool = False  # a live env build lease: orphan blobs wait for the next gc
    lease_digests: set[str] = field(default_factory=set)
    leased_env: set[str] = field(default_factory=set)  # env keys whose build lease is live
    gone_stripes: list[tuple[str, str, int]] = field(default_factory=list)  # (target, digest, size) of doomed tags
    kept_refs: list[Kept] = field(default_factory=list)  # the refs a policy keeps, and which


def digests_in(doc: object) -> Iterator[str]:
    """Every sha256 digest a ref document names, wherever it sits (`blob`, `torrent`, extras)."""
    if is_digest(doc):
        yield str(doc)
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from digests_in(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from digests_in(v)


def number(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def aged_refs(store: Store, kind: str, policy: Policy, scan: Scan, leased: Collection[str] = ()) -> None:
    """Refs of `kind` that name blobs (env, hot, a new capability's): unused for keep_days -> doomed (the
    keys in `leased`, whose build lease is live, excepted); otherwise every digest they name stays live.

    "Used" is the newest of the ref's `created`, its `used` (refreshed by the stages at most once a day,
    `gc.touch_used`) and the ref file's own modification time."""
    for f in store.list_info(f"refs/{kind}"):
        if not f.rel.endswith(".json"):
            continue
        key = f.rel.rsplit("/", 1)[1][: -len(".json")]
        try:
            doc = store.read_ref(kind, key)
        except (IntegrityError, StoreError):
            continue  # unreadable: kept as it is (unusable either way; its blob is an orphan)
        if doc is None:
            continue
        last = max(number(doc.get("used")), number(doc.get("created")), f.mtime)
        if last >= policy.cutoff or key in leased:
            if last < policy.cutoff:
                scan.held.append(f"{kind} {key[:12]}: a live build lease")
            why = within(policy) if last >= policy.cutoff else "a live build lease"
            scan.kept_refs.append(Kept(kind, key, why, last))
            scan.live.update(digests_in(doc))
            continue
        scan.doomed.append(Doomed(kind, key, f.size, (f.rel,), last_used=last))


# ---- prefetch ----------------------------------------------------------------------------------------


@dataclass
class Item:
    """What `bootseer prefetch` did for one thing a capability's next start will fetch."""

    what: str  # the capability's word: "env" | "hot" | "checkpoint" | …
    key: str
    blobs: int = 0
    bytes: int = 0
    bytes_from_store: int = 0
    status: str = "fetched"  # fetched | cached | absent | failed | skipped (not read from the cache)
    detail: str = ""


def fetch_into_cache(p2p: P2PSettings, store: Store, cache: BlobCache, digests: list[str], item: Item) -> None:
    """Each blob into the node cache through `delivery.fetch_blob` (verified, over the swarm when on)."""
    from .delivery import fetch_blob

    for digest in digests:
        got = fetch_blob(p2p, store, digest, cache=cache)
        item.blobs += 1
        item.bytes += got.path.stat().st_size
        item.bytes_from_store += got.bytes_from_store
    item.status = "fetched" if item.bytes_from_store else "cached"


def prefetch_ref(settings: Settings, store: Store, cache: BlobCache, kind: str, key: str) -> Item:
    """The blob `refs/<kind>/<key>` names; nothing published yet is `absent`, not a failure."""
    item = Item(kind, key)
    try:
        ref = store.read_ref(kind, key)
        if ref is None or not isinstance(ref.get("blob"), str):
            item.status, item.detail = "absent", f"nothing published for {kind} key {key[:16]}"
            return item
        fetch_into_cache(settings.p2p, store, cache, [ref["blob"]], item)
    except (BootseerError, OSError) as e:
        item.status, item.detail = "failed", str(e)
    return item


# ---- doctor ------------------------------------------------------------------------------------------


@dataclass
class Check:
    """One line of `bootseer doctor`: what was checked, how it went, and how to fix it when it did not."""

    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""
