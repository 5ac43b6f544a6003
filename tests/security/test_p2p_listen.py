"""Item 5 of issue 14: the libtorrent listener binds the announced address, never every interface.

A real libtorrent session (the process's swarm node, as `fetch_blob` starts it) with a store on the
loopback S3 server and no `[p2p] host`: the announced address is the one routing to the store
(127.0.0.1), and /proc/net/tcp must show the listening socket on that address, not on 0.0.0.0.
`[p2p] listen` moves it.
"""

from __future__ import annotations

import os
import socket
import struct

import pytest

from bootseer_cli.p2p import fetch as p2p_fetch
from bootseer_cli.p2p.discovery import local_host
from bootseer_cli.settings import P2PSettings
from bootseer_cli.store.core import Store
from tests.p2p.nodes import port_range, swarm_secret_file

pytestmark = pytest.mark.integration


def _listeners(port: int) -> set[str]:
    """Local IPv4 addresses with a TCP socket in LISTEN state on `port` (from /proc/net/tcp)."""
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] == "0A" and int(hexport, 16) == port:
                out.add(socket.inet_ntoa(struct.pack("<I", int(addr, 16))))
    return out


def _node_listeners(p2p: P2PSettings, store: Store) -> tuple[str, set[str]]:
    node = p2p_fetch.get_node(p2p, store)
    try:
        return node.swarm.announce_host, _listeners(node.swarm.port)
    finally:
        p2p_fetch.shutdown(0)


def test_listener_binds_the_announced_address_only(s3_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(s3_server.uri(f"p2p-{os.urandom(4).hex()}"))
    p2p = P2PSettings(enabled=True, port=port_range(), key_file=swarm_secret_file(tmp_path))
    announced, bound = _node_listeners(p2p, store)
    assert announced == local_host(p2p, store) == "127.0.0.1"
    assert bound == {"127.0.0.1"}, f"listener bound to {bound}, not only the announced address"


def test_listen_setting_overrides_the_address(s3_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(s3_server.uri(f"p2p-{os.urandom(4).hex()}"))
    p2p = P2PSettings(enabled=True, port=port_range(), listen="127.0.0.2", key_file=swarm_secret_file(tmp_path))
    announced, bound = _node_listeners(p2p, store)
    assert announced == "127.0.0.1"
    assert bound == {"127.0.0.2"}
