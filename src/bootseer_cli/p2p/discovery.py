"""Finding the other nodes of a blob's swarm without a tracker: through the store, or a static list.

Each node that downloads or seeds a blob writes a small JSON document under
`swarm/<digest>/<name>.json` (its address, port and state) and lists the others'. The store is
already the one thing every node of the job can reach, so this needs no extra service. Entries are
refreshed while a node takes part and ignored once stale, so a node that died without cleaning up
costs the others one refused connection at most.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlparse

from ..errors import IntegrityError, StoreError

if TYPE_CHECKING:
    from ..settings import P2PSettings
    from ..store.core import Store

STALE_S = 90.0  # an entry not refreshed for this long is ignored
REFRESH_S = 10.0


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    state: str = ""  # "downloading" | "seed" | "" (static peer: unknown)
    name: str = ""


def node_name() -> str:
    return os.environ.get("BOOTSEER_NODE") or socket.gethostname()


def _clean(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text).strip(".") or "node"


def parse_endpoint(text: str) -> Endpoint:
    """`host:port` or `[v6]:port` from `[p2p] peers` / `BOOTSEER_PEERS`."""
    from ..errors import ConfigError

    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"[p2p] peers: {text!r} is not host:port")
    return Endpoint(host.strip("[]"), int(port))


def static_peers(p2p: P2PSettings) -> list[Endpoint]:
    """`[p2p] peers`: the nodes to connect to besides those announced in the store."""
    return [parse_endpoint(p) for p in p2p.peers]


def local_host(p2p: P2PSettings, store: Store) -> str:
    """The address other nodes can reach this one at.

    `[p2p] host` when set; otherwise the local address of the route to the store's endpoint (an
    unconnected UDP socket's `connect` sends nothing, it only asks the kernel for the route); else
    the address the host name resolves to; else loopback.
    """
    if p2p.host:
        return p2p.host
    target = _store_endpoint(getattr(store, "uri", ""))
    if target:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(target)
            return str(s.getsockname()[0])
    with contextlib.suppress(OSError):
        for addr in socket.gethostbyname_ex(socket.gethostname())[2]:
            if not addr.startswith("127."):
                return addr
    return "127.0.0.1"


def _store_endpoint(uri: str) -> tuple[str, int] | None:
    parsed = urlparse(uri)
    if parsed.scheme != "s3":
        return None
    override = dict(parse_qsl(parsed.query)).get("endpoint_override")
    if not override:
        return None
    hostport = override.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host:
        return hostport, 80
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


class Announcer:
    """This node's entry in one blob's swarm: written, refreshed and removed."""

    def __init__(self, store: Store, digest: str, host: str, port: int) -> None:
        self.store = store
        self.digest = digest
        self.host = host
        self.port = port
        self.name = _clean(f"{node_name()}-{host}-{port}")
        self.rel = f"swarm/{digest}/{self.name}.json"
        self.state = ""
        self.written = 0.0

    def write(self, state: str) -> None:
        doc = {"node": node_name(), "host": self.host, "port": self.port, "state": state, "updated": time.time()}
        self.store.put_doc(self.rel, doc)  # signed: an entry decides which host:port every node connects to
        self.state = state
        self.written = time.time()

    def refresh(self) -> None:
        """Rewrite the entry before it goes stale; a store hiccup is retried at the next refresh."""
        if self.state and time.time() - self.written > REFRESH_S:
            with contextlib.suppress(StoreError, OSError):
                self.write(self.state)

    def remove(self) -> None:
        """Leave the swarm's directory (best effort: a leftover entry goes stale on its own)."""
        with contextlib.suppress(StoreError, OSError):
            self.store.delete(self.rel)
        self.state = ""


def swarm_peers(store: Store, digest: str, exclude: str = "") -> list[Endpoint]:
    """The live entries of a blob's swarm, other than `exclude` (this node's entry name)."""
    out = []
    now = time.time()
    for rel in store.list(f"swarm/{digest}"):
        name = rel.rsplit("/", 1)[-1].removesuffix(".json")
        if name == exclude or not rel.endswith(".json"):
            continue
        try:
            doc = store.get_doc(rel, across=False) or {}  # an unsigned or forged entry: not a peer (warned)
            if now - float(doc.get("updated", 0)) > STALE_S:
                continue
            out.append(Endpoint(str(doc["host"]), int(doc["port"]), str(doc.get("state", "")), name))
        except (ValueError, KeyError, TypeError, IntegrityError):
            continue  # a torn or foreign entry: not a peer
    return out
