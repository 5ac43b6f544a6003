"""The single-flight lease of an env build: its name in the store, and the keeper that renews it.

One node takes the lease and builds while the others wait for its snapshot (stage.py
`_single_flight`); the keeper renews it in the background while the setup runs, can hand it over to
the agent's upload (agent_tasks.py), and releases it once the ref is written.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..store.core import Lease


def lease_key(env_key: str) -> str:
    """The store's lease for building `env_key`: one per env key, so builds of other envs never wait on it."""
    return f"env-{env_key}"


class LeaseKeeper:
    """Renews a single-flight lease in the background while a long setup runs.

    A renewal happens only while the lease is still ours (`Store.renew_lease` compares and swaps: a
    local store's rename and link, an S3 store's If-Match on the version this holder wrote): once
    it finds another owner, which took the lease over after ours expired (a stalled node), the keeper
    stops, sets `lost`, and never overwrites the new owner's lease; the release at the end is then
    a no-op. The work goes on (the snapshot it publishes is content-addressed, so a duplicate is
    harmless), but the single flight is over, which `lost` tells.
    """

    def __init__(self, lease: Lease, ttl_s: float, on_renew: Callable[[], None] | None = None) -> None:
        self.lease = lease
        self.ttl_s = ttl_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._on_renew = on_renew
        self._handed_over = False
        self._t = threading.Thread(target=self._run, name="bootseer-lease", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            with contextlib.suppress(BootseerError, OSError, ValueError):  # a missed renewal: try again later
                if not self.lease.renew(self.ttl_s):
                    self.lost.set()
                    return
                if self._on_renew is not None:
                    self._on_renew()

    def hand_over(self) -> None:
        """Keep renewing past the `with` block, and never release: another process takes the lease on.

        Call `stop_renewing` (before exec) when that process is about to take over."""
        self._handed_over = True

    def stop_renewing(self) -> None:
        """Stop the renewals and wait for one in flight (an exec part way through a local renewal would
        leave the lease file moved aside, i.e. free), then renew once more: the lease's full TTL for
        the next holder to start renewing it. The lease is not released."""
        self._stop.set()
        self._t.join(10.0)
        with contextlib.suppress(BootseerError, OSError, ValueError):  # it still holds until its expiry
            if not self.lease.lost and not self.lease.renew(self.ttl_s):
                self.lost.set()

    def __enter__(self) -> LeaseKeeper:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop renewing and release, waiting a few seconds at most: the ref is written before this,
        so a slow store only delays the lease's expiry for others, never their restore. A keeper
        handed over (`hand_over`) goes on renewing until `stop_renewing`, and releases nothing."""
        if self._handed_over:
            return
        self._stop.set()

        def release() -> None:
            with contextlib.suppress(BootseerError, OSError, ValueError):  # it expires by itself
                self.lease.release()

        t = threading.Thread(target=release, name="bootseer-lease-release", daemon=True)
        t.start()
        t.join(3.0)
