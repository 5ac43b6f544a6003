"""Garbage collection of the store (`bootseer gc`): keep policies, then the blobs nothing names any more.

What goes, by kind. Each capability says what of its own goes, in the `gc_keep` hook its row of the
capability table names (its package's `upkeep.py`); this module knows no capability:

- `env` and `hot` refs (snapshots, hot-block records) not used for `keep_days` (`upkeep.aged_refs`).
- `compile` keys whose every entry was last used more than `keep_days` ago (all shards of the key).
- `ckpt` tags beyond the newest `keep_tags` of each name (the tag `latest.json` names is always kept).
- `torrent` refs whose blob is no longer kept and which are older than `keep_days` (a later phase).
- `events` files older than `keep_days`; node-local run directories older than `keep_days` whose agent
  has ended (they are this node's, not the store's).
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
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import capabilities
from .errors import StoreError
from .procs import pid_alive
from .upkeep import DAY_S, KEEP_EVERYTHING, Doomed, Kept, Policy, Scan, is_digest, number

if TYPE_CHECKING:
    from .store.core import Store
    from .stripe.catalog import Targets

# The longest a lease document may hold gc back since it was last written: leases are renewed every
# third of their TTL (60 s for an env build, 30 s for a download), so a live one is always younger.
GC_LEASE_TTL_S = 600.0


KEPT_REASONS = {
    "ref": "named by a ref",
    "lease": "under a live lease",
    "grace": "younger than the grace",
}


@dataclass
class Plan:
    """What gc removes (`doomed`), and what it keeps and why: `held` in words (leases), `kept` as
    reason -> (count, bytes) of the main store's blobs (see `KEPT_REASONS`), so that "would free 0 B"
    comes with where the space is and what would let it go."""

    doomed: list[Doomed]
    held: list[str]
    kept: dict[str, tuple[int, int]] = field(default_factory=dict)
    kept_refs: list[Kept] = field(default_factory=list)  # the refs a keep policy keeps, and which policy

    @property
    def kept_bytes(self) -> int:
        return sum(b for _, b in self.kept.values())

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


# ---- the passes ------------------------------------------------------------------------------------


def _leases(store: Store, now: float, scan: Scan) -> set[str]:
    """Live leases: the env keys being built (returned), the digests being fetched (into `scan`)."""
    building: set[str] = set()
    for rel in store.list("leases"):
        key = rel.rsplit("/", 1)[1]
        if key.startswith("."):
            continue
        doc = store.read_lease(key) or {}
        # Held at most GC_LEASE_TTL_S since it was written, whatever it claims (a forged far-future lease
        # must not keep gc from its work for longer than that).
        if number(doc.get("expires")) <= now or not store.lease_live(key, doc, GC_LEASE_TTL_S):  # real time
            continue
        if key.startswith("env-"):
            building.add(key[len("env-") :])
            scan.building = True
        elif key.startswith("p2p-") and is_digest(key[4:68]):
            scan.lease_digests.add(key[4:68])
    return building


def scan_store(store: Store, policy: Policy) -> tuple[Scan, list[tuple[str, str, int]]]:
    """Every capability's refs (its `gc_keep` hook, by phase) and the events under `policy` (blobs come
    after, in `plan`).

    Blobs are shared by every domain of the store, so what any domain's documents name stays (read
    unchecked: a forged ref can keep a blob, never delete one); refs, tags and events go only in this
    store's own domain, where its user may delete them."""
    scan = Scan()
    scan.leased_env = _leases(store, policy.now, scan)
    hooked = sorted((c for c in capabilities.CAPABILITIES if c.gc_keep), key=lambda c: c.gc_phase)
    for domain in store.domains():
        if domain != store.domain:
            other = Scan()
            for cap in hooked:
                capabilities.resolve(cap.gc_keep)(store.in_domain(domain), KEEP_EVERYTHING, other)
            scan.live |= other.live
            scan.live_stripes |= other.live_stripes
    for cap in hooked:  # each capability keeps what its refs name (and lets go what its policy says)
        capabilities.resolve(cap.gc_keep)(store, policy, scan)
    for f in store.list_info("events"):
        if f.mtime < policy.cutoff and f.rel.endswith(".parquet"):
            scan.doomed.append(Doomed("events", f.rel.removeprefix("events/"), f.size, (f.rel,), last_used=f.mtime))
    return scan, scan.gone_stripes


def _orphans(store: Store, policy: Policy, scan: Scan, kept: dict[str, tuple[int, int]]) -> list[Doomed]:
    """Blobs of the main store that nothing kept names, old enough to be no publication in progress.

    Every other blob is counted into `kept` under the first reason that keeps it: a ref names it, a
    live lease (a p2p fetch, or any env build: its blob exists before its ref), younger than the grace."""
    if scan.building:
        scan.held.append("orphan blobs: an env snapshot is being built (a live lease); the next gc removes them")
    out = []

    def keep(reason: str, size: int) -> None:
        n, b = kept.get(reason, (0, 0))
        kept[reason] = (n + 1, b + size)

    for f in store.list_info("blobs/sha256"):
        digest = f.rel.rsplit("/", 1)[1]
        if not is_digest(digest):
            continue
        if digest in scan.live:
            keep("ref", f.size)
        elif digest in scan.lease_digests or scan.building:
            keep("lease", f.size)
        elif f.mtime > policy.now - policy.grace_s:
            keep("grace", f.size)
        else:
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
    out: list[Doomed] = []
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
            from .store.core import blob_path

            doomed.append(Doomed("stripe", digest, size, (blob_path(digest),), target=target))
    kept: dict[str, tuple[int, int]] = {}
    doomed += _orphans(store, policy, scan, kept)
    if runs_root is not None:
        doomed += _runs(runs_root, policy)
    return Plan(doomed, scan.held, kept, scan.kept_refs)


def _delete(store: Store, d: Doomed, targets: Targets) -> None:
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
    return Plan(done, p.held, p.kept, p.kept_refs)


def touch_used(store: Store, kind: str, key: str, doc: dict[str, Any], now: float | None = None) -> None:
    """Record that a ref was used, at most once a day (one small write), so gc keeps what jobs use.

    Called by the env and hot stages on a restore/replay. Best effort: a failure is ignored (the ref is
    then kept for keep_days from its last recorded use, which is the worst case).
    """
    now = time.time() if now is None else now
    if now - max(number(doc.get("used")), number(doc.get("created"))) < DAY_S:
        return
    clean = {k: v for k, v in doc.items() if not k.startswith("_")}
    with contextlib.suppress(StoreError, OSError):
        store.write_ref(kind, key, clean | {"used": now})
