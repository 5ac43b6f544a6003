"""Documents of the store refused for want of a signature: said once per start, on one line.

A site that turns signing on (`[trust] verify_keys`, trust.py) over a store its jobs filled unsigned
holds many refs that no longer verify. Each is a miss, as it must be, but a warning per ref, on every
start (the env stage alone reads every env ref when it looks for a parent to layer on), buries the one
thing to do: sign them (`bootseer trust sign`, resign.py). So an unsigned document is counted here, by
store, domain and kind, and `say` prints one line per store: how many of which kind, why they were
not used, and the command that fixes it. `exec` says it after its stages; any other verb at its exit.

A document refused for another reason (a bad signature, a key not trusted, a replay) is not an
artefact of turning signing on but a forgery or a misconfiguration: it is still said on its own line,
once per process (`Store.get_doc`'s warning, unchanged).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .redact import warn

if TYPE_CHECKING:
    from .trust import Trust

UNSIGNED = "unsigned"  # Trust.check's reason for a document without a signature where one is required


class Reader(Protocol):
    """What `refused` reads of the store (a `store.core.Store`): its display URI and whose view it is.
    A protocol, so that the store, which calls `refused`, and this module do not import each other."""

    @property
    def uri(self) -> str: ...

    @property
    def trust(self) -> Trust: ...


Refused = Callable[[Reader, str, str, str], None]  # (store, rel, domain, why): as `refused` takes them
_lock = threading.Lock()
_counts: dict[tuple[str, str], dict[str, set[str]]] = {}  # (store uri, domain) -> kind -> refused documents
_said: set[str] = set()  # store URIs whose line this process printed
_seen_as: dict[str, tuple[str, bool]] = {}  # store uri -> (the reader's own domain, whether it holds the key)
_hooked: list[bool] = []


def kind_of(rel: str) -> str:
    """The kind a start's reader and `trust sign` name a document by: `env` for `refs/env/…`, `ckpt`…"""
    parts = rel.split("/")
    return parts[1] if parts[0] == "refs" and len(parts) > 2 else parts[0]


def refused(store: Reader, rel: str, domain: str, why: str) -> None:
    """`store.get_doc` refused `domain/rel` because of `why`: counted when it is unsigned (said by
    `say`), said at once (once per process and message) otherwise."""
    uri = store.uri
    if why != UNSIGNED:
        warn(f"{domain}/{rel} in {uri} is not used: {why}", once=True)
        return
    with _lock:
        if uri in _said:
            return  # this start said it already: one line per start
        _counts.setdefault((uri, domain), {}).setdefault(kind_of(rel), set()).add(rel)  # a ref read twice: one
        _seen_as.setdefault(uri, (store.trust.domain, store.trust.signer is not None))
        if not _hooked:
            _hooked.append(True)
            atexit.register(say)


def summary(uri: str, own: str, signs: bool) -> str:
    """The line for the store at `uri` ("" when nothing of it was refused), seen from domain `own`."""
    with _lock:
        per = {d: c for (u, d), c in _counts.items() if u == uri}
    if not per:
        return ""
    from .units import count

    total = sum(len(rels) for c in per.values() for rels in c.values())
    parts = []
    for domain, c in sorted(per.items()):
        kinds = ", ".join(f"{k} {len(rels)}" for k, rels in sorted(c.items()))
        parts.append(f"domain {domain}: {kinds}")
    fix = "bootseer trust sign" + ("" if signs else " where [trust] signing_key is set")
    others = ", ".join(sorted(d for d in per if d != own))
    if others:
        fix += f" (for {others}: by its owner, with its key)" if own in per else " by its owner, with its key"
    if any("swarm" in c for c in per.values()):  # a peer's entry is not signed after the fact: rewritten
        fix += " (not swarm entries: their seeds write them anew)"
    return (
        f"{count(total, 'unsigned ref')} in {uri} not used ({'; '.join(parts)}): [trust] verify requires a "
        f"signature, so each is a miss; sign them, after a check of their blobs: {fix}"
    )


def say() -> None:
    """Print each store's line (once per process and store): `exec` after its stages, any other verb at
    its exit (`atexit`)."""
    with _lock:
        uris = sorted({u for u, _ in _counts} - _said)
    for uri in uris:
        line = summary(uri, *_seen_as.get(uri, ("", True)))
        with _lock:
            _said.add(uri)
            for key in [k for k in _counts if k[0] == uri]:
                del _counts[key]
        if line:
            warn(line)
