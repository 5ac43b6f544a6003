"""The small pieces of the swarm path: piece sizes, torrents, config parsing, discovery entries, fallbacks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.config import load
from bootseer_cli.delivery import after_publish, fetch_blob
from bootseer_cli.errors import ConfigError
from bootseer_cli.p2p.discovery import Announcer, local_host, parse_endpoint, swarm_peers
from bootseer_cli.p2p.swarm import make_torrent, parse_ports, piece_size_for
from bootseer_cli.settings import P2PSettings, Settings
from bootseer_cli.store.core import Store
from tests.p2p.nodes import random_file, swarm_secret_file

MiB = 1 << 20


def _p2p(**p2p: object) -> P2PSettings:
    return Settings.from_config(load(None, {("p2p", k): v for k, v in p2p.items()}, environ={})).p2p


def test_piece_size_grows_with_the_blob() -> None:
    assert piece_size_for(1) == MiB
    assert piece_size_for(256 * MiB) == MiB
    assert piece_size_for(256 * MiB + 1) == 2 * MiB
    assert piece_size_for(1024 * MiB) == 2 * MiB
    assert piece_size_for(5 << 30) == 4 * MiB


def test_torrent_is_deterministic_and_named_by_digest(tmp_path: Path) -> None:
    import hashlib

    import libtorrent as lt

    src = random_file(tmp_path / "x", 3 * MiB + 17, seed=3)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    a, b = make_torrent(src, digest), make_torrent(src, digest)
    assert a == b
    ti = lt.torrent_info(lt.bdecode(a))
    assert ti.name() == digest
    assert ti.num_pieces() == 4 and ti.piece_length() == MiB
    assert ti.hash_for_piece(3) == hashlib.sha1(src.read_bytes()[3 * MiB :]).digest()
    assert b"announce" not in a  # no tracker: nothing is announced outside the job


@pytest.mark.parametrize("spec", ["x", "10-5", "70000", "1-2-3"])
def test_bad_port_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"\[p2p\] port"):
        parse_ports(spec)


def test_port_range_and_single_port() -> None:
    assert parse_ports("6881-6891") == (6881, 6891)
    assert parse_ports(7000) == (7000, 7000)


@pytest.mark.parametrize("text", ["nohost", "h:port", ":80", "h:0", "h:70000"])
def test_bad_static_peer_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="host:port"):
        parse_endpoint(text)


def test_static_peer_forms() -> None:
    assert parse_endpoint("10.0.0.2:6881").host == "10.0.0.2"
    assert parse_endpoint("[fd00::1]:6881").host == "fd00::1"


def test_after_publish_makes_and_reuses_the_torrent(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    src = random_file(tmp_path / "b", 2 * MiB, seed=5)
    digest = store.put_blob_file(src)
    assert after_publish(_p2p(enabled=False), store, digest, src) == {}
    extra = after_publish(_p2p(enabled=True), store, digest, src)
    tdigest = extra["torrent"]
    assert store.read_ref("torrent", digest)["torrent"] == tdigest
    assert store.get_blob_bytes(tdigest) == make_torrent(src, digest)
    assert after_publish(_p2p(enabled=True), store, digest, src) == {"torrent": tdigest}


@pytest.mark.integration
def test_a_blob_without_torrent_gets_one_from_its_first_fetcher(tmp_path: Path) -> None:
    from bootseer_cli.p2p.fetch import shutdown
    from bootseer_cli.store.cache import BlobCache

    store = Store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(b"a blob published without its torrent" * 1000)
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    try:
        p2p = _p2p(enabled=True, host="127.0.0.1", port="23000-23040", key_file=str(swarm_secret_file(tmp_path)))
        got = fetch_blob(p2p, store, digest, cache=cache)
    finally:
        assert shutdown(0.0)[0]["blobs"][0]["digest"] == digest
    assert got.source == "store" and got.bytes_from_store >= 36000
    assert "published one" in got.note
    assert store.read_ref("torrent", digest)["torrent"]
    assert store.list(f"swarm/{digest}") == []
    again = fetch_blob(_p2p(enabled=True), store, digest, cache=cache)
    assert again.source == "cache" and again.bytes_from_store == 0


def test_swarm_entries_stale_or_torn_are_ignored(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    d = "ab" * 32
    me = Announcer(store, d, "127.0.0.1", 7001)
    me.write("downloading")
    Announcer(store, d, "127.0.0.2", 7002).write("seed")
    store.put_bytes(f"swarm/{d}/torn.json", b"{not json")
    old = {"host": "127.0.0.3", "port": 7003, "state": "seed", "updated": time.time() - 3600}
    store.put_bytes(f"swarm/{d}/old.json", json.dumps(old).encode())
    peers = swarm_peers(store, d, exclude=me.name)
    assert [(p.host, p.port, p.state) for p in peers] == [("127.0.0.2", 7002, "seed")]
    me.remove()
    assert len(swarm_peers(store, d)) == 1


def test_local_host_prefers_config_then_the_route_to_the_store() -> None:
    class S:
        uri = "s3://b/p?endpoint_override=127.0.0.5:9000&scheme=http"

    assert local_host(_p2p(host="10.9.8.7"), S()) == "10.9.8.7"
    assert local_host(_p2p(), S()) == "127.0.0.1"  # the kernel's source address towards 127.0.0.5


def _bootseer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_status_without_a_run_is_a_clear_error() -> None:
    r = _bootseer("p2p", "status")
    assert r.returncode == 1
    assert r.stderr.startswith("bootseer: error: no P2P status") and "Traceback" not in r.stderr


def test_fetch_rejects_a_malformed_digest(tmp_path: Path) -> None:
    r = _bootseer("p2p", "fetch", "../../etc/passwd", "--store", (tmp_path / "s").as_uri())
    assert r.returncode != 0 and "not a sha256 digest" in r.stderr and "Traceback" not in r.stderr


def test_bad_port_in_config_falls_back_to_the_store(tmp_path: Path) -> None:
    """A broken [p2p] setting never stops a fetch: the store serves it, with the reason in the note."""
    from bootseer_cli.store.cache import BlobCache

    store = Store((tmp_path / "store").as_uri())
    src = random_file(tmp_path / "b", MiB, seed=9)
    digest = store.put_blob_file(src)
    after_publish(_p2p(enabled=True), store, digest, src)
    # The config refuses such a port at load (tests/foundation/test_config.py); the library still degrades.
    broken = P2PSettings(enabled=True, port="nope", key_file=swarm_secret_file(tmp_path))
    got = fetch_blob(broken, store, digest, cache=BlobCache(tmp_path / "c", 1 << 30))
    assert got.source == "store" and got.bytes_from_store == MiB
    assert "port" in got.note


def test_a_torrent_for_another_blob_is_refused(tmp_path: Path) -> None:
    """The torrent comes from the store: one that names another file is not used (the store serves)."""
    from bootseer_cli.store.cache import BlobCache

    store = Store((tmp_path / "store").as_uri())
    a = random_file(tmp_path / "a", MiB, seed=21)
    b = random_file(tmp_path / "b", MiB, seed=22)
    da, db = store.put_blob_file(a), store.put_blob_file(b)
    ta = after_publish(_p2p(enabled=True), store, da, a)["torrent"]
    store.write_ref("torrent", db, {"torrent": ta})
    p2p = _p2p(enabled=True, key_file=str(swarm_secret_file(tmp_path)))
    got = fetch_blob(p2p, store, db, cache=BlobCache(tmp_path / "c", 1 << 30))
    assert got.source == "store" and "does not describe this blob" in got.note
    assert got.path.read_bytes() == b.read_bytes()


def test_handoff_without_the_swarm_loads_no_libtorrent() -> None:
    """`exec` calls handoff on every run with stages: with no swarm fetch it must not import libtorrent."""
    code = (
        "import sys\n"
        "from bootseer_cli.delivery import handoff\n"
        "assert handoff() == []\n"
        "assert 'libtorrent' not in sys.modules and 'bootseer_cli.p2p.fetch' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_no_swarm_is_a_store_error() -> None:
    """A source that could not deliver: in the BootseerError tree, caught by fetch_blob before the rest."""
    from bootseer_cli.errors import BootseerError, StoreError
    from bootseer_cli.p2p.fetch import NoSwarm

    assert issubclass(NoSwarm, StoreError) and issubclass(NoSwarm, BootseerError)


def test_doctor_says_when_the_swarm_has_no_secret(tmp_path: Path) -> None:
    """[p2p] enabled without key_file or signing_key: the swarm would be off; doctor says how to fix it."""
    from bootseer_cli.p2p.upkeep import doctor

    def checks(**p2p: object) -> dict[str, object]:
        settings = Settings.from_config(load(None, {("p2p", k): v for k, v in p2p.items()}, environ={}))
        return {c.name: c for c in doctor(settings)}

    none = checks(enabled=True)["p2p secret"]
    assert none.status == "fail" and "key_file" in none.fix  # type: ignore[attr-defined]
    good = checks(enabled=True, key_file=str(swarm_secret_file(tmp_path)))["p2p secret"]
    assert good.status == "ok", good
    loose = tmp_path / "loose.secret"
    loose.write_bytes(b"s" * 32)
    loose.chmod(0o644)
    bad = checks(enabled=True, key_file=str(loose))["p2p secret"]
    assert bad.status == "fail" and "readable by others" in bad.detail  # type: ignore[attr-defined]
    assert "sss" not in bad.detail  # type: ignore[attr-defined]
    assert "p2p secret" not in checks(enabled=False)
