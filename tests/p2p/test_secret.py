"""Issue 26 case 8: what the store holds does not let a host fetch a blob from the swarm.

A node seeds a blob (the real fetch path: it takes the lease, reads the store, seeds through its
helper). Outsiders are real libtorrent sessions in this process that know everything in the store:
the stored torrent (hence its info-hash) and the node's swarm entry (host and port). They get no
byte. A peer with the job's secret gets the whole blob, and only over the encrypted transport.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.errors import ConfigError
from bootseer_cli.p2p.discovery import swarm_peers
from bootseer_cli.p2p.publish import publish_file
from bootseer_cli.settings import P2PSettings
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store
from tests.p2p.nodes import port_range, random_file, swarm_secret_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1 << 20
SIZE = 4 * MiB


@pytest.fixture
def seeding(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A node of the job that fetched the blob (as the origin) and now seeds it; shut down after."""
    from bootseer_cli.p2p import fetch

    store = Store((tmp_path / "store").as_uri())
    src = random_file(tmp_path / "blob.bin", SIZE, seed=5)
    digest, tdigest = publish_file(store, src)
    secret_file = swarm_secret_file(tmp_path)
    p2p = P2PSettings(enabled=True, host="127.0.0.1", port=port_range(), key_file=secret_file)
    try:
        got = fetch.fetch_from_swarm(p2p, store, digest, BlobCache(tmp_path / "cache", 1 << 30))
        assert got.origin
        yield {"store": store, "digest": digest, "tdigest": tdigest, "secret_file": secret_file, "path": src}
    finally:
        fetch.shutdown(0)


def _session(**settings: Any) -> Any:
    import libtorrent as lt

    base = {
        "listen_interfaces": f"127.0.0.1:{port_range().split('-')[0]}",
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "enable_outgoing_utp": False,
        "enable_incoming_utp": False,
        "allow_multiple_connections_per_ip": True,
    }
    return lt.session({**base, **settings})


def _try_fetch(torrent: bytes, store: Store, digest: str, save: Path, wait_s: float, **settings: Any) -> Any:
    """A libtorrent peer with `torrent` connecting to every endpoint in the blob's swarm entries."""
    import libtorrent as lt

    ses = _session(**settings)
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(lt.bdecode(torrent))
    atp.save_path = str(save)
    handle = ses.add_torrent(atp)
    peers = swarm_peers(store, digest)
    assert peers, "the seeding node has no swarm entry"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for p in peers:
            handle.connect_peer((p.host, p.port))
        if handle.status().is_seeding:
            break
        time.sleep(0.5)
    st = handle.status()
    ses.remove_torrent(handle)
    del ses
    return st


def test_a_peer_that_knows_the_store_gets_no_byte(seeding: dict[str, Any], tmp_path: Path) -> None:
    """Before: the nodes joined the stored torrent's swarm, in plaintext; knowing it was enough."""
    store, digest = seeding["store"], seeding["digest"]
    stored = store.get_blob_bytes(seeding["tdigest"])
    # libtorrent's defaults: plaintext or encrypted, whichever the other side takes.
    st = _try_fetch(stored, store, digest, tmp_path / "outsider", 8)
    assert st.total_payload_download == 0 and st.num_pieces == 0, "an outsider got pieces of the blob"
    # The same torrent made private (what a careful outsider would also try): another info-hash, nothing.
    import libtorrent as lt

    doc = lt.bdecode(stored)
    doc[b"info"][b"private"] = 1
    st = _try_fetch(bytes(lt.bencode(doc)), store, digest, tmp_path / "outsider2", 4)
    assert st.total_payload_download == 0 and st.num_pieces == 0


def test_a_peer_with_the_secret_gets_the_blob_encrypted_only(seeding: dict[str, Any], tmp_path: Path) -> None:
    import libtorrent as lt

    from bootseer_cli.p2p.secret import read_secret_file, swarm_torrent
    from bootseer_cli.p2p.swarm import session_settings

    store, digest = seeding["store"], seeding["digest"]
    joined = swarm_torrent(store.get_blob_bytes(seeding["tdigest"]), digest, read_secret_file(seeding["secret_file"]))
    # The secret, spoken in plaintext: refused (the transport is encrypted or nothing).
    plain = {
        "out_enc_policy": int(lt.enc_policy.disabled),
        "in_enc_policy": int(lt.enc_policy.disabled),
        "allowed_enc_level": int(lt.enc_level.plaintext),
    }
    st = _try_fetch(joined, store, digest, tmp_path / "plain", 5, **plain)
    assert st.total_payload_download == 0, "a plaintext connection was served"
    # The secret, encrypted as the nodes speak: the whole blob.
    lo, hi = (int(x) for x in port_range().split("-"))
    ours = session_settings("127.0.0.1", lo, hi)
    st = _try_fetch(joined, store, digest, tmp_path / "insider", 30, **ours)
    assert st.is_seeding, f"the peer with the secret got {st.total_payload_download} bytes"
    got = (tmp_path / "insider" / digest).read_bytes()
    assert hashlib.sha256(got).hexdigest() == digest


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_the_secret_is_nowhere_in_the_store_or_the_helper(seeding: dict[str, Any], tmp_path: Path) -> None:
    from bootseer_cli.p2p import fetch
    from bootseer_cli.p2p.secret import blob_salt, read_secret_file, swarm_torrent

    store, digest = seeding["store"], seeding["digest"]
    raw = Path(seeding["secret_file"]).read_bytes()
    secret = read_secret_file(seeding["secret_file"])
    joined = swarm_torrent(store.get_blob_bytes(seeding["tdigest"]), digest, secret)
    import libtorrent as lt

    info_hash = bytes.fromhex(str(lt.torrent_info(lt.bdecode(joined)).info_hash()))
    held = _all_bytes(tmp_path / "store")
    for needle in (raw, secret, secret.hex().encode(), blob_salt(secret, digest), info_hash, info_hash.hex().encode()):
        assert needle not in held, "the store names the swarm's secret or its info-hash"
    assert fetch._node is not None
    pid = fetch._node.swarm.pid
    argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    for needle in (raw, secret.hex().encode(), str(seeding["secret_file"]).encode()):
        assert needle not in argv and needle not in environ


def test_no_secret_no_swarm(tmp_path: Path) -> None:
    """Without a secret file or a signing key there is nothing to derive a secret from: the store serves."""
    from bootseer_cli.delivery import fetch_blob

    store = Store((tmp_path / "store").as_uri())
    src = random_file(tmp_path / "blob.bin", MiB, seed=6)
    digest, _ = publish_file(store, src)
    got = fetch_blob(
        P2PSettings(enabled=True, port=port_range()), store, digest, cache=BlobCache(tmp_path / "c", 1 << 30)
    )
    assert got.source == "store" and "no swarm secret" in got.note
    assert store.read_lease(f"p2p-{digest}") is None  # no node became an origin


def test_the_secret_derives_from_the_domains_signing_key(tmp_path: Path) -> None:
    """Every holder of the domain's key derives one secret; another domain or key, another secret."""
    from bootseer_cli.p2p.secret import swarm_secret
    from bootseer_cli.trust import Trust, keygen, load_signer

    for name in ("a", "b"):
        keygen(str(tmp_path / f"{name}.key"), str(tmp_path / f"{name}.pub"), "team")
    p2p = P2PSettings(enabled=True)

    def secret(key: str, domain: str) -> bytes | None:
        store = Store((tmp_path / "store").as_uri()).use_trust(Trust(domain, signer=load_signer(str(tmp_path / key))))
        return swarm_secret(p2p, store)

    one = secret("a.key", "team")
    assert one is not None and len(one) == 32
    assert secret("a.key", "team") == one
    assert secret("a.key", "other") != one
    assert secret("b.key", "team") != one
    assert one not in (tmp_path / "a.key").read_bytes()


@pytest.mark.parametrize("kind", ["world-readable", "link", "fifo", "short"])
def test_a_bad_secret_file_is_refused(tmp_path: Path, kind: str) -> None:
    from bootseer_cli.p2p.secret import read_secret_file

    path = tmp_path / "secret"
    real = swarm_secret_file(tmp_path / "real")
    if kind == "world-readable":
        path.write_bytes(os.urandom(32))
        path.chmod(0o644)
    elif kind == "link":
        path.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.write_bytes(b"short")
        path.chmod(0o600)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"\[p2p\] key_file") as e:
        read_secret_file(path)
    assert time.monotonic() - t0 < 5  # a FIFO is not waited on
    assert real.read_bytes() not in str(e.value).encode()
