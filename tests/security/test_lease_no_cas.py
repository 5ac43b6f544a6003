"""Issue 45 item 9: single-flight on a store without conditional writes (`rclone serve s3`).

There a lease was taken by checking it is free, writing it, waiting `settle_s` and reading it back. A
taker that stalled between its check and its write (a GC pause, a loaded node: CI saw two nodes both
run the setup of test_cold_start_then_restart) wrote over the lease the other had meanwhile taken and
settled, read back its own id, and both held it. The lease is now taken with a claim per taker and
Lamport's bakery (a number above every number seen, lowest wins, wait out anyone still choosing), which
holds however long a taker stalls while its claim lives.

The stall is made deterministic: taker A's store blocks its Nth lease write until B is done trying
(or, at the second write, for a while B spends waiting on A's claim).
"""

from __future__ import annotations

import threading
import time

import pytest

from bootseer_cli.store.core import Lease, Store
from tests.support.s3server import S3Server

pytestmark = pytest.mark.integration

TTL = 30.0


class _Stalling(Store):
    """A store whose `stall_at`-th write below leases/ waits for `go` (a taker paused mid-take)."""

    def __init__(self, uri: str, stall_at: int, go: threading.Event) -> None:
        super().__init__(uri, settle_s=0.5)
        self.stall_at, self.go, self.writes = stall_at, go, 0
        self.stalled = threading.Event()

    def put_bytes(self, rel: str, data: bytes) -> None:
        if rel.startswith("leases/"):
            self.writes += 1
            if self.writes == self.stall_at:
                self.stalled.set()
                self.go.wait(60)
        super().put_bytes(rel, data)


@pytest.mark.parametrize("stall_at", [1, 2])
def test_a_stalled_taker_and_its_successor_never_both_hold(s3_server: S3Server, stall_at: int) -> None:
    uri = s3_server.uri(f"nocas-{stall_at}-{time.monotonic_ns()}")
    b = Store(uri, settle_s=0.5)
    assert b.conditional() is None, "rclone serve s3 ignores conditional writes (the case under test)"
    go = threading.Event()
    a = _Stalling(uri, stall_at, go)
    got: dict[str, Lease | None] = {}
    t = threading.Thread(target=lambda: got.setdefault("a", a.try_lease("env-x", TTL)))
    t.start()
    assert a.stalled.wait(60), "A reached its stall"
    if stall_at == 1:  # A checked the lease (free) and stalls before writing anything: B takes it
        got["b"] = b.try_lease("env-x", TTL)
        go.set()
    else:  # A wrote its first claim and stalls in the middle: B must not go past it meanwhile
        threading.Timer(3.0, go.set).start()
        got["b"] = b.try_lease("env-x", TTL)
    t.join(120)
    holders = [k for k, v in got.items() if v is not None]
    assert len(holders) == 1, f"holders: {holders}"
    held = got[holders[0]]
    assert held is not None
    held.release()
    again = Store(uri, settle_s=0.5).try_lease("env-x", TTL)
    assert again is not None, "a released lease is free again"
    again.release()


class _TearsClaims(Store):
    """A store whose first `tears` reads of other takers' claims come back half written: what `rclone
    serve s3` (whose PUT is not atomic) returned under load while a claim was rewritten from `choosing`
    to its number (95 of 190 bytes, seen here)."""

    def __init__(self, uri: str, tears: int) -> None:
        super().__init__(uri, settle_s=0.5)
        self.tears = tears

    def get_bytes(self, rel: str) -> bytes | None:
        data = super().get_bytes(rel)
        if ".claims/" in rel and data and self.tears > 0:
            self.tears -= 1
            return data[: len(data) // 2]
        return data


def test_a_claim_read_half_written_is_waited_for_not_passed(s3_server: S3Server) -> None:
    """Issue 46 (two nodes ran one setup on S3 under load): B read A's claim torn, took it for nobody's,
    and won beside A. A claim that is listed but not whole now counts as still choosing until it reads
    whole: B sees A's lower number and stays behind."""
    from bootseer_cli.store.leases import _claim

    uri = s3_server.uri(f"torn-{time.monotonic_ns()}")
    a = Store(uri, settle_s=0.5)
    _claim(a, "env-x", "0-a", TTL, 1)  # A has its number: it ranks before any taker that takes 1 too
    b = _TearsClaims(uri, tears=2)  # torn when B chooses its number (so B takes 1) and when B decides
    assert b.try_lease("env-x", TTL) is None, "B passed A's claim while it read half written"
    assert b.tears == 0
