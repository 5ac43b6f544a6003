"""Single-flight leases: the `Lease` a taker holds, and both protocols a store takes one with.

Compare-and-swap where the store offers it: on S3 servers that honour conditional writes
(`conditional.py`) a lease is created with `If-None-Match: *` and renewed, taken over or released with
`If-Match: <etag>` (`take_lease`, `swap_lease`); a local store has its own exclusive create (link(),
in `core.Store`). Everywhere else, a claim per taker and Lamport's bakery (`take_by_claims`).

Why the bakery. Where the server ignores `If-None-Match` (rclone's `serve s3`, older MinIO and Ceph, GCS and HDFS
here), a lease used to be taken by checking it was free, writing it, waiting `settle_s` and reading
it back. A taker that stalled between its check and its write (seconds: a GC pause, a loaded node)
overwrote the lease another taker had meanwhile taken and settled, read back its own id, and both
held it: CI saw two nodes run the same setup. Nothing that only reads and writes one object can
tell such a late writer from a fresh one.

So each taker writes an object of its own (`leases/<key>.claims/<owner>`, never overwritten by
another) and runs Lamport's bakery over them, which needs no atomic operation and holds however
long any taker stalls:

1. its claim says `choosing`;
2. it lists the live claims and takes a number above every number there;
3. its claim says that number;
4. it waits until no live claim is `choosing` (each one ends, or expires), then lists again: it wins
   when no live claim has a lower (number, owner). A claim written after another taker's number
   was published sees that number and takes a higher one, so a stalled taker never passes the one
   that already won.

The winner writes the usual lease document too (what waiters and `lease_live` read) and keeps its
claim alive with every renewal, so a taker that checked the lease just before the winner wrote it
still loses against the winner's claim. A claim lives until its `expires` (renewed with the lease);
a taker that spent more than half a TTL in the protocol (its own claim may have expired meanwhile)
gives up, as does one still waiting on a `choosing` claim then. Giving up only ever means not holding.

The protocols see the store as a `LeaseStore` (what `core.Store` offers them), so that this module
sits below the store rather than in a circle with it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import StoreError
from ..redact import redact_text

if TYPE_CHECKING:
    from ..trust import Trust
    from .conditional import ConditionalS3
    from .fs import StoreFS

POLL_S = 0.2
# Clock-skew allowance of leases (see `Store.lease_live`): a lease holds until its expiry plus
# min(TTL/2, this), so nodes whose clocks differ by less never take each other's live lease.
LEASE_SKEW_S = 30.0


class LeaseStore(Protocol):
    """What the lease protocols use of the store (`core.Store`): its domain's signer, plain objects,
    the lease document's own helpers and, on S3, the conditional writer."""

    @property
    def uri(self) -> str: ...

    @property
    def domain(self) -> str: ...

    @property
    def trust(self) -> Trust: ...

    def put_bytes(self, rel: str, data: bytes) -> None: ...

    def get_bytes(self, rel: str) -> bytes | None: ...

    def delete(self, rel: str) -> None: ...

    def conditional(self) -> ConditionalS3 | None: ...

    def lease_live(self, key: str, doc: dict[str, Any] | None, ttl_s: float, now: float | None = None) -> bool: ...

    def _lease_rel(self, key: str) -> str: ...

    def _lease_doc(self, key: str, owner: str, expires: float, ttl_s: float) -> bytes: ...

    def _lease_from(self, key: str, data: bytes) -> dict[str, Any]: ...

    def release_lease(self, lease: Lease) -> None: ...

    def renew_lease(self, lease: Lease, ttl_s: float) -> bool: ...

    def list(self, prefix: str, recursive: bool = False) -> list[str]: ...


@dataclass
class Lease:
    """A lease this process took. `renew` and `release` act only while it is still the owner:
    `lost` turns True once a renewal found another owner (or an expired lease), and then the
    holder must assume another node is doing the work."""

    store: LeaseStore
    key: str
    owner: str
    expires: float
    ttl_s: float = 0.0
    lost: bool = False
    etag: str = ""  # the version this holder wrote, on a store with conditional writes (`conditional`)

    def release(self) -> None:
        self.store.release_lease(self)

    def renew(self, ttl_s: float) -> bool:
        """Extend the lease by `ttl_s`; False (and `lost`) when it is no longer ours."""
        return self.store.renew_lease(self, ttl_s)


# ---- compare-and-swap (conditional writes) -------------------------------------------------------
def take_lease(store: LeaseStore, cas: ConditionalS3, key: str, owner: str, ttl_s: float, doc: bytes) -> str | None:
    """Create the lease `key`, or take over a stale one only while it is the version judged stale; the
    ETag now held by `owner`, or None (`take_cas`)."""

    def judge(data: bytes) -> str:
        found = store._lease_from(key, data)
        if found.get("owner") == owner:
            return "ours"
        return "live" if store.lease_live(key, found, ttl_s) else "stale"

    return take_cas(cas, store._lease_rel(key), doc, judge, f"store {store.uri}: lease {key[:24]}")


def swap_lease(store: LeaseStore, lease: Lease, ttl_s: float, release: bool = False) -> bool:
    """Renew (or mark released: no owner, expired) a lease taken with conditional writes, If-Match the
    version this holder wrote: a lease another node took over is never touched. False (and `lost`)
    when it is no longer ours."""
    cas = store.conditional()
    expires = 0.0 if release else time.time() + ttl_s
    doc = store._lease_doc(lease.key, "" if release else lease.owner, expires, 0.0 if release else ttl_s)
    etag = None
    if not lease.lost and cas is not None:
        etag = replace_or_fail(cas, store._lease_rel(lease.key), doc, lease.etag, f"store {store.uri}: lease")
    lease.lost = etag is None or release  # a released lease is never renewed again
    if etag is not None:
        lease.etag, lease.expires, lease.ttl_s = etag, expires, ttl_s
    return etag is not None


def take_cas(cas: ConditionalS3, rel: str, doc: bytes, judge: Callable[[bytes], str], what: str) -> str | None:
    """Take the lease object `rel`: create it if absent; else, if `judge` of what is there says "stale",
    replace it only while it is still that version (If-Match), so a taker that stalled after its check
    loses to one that did not. "ours" (our own create, whose answer was lost and retried) holds it too.
    The ETag now held, or None. Raises StoreError when the store fails."""
    try:
        for _ in range(2):
            etag = cas.create(rel, doc)
            if etag is not None:
                return etag
            current = cas.read(rel)
            if current is None:  # released and deleted meanwhile: create again
                continue
            verdict = judge(current.data)
            if verdict != "stale":
                return current.etag if verdict == "ours" else None
            return cas.replace(rel, doc, current.etag)
    except Exception as e:
        raise _store_error(e, what) from None
    return None


def replace_or_fail(cas: ConditionalS3, rel: str, doc: bytes, etag: str, what: str) -> str | None:
    """`cas.replace`, with the client's failures (the store down) as StoreError."""
    try:
        return cas.replace(rel, doc, etag)
    except Exception as e:
        raise _store_error(e, what) from None


def _store_error(e: Exception, what: str) -> Exception:
    """obstore's errors as the StoreError every caller of a lease handles; anything else as it is."""
    if not type(e).__module__.startswith("obstore"):
        return e
    return StoreError(f"{what}: {type(e).__name__}: {redact_text(str(e).splitlines()[0] if str(e) else '')}")


def lease_protocol(fs: StoreFS) -> tuple[str, str]:
    """(protocol, why) for `doctor`: "compare-and-swap" or "bakery" (a claim per taker, `take_by_claims`)."""
    if fs.is_local:
        return "compare-and-swap", "exclusive create (link) on the local file system"
    if fs.kind == "s3":
        if fs.conditional() is not None:
            return "compare-and-swap", "S3 conditional writes (If-None-Match: *, If-Match: <etag>)"
        return "bakery", "the S3 server does not honour If-None-Match/If-Match on PUT (or obstore is missing)"
    return "bakery", f"no conditional writes through pyarrow on {fs.kind} stores"


# ---- a claim per taker (Lamport's bakery) ---------------------------------------------------------
def claims_dir(store: LeaseStore, key: str) -> str:
    return f"{store._lease_rel(key)}.claims"


def _claim(store: LeaseStore, key: str, owner: str, ttl_s: float, number: int | None) -> None:
    rel = f"{claims_dir(store, key)}/{owner}"
    doc: dict[str, object] = {"owner": owner, "expires": time.time() + ttl_s, "ttl": ttl_s}
    doc.update({"choosing": True} if number is None else {"number": number})
    store.put_bytes(rel, json.dumps(store.trust.sign(store.domain, rel, doc)).encode())


def _others(
    store: LeaseStore, key: str, owner: str, ttl_s: float, unsure: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """The live claims of other takers (expired ones are removed: their takers are gone).

    With `unsure` (step 4: the first time each claim could not be read), a claim that is listed but
    reads absent or not whole counts as `choosing` until it reads whole, for at most a TTL. A store
    whose PUT is not atomic (rclone's `serve s3` under load, HDFS) shows a claim being rewritten from
    `choosing` to its number half written or briefly gone; read as nobody's claim, it let the taker
    that read it win beside the one that wrote it (issue 46: two nodes ran one setup, seen under load).
    A claim that was dropped leaves the listing, so this costs a poll; one that never reads whole (not
    a claim at all) holds the others back for one TTL, as an expired claim would."""
    out = []
    now = time.time()
    for rel in store.list(claims_dir(store, key)):
        if rel.rsplit("/", 1)[-1] == owner:
            continue
        doc, whole = _read(store, rel)
        if doc is None:
            if unsure is not None and not whole and now - unsure.setdefault(rel, now) < ttl_s:
                out.append({"owner": rel.rsplit("/", 1)[-1], "choosing": True})
            continue
        expires, ttl = doc.get("expires"), doc.get("ttl")
        if not isinstance(expires, (int, float)) or not isinstance(ttl, (int, float)):
            continue
        ttl = min(ttl, ttl_s) if ttl > 0 else ttl_s  # as `Store.lease_live`: never longer than our own TTL
        skew = min(ttl / 2, LEASE_SKEW_S)
        if now > expires + skew:
            with contextlib.suppress(Exception):
                store.delete(rel)
            continue
        if expires <= now + ttl + skew:  # a claim never reaches further than one TTL (else: forged)
            out.append(doc)
    return out


def _read(store: LeaseStore, rel: str) -> tuple[dict[str, Any] | None, bool]:
    """(the claim, True), or (None, whole): whole is False when the object was absent or not a whole
    JSON document (mid-rewrite, see `_others`), True when it was whole but not a claim this domain's
    readers accept (unsigned where signatures are required: nobody's claim)."""
    data = store.get_bytes(rel)
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        return None, False
    if not isinstance(doc, dict):
        return None, False
    if store.trust.check(store.domain, rel, doc):
        return None, True
    return doc, True


def _rank(doc: dict[str, Any]) -> tuple[int, str]:
    n = doc.get("number")
    return (n if isinstance(n, int) and not isinstance(n, bool) else 0, str(doc.get("owner")))


def take_by_claims(store: LeaseStore, key: str, owner: str, ttl_s: float, lease_doc: bytes) -> bool:
    """Run the bakery for `key` as `owner`; True when this taker won (the lease document is then written)."""
    t_choose = time.monotonic()
    _claim(store, key, owner, ttl_s, None)
    try:
        number = 1 + max((_rank(d)[0] for d in _others(store, key, owner, ttl_s)), default=0)
        t_num = time.monotonic()
        _claim(store, key, owner, ttl_s, number)
        # the number must be out while the `choosing` claim still held for everyone (else a taker that
        # saw it lapse chose without waiting for us), and each later write while the previous one held
        if time.monotonic() - t_choose < ttl_s and _won(store, key, owner, ttl_s, number, t_num):
            store.put_bytes(store._lease_rel(key), lease_doc)
            return True
    except BaseException:
        drop_claim(store, key, owner)
        raise
    drop_claim(store, key, owner)
    return False


def _won(store: LeaseStore, key: str, owner: str, ttl_s: float, number: int, t_num: float) -> bool:
    """Steps 4 and 5: wait out the takers still choosing, then whether no live claim ranks lower.

    Our claim is refreshed while we wait (a `choosing` claim is never refreshed: it ends or expires
    within a TTL); any gap of a TTL since our last claim was written means it may have lapsed for the
    others: we give up rather than decide on it."""
    give_up = t_num + 2 * (ttl_s + LEASE_SKEW_S)
    unsure: dict[str, float] = {}
    while time.monotonic() < give_up:
        others = _others(store, key, owner, ttl_s, unsure)
        if time.monotonic() - t_num >= ttl_s:
            return False
        if not any(d.get("choosing") for d in others):
            return not any(_rank(d) < (number, owner) for d in others)
        if time.monotonic() - t_num > ttl_s / 3:
            t_before = time.monotonic()
            _claim(store, key, owner, ttl_s, number)
            if time.monotonic() - t_num >= ttl_s:
                return False
            t_num = t_before
        time.sleep(POLL_S)
    return False


def renew_claim(store: LeaseStore, key: str, owner: str, ttl_s: float) -> None:
    """Keep the holder's claim alive with its lease (same number: a taker that read it stays behind)."""
    doc = _read(store, f"{claims_dir(store, key)}/{owner}")[0] or {}
    number = doc.get("number")
    if isinstance(number, int):
        _claim(store, key, owner, ttl_s, number)


def drop_claim(store: LeaseStore, key: str, owner: str) -> None:
    with contextlib.suppress(Exception):  # it expires by itself
        store.delete(f"{claims_dir(store, key)}/{owner}")
