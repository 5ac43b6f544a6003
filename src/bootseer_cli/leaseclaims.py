"""Single-flight leases on object stores without conditional writes: a claim per taker, Lamport's bakery.

Where the server ignores `If-None-Match` (rclone's `serve s3`, older MinIO and Ceph, GCS and HDFS
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
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store import Store

POLL_S = 0.2
# Clock-skew allowance of leases (see `Store.lease_live`): a lease holds until its expiry plus
# min(TTL/2, this), so nodes whose clocks differ by less never take each other's live lease.
LEASE_SKEW_S = 30.0


def claims_dir(store: Store, key: str) -> str:
    return f"{store._lease_rel(key)}.claims"


def _claim(store: Store, key: str, owner: str, ttl_s: float, number: int | None) -> None:
    rel = f"{claims_dir(store, key)}/{owner}"
    doc: dict[str, object] = {"owner": owner, "expires": time.time() + ttl_s, "ttl": ttl_s}
    doc.update({"choosing": True} if number is None else {"number": number})
    store.put_bytes(rel, json.dumps(store.trust.sign(store.domain, rel, doc)).encode())


def _others(store: Store, key: str, owner: str, ttl_s: float) -> list[dict[str, Any]]:
    """The live claims of other takers (expired ones are removed: their takers are gone)."""
    out = []
    now = time.time()
    for rel in store.list(claims_dir(store, key)):
        if rel.rsplit("/", 1)[-1] == owner:
            continue
        doc = _read(store, rel)
        if doc is None:
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


def _read(store: Store, rel: str) -> dict[str, Any] | None:
    data = store.get_bytes(rel)
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or store.trust.check(store.domain, rel, doc):
        return None  # torn, or not signed as this domain's readers require: nobody's claim
    return doc


def _rank(doc: dict[str, Any]) -> tuple[int, str]:
    n = doc.get("number")
    return (n if isinstance(n, int) and not isinstance(n, bool) else 0, str(doc.get("owner")))


def take(store: Store, key: str, owner: str, ttl_s: float, lease_doc: bytes) -> bool:
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
        drop(store, key, owner)
        raise
    drop(store, key, owner)
    return False


def _won(store: Store, key: str, owner: str, ttl_s: float, number: int, t_num: float) -> bool:
    """Steps 4 and 5: wait out the takers still choosing, then whether no live claim ranks lower.

    Our claim is refreshed while we wait (a `choosing` claim is never refreshed: it ends or expires
    within a TTL); any gap of a TTL since our last claim was written means it may have lapsed for the
    others: we give up rather than decide on it."""
    give_up = t_num + 2 * (ttl_s + LEASE_SKEW_S)
    while time.monotonic() < give_up:
        others = _others(store, key, owner, ttl_s)
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


def renew(store: Store, key: str, owner: str, ttl_s: float) -> None:
    """Keep the holder's claim alive with its lease (same number: a taker that read it stays behind)."""
    doc = _read(store, f"{claims_dir(store, key)}/{owner}") or {}
    number = doc.get("number")
    if isinstance(number, int):
        _claim(store, key, owner, ttl_s, number)


def drop(store: Store, key: str, owner: str) -> None:
    with contextlib.suppress(Exception):  # it expires by itself
        store.delete(f"{claims_dir(store, key)}/{owner}")
