"""Leases: renewed and released only by their owner; a clock running ahead is tolerated and bounded.

On the local store and on the loopback S3 server (the `store_uri` fixture), as bootseer uses both.
"""

from __future__ import annotations

import json
import time

import pytest

from bootseer_cli.envsnap.lease import LeaseKeeper
from bootseer_cli.store import core as store_mod
from bootseer_cli.store.core import Store

pytestmark = pytest.mark.integration


class _ClockAhead:
    """The `time` module as seen by a node whose clock runs `ahead` seconds fast."""

    def __init__(self, ahead: float) -> None:
        self.ahead = ahead
        self.sleep = time.sleep

    def time(self) -> float:
        return time.time() + self.ahead


def _expire(lease_ttl: float) -> None:
    """Sleep past a lease's expiry plus its skew allowance (TTL/2 for short TTLs)."""
    time.sleep(lease_ttl * 1.5 + 0.3)


def test_a_lost_lease_is_neither_renewed_nor_released(store_uri: str) -> None:
    st = Store(store_uri, settle_s=0.3)
    a = st.try_lease("env-lost", ttl_s=0.4)
    assert a is not None
    _expire(0.4)
    b = st.try_lease("env-lost", ttl_s=30)
    assert b is not None and b.owner != a.owner
    assert a.renew(0.4) is False and a.lost  # A learns it lost the lease …
    assert st.read_lease("env-lost")["owner"] == b.owner  # … and B's lease is untouched
    a.release()
    assert st.read_lease("env-lost")["owner"] == b.owner
    assert b.renew(30) is True and not b.lost
    b.release()
    assert st.read_lease("env-lost") is None


def test_keeper_stops_when_its_lease_was_taken_over(store_uri: str) -> None:
    st = Store(store_uri, settle_s=0.3)
    a = st.try_lease("env-keeper", ttl_s=0.4)
    assert a is not None
    _expire(0.4)  # A stalled past its expiry (its keeper did not run) …
    b = st.try_lease("env-keeper", ttl_s=30)
    assert b is not None
    with LeaseKeeper(a, ttl_s=0.6) as keeper:  # … and now its keeper renews, every 0.2 s
        assert keeper.lost.wait(5.0), "the keeper never learnt it lost the lease"
    doc = st.read_lease("env-keeper")
    assert doc is not None and doc["owner"] == b.owner  # not overwritten, not released by A
    b.release()


def test_keeper_keeps_a_lease_that_is_still_ours(store_uri: str) -> None:
    st = Store(store_uri, settle_s=0.3)
    a = st.try_lease("env-kept", ttl_s=0.9)
    assert a is not None
    with LeaseKeeper(a, ttl_s=0.9) as keeper:
        time.sleep(2.0)  # longer than the TTL: only the renewals keep it
        assert st.try_lease("env-kept", ttl_s=30) is None
        assert not keeper.lost.is_set()
    assert st.read_lease("env-kept") is None  # released at the end


def test_a_clock_61_s_ahead_does_not_take_a_live_lease(store_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(store_uri, settle_s=0.3)
    a = st.try_lease("env-skew", ttl_s=60)
    assert a is not None
    monkeypatch.setattr(store_mod, "time", _ClockAhead(61.0))
    assert st.try_lease("env-skew", ttl_s=60) is None
    monkeypatch.setattr(store_mod, "time", time)
    a.release()


def test_a_far_future_expiry_is_bounded_by_the_store_clock(store_uri: str) -> None:
    """A holder whose clock ran a day ahead wrote its lease, then died: held for one TTL, not a day."""
    st = Store(store_uri, settle_s=0.3)
    doc = {"owner": "fast-clock-node", "expires": time.time() + 86400, "ttl": 1.0}
    st.put_bytes("leases/env-future", json.dumps(doc).encode())
    assert st.try_lease("env-future", ttl_s=30) is None  # just written: held
    time.sleep(3.0)  # TTL + skew after the store's modification time (whole seconds on S3)
    taken = st.try_lease("env-future", ttl_s=30)
    assert taken is not None
    taken.release()
