"""Garbage collection of the store (`bootseer gc`): keep policies, then the blobs nothing names any more.

What goes, by kind:

- `env` and `hot` refs (snapshots, hot-block records) not used for `keep_days`. "Used" is the newest
  of the ref's `created`, its `used` (refreshed by the stages at most once a day, `touch_used`) and
  the ref file's own modification time.
- `compile` keys whose every entry was last used more than `keep_days` ago (all shards of the key).
- `ckpt` tags beyond the newest `keep_tags` of each name (the tag `latest.json` names is always kept).
- `events` files older than `keep_days`; node-local run directories older than `keep_days` whose agent
  has ended (they are this node's, not the store's).
- `torrent` refs whose blob is no longer kept and which are older than `keep_days`.
- Every blob no remaining ref, compile entry or manifest names ("orphans"), and checkpoint stripes on
  other targets that no remaining manifest names.

What never goes: anything a ref kept above names; an env snapshot whose build lease is live; a blob a
live p2p lease is fetching; while any env build lease is live, no orphan blob at all (the builder's
blob exists before its ref does); an orphan younger than `grace_s` (a publisher writes its blob, then
its ref). Deletion runs in the order readers need: refs and manifests first, then the set of names
still in use is read again, and only blobs outside it are deleted, so a ref published during the
gc (even one reusing an orphan blob) keeps its blob.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, IntegrityError, StoreError
from .procs import pid_alive

if TYPE_CHECKING:
    from .store import Store

DAY_S = 86400.0
DEFAULT_KEEP_DAYS = 30.0
DEFAULT_KEEP_TAGS = 5
GRACE_S = 3600.0
_HEX = frozenset("0123456789abcdef")
# Blob-naming ref kinds with a keep-days policy (the torrent refs follow their blob, compile is sharded).
_AGED_KINDS = ("env", "hot")


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

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "bytes": self.bytes, "last_used": self.last_used or None}


@dataclass
class Scan:
    """What one pass over the store found: what goes (blobs aside), and the names still in use."""

    doomed: list[Doomed] = field(default_factory=list)
    live: set[str] = field(default_factory=set)  # blob digests on the main store still named
    live_stripes: set[tuple[str, str]] = field(default_factory=set)  # (target, digest) off the main store
    held: list[str] = field(default_factory=list)  # why something old was kept (leases)
    building: bool = False  # a live env build lease: orphan blobs wait for the next gc
    lease_digests: set[str] = field(default_factory=set)


@dataclass
class Plan:
    doomed: list[Doomed]
    held: list[str]

    @property
    def freed_bytes(self) -> int:
        return sum(d.bytes for d in self.doomed)

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind -> (count, bytes)."""
        out: dict[str, tuple[int, int]] = {}
        for d in self.doomed:
            n, b = out.get(d.kind, (0, 0))
            out[d.kind] = (n + 1, b + d.bytes)
        return out


def _is_digest(v: object) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX


def _digests(doc: object) -> Iterator[str]:
    """Every sha256 digest a ref document names, wherever it sits (`blob`, `torrent`, extras)."""
    if _is_digest(doc):
        yield str(doc)
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from _digests(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _digests(v)


def _number(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


# ---- the passes ------------------------------------------------------------------------------------


def _leases(store: Store, now: float, scan: Scan) -> set[str]:
    """Live leases: the env keys being built (returned), the digests being fetched (into `scan`)."""
    building: set[str] = set()
    for rel in store.list("leases"):
        key = rel.rsplit("/", 1)[1]
        if key.startswith("."):
            continue
        doc = store.read_lease(key) or {}
        if _number(doc.get("expires")) <= now:
            continue
        if key.startswith("env-"):
            building.add(key[len("env-") :])
            scan.building = True
        elif key.startswith("p2p-") and _is_digest(key[4:68]):
            scan.lease_digests.add(key[4:68])
    return building


def _aged_refs(store: Store, kind: str, policy: Policy, leased: set[str], scan: Scan) -> None:
    """env/hot refs: unused for keep_days -> doomed (unless leased); otherwise their digests stay live."""
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
        last = max(_number(doc.get("used")), _number(doc.get("created")), f.mtime)
        if last >= policy.cutoff or key in leased:
            if last < policy.cutoff:
                scan.held.append(f"{kind} {key[:12]}: a live build lease")
            scan.live.update(_digests(doc))
            continue
        scan.doomed.append(Doomed(kind, key, f.size, (f.rel,), last_used=last))


def _compile_keys(store: Store, policy: Policy, scan: Scan) -> None:
    """A compile key goes whole when none of its entries was used within keep_days."""
    shards: dict[str, list[Any]] = {}
    for f in store.list_info("refs/compile"):
        parts = f.rel.split("/")
        if len(parts) == 4 and parts[3].endswith(".json"):
            shards.setdefault(parts[2], []).append(f)
    for key, files in sorted(shards.items()):
        last = max(f.mtime for f in files)
        digests: set[str] = set()
        for f in files:
            with contextlib.suppress(ValueError, StoreError):
                doc = json.loads(store.get_bytes(f.rel) or b"{}")
                entries = doc.get("entries") if isinstance(doc, dict) else None
                for e in (entries or {}).values() if isinstance(entries, dict) else ():
                    if isinstance(e, dict) and _is_digest(e.get("digest")):
                        digests.add(e["digest"])
                        last = max(last, _number(e.get("used")))
        if last >= policy.cutoff:
            scan.live.update(digests)
        else:
            size = sum(f.size for f in files)
            scan.doomed.append(Doomed("compile", key, size, tuple(f.rel for f in files), last_used=last))


def _checkpoints(store: Store, policy: Policy, scan: Scan) -> list[tuple[str, str, int]]:
    """Tags beyond the newest keep_tags go; returns the stripes (target, digest, size) of those tags."""
    from .stripe.catalog import list_names, public_uri
    from .stripe.layout import MANIFEST, Manifest, ckpt_prefix, latest_rel

    main = {"", public_uri(store.uri)}
    gone: list[tuple[str, str, int]] = []
    for name in list_names(store):
        hint: dict[str, Any] = {}
        with contextlib.suppress(ValueError, StoreError):
            hint = json.loads(store.get_bytes(latest_rel(name)) or b"{}")
        manifests = []
        for tag in store.list_dirs(ckpt_prefix(name)):
            rel = f"{ckpt_prefix(name)}/{tag}/{MANIFEST}"
            with contextlib.suppress(IntegrityError, StoreError):
                data = store.get_bytes(rel)
                if data is not None:
                    manifests.append((Manifest.from_json(data), rel, len(data)))
        manifests.sort(key=lambda m: (m[0].created, m[0].tag))
        for i, (m, rel, size) in enumerate(manifests):
            if i >= len(manifests) - policy.keep_tags or m.tag == hint.get("tag"):
                for s in m.stripes:
                    if s.target in main:
                        scan.live.add(s.digest)
                    else:
                        scan.live_stripes.add((s.target, s.digest))
                continue
            scan.doomed.append(Doomed("ckpt", f"{name}:{m.tag}", size, (rel,), last_used=m.created))
            gone += [("" if s.target in main else s.target, s.digest, s.size) for s in m.stripes]
    return gone


def _torrents(store: Store, policy: Policy, scan: Scan) -> None:
    """A torrent ref follows its blob: kept while the blob is kept or while it is young (`p2p publish`)."""
    for f in store.list_info("refs/torrent"):
        key = f.rel.rsplit("/", 1)[1].removesuffix(".json")
        try:
            doc = store.read_ref("torrent", key) or {}
        except StoreError:
            continue
        if key in scan.live or key in scan.lease_digests or f.mtime >= policy.cutoff:
            scan.live.add(key)
            scan.live.update(_digests(doc))
        else:
            scan.doomed.append(Doomed("torrent", key, f.size, (f.rel,), last_used=f.mtime))


def scan_store(store: Store, policy: Policy) -> tuple[Scan, list[tuple[str, str, int]]]:
    """Every ref kind, the checkpoints and the events under `policy` (blobs come after, in `plan`)."""
    scan = Scan()
    leased = _leases(store, policy.now, scan)
    for kind in _AGED_KINDS:
        _aged_refs(store, kind, policy, leased, scan)
    _compile_keys(store, policy, scan)
    stripes = _checkpoints(store, policy, scan)
    _torrents(store, policy, scan)
    for f in store.list_info("events"):
        if f.mtime < policy.cutoff and f.rel.endswith(".parquet"):
            scan.doomed.append(Doomed("events", f.rel.removeprefix("events/"), f.size, (f.rel,), last_used=f.mtime))
    return scan, stripes


def _orphans(store: Store, policy: Policy, scan: Scan) -> list[Doomed]:
    """Blobs of the main store that nothing kept names, old enough to be no publication in progress."""
    if scan.building:
        scan.held.append("orphan blobs: an env snapshot is being built (a live lease); the next gc removes them")
        return []
    out = []
    for f in store.list_info("blobs/sha256"):
        digest = f.rel.rsplit("/", 1)[1]
        if not _is_digest(digest) or digest in scan.live or digest in scan.lease_digests:
            continue
        if f.mtime > policy.now - policy.grace_s:
            continue
        out.append(Doomed("blob", digest, f.size, (f.rel,), last_used=f.mtime))
    return out


def _agent_alive(run_dir: Path) -> bool:
    try:
        pid = int((run_dir / "agent.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    return pid_alive(pid)


def _runs(runs_root: Path, policy: Policy) -> list[Doomed]:
    """This node's run directories older than keep_days whose agent has ended."""
    out = []
    if not runs_root.is_dir():
        return out
    for d in sorted(runs_root.iterdir()):
        if not d.is_dir() or d.is_symlink():
            continue
        files = [p for p in d.rglob("*") if p.is_file() and not p.is_symlink()]
        last = max([d.stat().st_mtime, *(p.stat().st_mtime for p in files)])
        if last < policy.cutoff and not _agent_alive(d):
            out.append(Doomed("run", d.name, sum(p.stat().st_size for p in files), local=str(d), last_used=last))
    return out


def plan(store: Store, policy: Policy, runs_root: Path | None = None) -> Plan:
    """Everything `policy` removes, with sizes (what `--dry-run` prints); nothing is deleted."""
    scan, stripes = scan_store(store, policy)
    doomed = list(scan.doomed)
    for target, digest, size in sorted(set(stripes)):
        if target and (target, digest) not in scan.live_stripes:
            from .store import blob_path

            doomed.append(Doomed("stripe", digest, size, (blob_path(digest),), target=target))
    doomed += _orphans(store, policy, scan)
    if runs_root is not None:
        doomed += _runs(runs_root, policy)
    return Plan(doomed, scan.held)


def _delete(store: Store, d: Doomed, targets: Any) -> None:
    if d.local:
        shutil.rmtree(d.local, ignore_errors=True)
        return
    where = targets.get(d.target) if d.target else store
    for rel in d.rels:
        where.delete(rel)
    if d.kind == "ckpt" and (store.is_local or store.kind == "hdfs"):
        store.delete_dir(d.rels[0].rsplit("/", 1)[0])  # object stores have no directories to remove


def apply(store: Store, p: Plan, configured_targets: list[str] | None = None) -> Plan:
    """Delete what `p` names: refs, manifests, events and runs first; then blobs still unnamed after a
    second look at every ref (a ref published meanwhile keeps its blob). Returns what was removed."""
    from .stripe.catalog import Targets

    targets = Targets(store, configured_targets)
    first = [d for d in p.doomed if d.kind not in ("blob", "stripe")]
    for d in first:
        _delete(store, d, targets)
    again, _ = scan_store(store, KEEP_EVERYTHING)
    done = list(first)
    for d in p.doomed:
        if d.kind == "blob" and d.name not in again.live and d.name not in again.lease_digests:
            _delete(store, d, targets)
            done.append(d)
        elif d.kind == "stripe" and (d.target, d.name) not in again.live_stripes:
            with contextlib.suppress(StoreError, OSError):  # an unreachable target keeps an orphan stripe
                _delete(store, d, targets)
                done.append(d)
    return Plan(done, p.held)


def touch_used(store: Store, kind: str, key: str, doc: dict[str, Any], now: float | None = None) -> None:
    """Record that a ref was used, at most once a day (one small write), so gc keeps what jobs use.

    Called by the env and hot stages on a restore/replay. Best effort: a failure is ignored (the ref is
    then kept for keep_days from its last recorded use, which is the worst case).
    """
    now = time.time() if now is None else now
    if now - max(_number(doc.get("used")), _number(doc.get("created"))) < DAY_S:
        return
    clean = {k: v for k, v in doc.items() if not k.startswith("_")}
    with contextlib.suppress(StoreError, OSError):
        store.write_ref(kind, key, clean | {"used": now})
