"""A store that stopped answering is not asked again for a while, and its small requests give up soon.

Issue 29 bounds what a start waits for its store: the job starts within `[p2p] deadline_s` (+5 s) of
`bootseer exec` whatever the store does. Closed ports were tested; a store that takes the connection
and then never answers (a hung load balancer or proxy) was not. There each request cost the S3 SDK's
low-speed timeout (60 s, set for large transfers from a busy server) times its three attempts, and
every stage paid again: `bootseer exec` with the env and image stages took 363 s before the job ran,
and 63 s where the endpoint dropped SYNs (10 s connect timeout, three attempts, two stages).

Two parts, both per store handle (so per process), both for small requests only (refs, stats,
listings, deletes, small writes such as a run's events: `StoreFS.meta`). Blob transfers keep their
long timeout and are not guarded: their readers own their retries (the stripe reader rides out a
link cut of seconds).

- **Short timeouts** (`META_*`, applied in `storefs`). On S3 the small requests go through a second
  client whose requests give up after `META_REQUEST_S` without a byte and `META_CONNECT_S` to connect,
  in `META_ATTEMPTS` attempts, so the first contact with a silent store ends in ~20 s. A URI that sets
  `request_timeout` or `connect_timeout` itself gets those for both clients.
- **A breaker** (`Breaker`). A small request that fails at the network level (the SDK's
  NETWORK_CONNECTION, a timeout, a refused or unresolvable endpoint), after the client's own retries,
  marks the store down; every small request until then fails at once with that reason, as an OSError,
  which each caller already turns into its one-line StoreError and its fallback. A start holds it down
  until exec (its agent, another process, asks again); elsewhere it is down for `DOWN_S`, then one
  request may try again, so a long-lived agent is not cut off by a blip of a restarting server. Other
  errors (not found, access denied) do not trip it: they say nothing of whether the next request is
  answered.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

# After a network failure, how long every small request fails at once (then one may try again): short,
# for long-lived processes (the agent) that a blip of a restarting server must not cut off for long.
DOWN_S = 15.0
# The small requests' client (S3): seconds without a byte, seconds to connect, attempts in all.
META_REQUEST_S = 10.0
META_CONNECT_S = 5.0
META_ATTEMPTS = 2
# Texts of errors that mean "the store did not answer", from pyarrow's S3 (curl), GCS and HDFS clients.
NETWORK_MARKERS = (
    "NETWORK_CONNECTION",
    "Timeout was reached",
    "Connection refused",
    "Couldn't connect",
    "Could not resolve",
    "Couldn't resolve",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
)


class Breaker:
    """Whether a store is down, why, and until when (`time.monotonic`). `hold_s`: how long a failure
    keeps it down; a start holds it down until exec (`StageContext.store`)."""

    def __init__(self, hold_s: float = DOWN_S) -> None:
        self.reason = ""
        self.until = 0.0
        self.hold_s = hold_s

    def check(self) -> None:
        """Raise at once while the store is down."""
        if self.reason and time.monotonic() < self.until:
            raise OSError(f"the store did not answer an earlier request ({self.reason}); not asked again for a while")

    def trip(self, e: BaseException) -> None:
        """Mark the store down when `e` says it did not answer; any other error leaves it up."""
        text = str(e)
        marker = next((m for m in NETWORK_MARKERS if m in text), None)
        if marker is not None:
            curl = re.search(r"curlCode: \d+, [^;.]*", text)  # "curlCode: 28, Timeout was reached"
            self.reason = curl.group(0) if curl else marker
            self.until = time.monotonic() + self.hold_s


class Guarded:
    """A pyarrow filesystem whose every method call passes `breaker` first and trips it on failure.
    Attributes that are not methods (`type_name`, `region`) are read through unchanged."""

    def __init__(self, fs: Any, breaker: Breaker) -> None:
        self._fs = fs
        self._breaker = breaker

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if not callable(attr):
            return attr
        return self._call(attr)

    def _call(self, method: Callable[..., Any]) -> Callable[..., Any]:
        breaker = self._breaker

        def call(*args: Any, **kwargs: Any) -> Any:
            breaker.check()
            try:
                return method(*args, **kwargs)
            except OSError as e:
                breaker.trip(e)
                raise

        return call
