"""Issue 26 case 8: libtorrent runs in an unprivileged helper, and what it hands back is checked.

The process that owns the swarm's listening socket is found from /proc (not from our own objects),
so the test means the same before and after: before, it was the root process itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.p2p.publish import publish_file
from bootseer_cli.settings import P2PSettings
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store
from tests.p2p.nodes import port_range, random_file, swarm_secret_file
from tests.support.slowdown import scaled

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1 << 20


def _listener_pids(port: int) -> set[int]:
    """Pids holding a TCP socket that listens on `port` (from /proc/net/tcp and /proc/*/fd)."""
    inodes = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor)
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    pids.add(int(pid))
    return pids


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


@contextlib.contextmanager
def _seeding(tmp_path: Path, with_torrent: bool) -> Iterator[dict[str, Any]]:
    """A node (this process, as bootseer runs it) that fetched a blob as the origin and seeds it: fed
    from the store into the swarm (a published torrent), or from its cache copy (a blob published
    without one, like a checkpoint stripe: the first fetcher makes the torrent and seeds the cache file)."""
    from bootseer_cli.p2p import fetch

    store = Store((tmp_path / "store").as_uri())
    src = random_file(tmp_path / "blob.bin", 2 * MiB, seed=7)
    digest = publish_file(store, src)[0] if with_torrent else store.put_blob_file(src)
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    p2p = P2PSettings(enabled=True, host="127.0.0.1", port=port_range(), key_file=swarm_secret_file(tmp_path))
    try:
        got = fetch.fetch_from_swarm(p2p, store, digest, cache)
        node = fetch.get_node(p2p, store)
        yield {"port": node.swarm.port, "path": got.path, "digest": digest}
    finally:
        fetch.shutdown(0)


@pytest.fixture(params=["torrent", "no-torrent"])
def seeding(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "store-credential-xyz")  # what the helper must not inherit
    with _seeding(tmp_path, request.param == "torrent") as node:
        yield node


@pytest.fixture
def seeding_cache_blob(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with _seeding(tmp_path, with_torrent=False) as node:
        yield node


def test_the_libtorrent_session_is_not_in_this_process_nor_root(seeding: dict[str, Any]) -> None:
    """Before: the session lived in bootseer's own process, which is root in a prolog."""
    pids = _listener_pids(seeding["port"])
    assert pids and os.getpid() not in pids, "the swarm listens from bootseer's own process"
    for pid in pids:
        st = _status(pid)
        if os.geteuid() == 0:
            assert all(int(x) != 0 for x in st["Uid"].split()), st["Uid"]
            assert all(int(x) != 0 for x in st["Gid"].split()), st["Gid"]
            assert st["Groups"] == "", st["Groups"]
        assert st["NoNewPrivs"] == "1"
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"store-credential-xyz" not in environ and b"BOOTSEER_" not in environ


def test_the_helper_seeds_from_a_read_only_descriptor(seeding_cache_blob: dict[str, Any]) -> None:
    """The verified cache blob reaches the helper as an O_RDONLY descriptor, never a writable one."""
    seeding = seeding_cache_blob
    (pid,) = _listener_pids(seeding["port"])
    cached = os.path.realpath(seeding["path"])
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target == cached:
            flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
            held.append(flags & os.O_ACCMODE)
    assert held and all(mode == os.O_RDONLY for mode in held), held
    st = os.stat(seeding["path"])
    assert st.st_uid == os.geteuid()  # the cache's copy is ours, not the helper's


@pytest.fixture
def helper(tmp_path: Path) -> Iterator[Any]:
    from bootseer_cli.p2p.remote import RemoteSwarm

    swarm = RemoteSwarm("127.0.0.1", port_range(), "127.0.0.1", tmp_path / "cache" / ".p2p", "nobody")
    try:
        yield swarm
    finally:
        swarm.close()


def _download(helper: Any, tmp_path: Path, size: int = 3 * MiB + 12345) -> tuple[Any, str, bytes]:
    """A torrent added for download (no peer: nothing arrives), and the blob's real bytes (its last
    piece a short one)."""
    from bootseer_cli.p2p.swarm import make_torrent

    src = random_file(tmp_path / "real.bin", size, seed=8)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    handle = helper.add(make_torrent(src, digest), digest)
    return handle, digest, src.read_bytes()


def _helper_file(helper: Any, handle: Any) -> Path:
    return helper.work / handle.dir / handle.digest


def test_a_download_is_used_only_as_our_own_verified_copy(helper: Any, tmp_path: Path) -> None:
    """What the helper wrote is copied, hashed as copied; a wrong blob never reaches the cache, and the
    cache's copy does not change when the helper rewrites its file afterwards."""
    from bootseer_cli.p2p.copyout import PrefixCopier

    cache = BlobCache(tmp_path / "cache", 1 << 30)
    handle, digest, real = _download(helper, tmp_path)
    dl = _helper_file(helper, handle)
    if os.geteuid() == 0:
        assert dl.parent.stat().st_uid != 0  # the helper's own directory
    dl.write_bytes(real[:-1] + bytes([real[-1] ^ 1]))  # what a hostile helper would hand over
    bad = PrefixCopier(helper, handle, cache, digest)
    bad.start()
    assert bad.finish() != digest and bad.redo() != digest
    bad.discard()
    assert cache.get(digest) is None and not list((tmp_path / "cache").glob("sha256/*/.*"))
    dl.write_bytes(real)
    good = PrefixCopier(helper, handle, cache, digest)
    good.start()
    assert good.finish() == digest
    path = good.adopt()
    assert os.stat(path).st_ino != os.stat(dl).st_ino and os.stat(path).st_uid == os.geteuid()
    dl.write_bytes(b"\0" * len(real))  # the helper can still write its file: not ours
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_the_copier_follows_the_piece_map_the_fetch_loop_offers(helper: Any, tmp_path: Path) -> None:
    """The fetch loop's status request feeds the copier (no second request per round): here the
    helper has no piece (no peer), so only the offered map can move the copy along."""
    import time

    from bootseer_cli.p2p.copyout import PrefixCopier

    cache = BlobCache(tmp_path / "cache", 1 << 30)
    handle, digest, real = _download(helper, tmp_path)
    # the file goes in once libtorrent has checked what it had (nothing): a check that ran after the
    # write (it did, under load) found every piece, and the copy no longer depended on the offered map
    checked_by = time.monotonic() + scaled(30)
    while handle.status().checking and time.monotonic() < checked_by:
        time.sleep(0.02)
    assert not handle.status().checking, "the helper was still checking its files"
    _helper_file(helper, handle).write_bytes(real)
    copier = PrefixCopier(helper, handle, cache, digest)
    n = handle.torrent_file().num_pieces()
    copier.offer([True] * (n - 1) + [False])
    copier.start()
    deadline = time.monotonic() + scaled(10)
    while copier.next < n - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert copier.next == n - 1 and not handle.status(pieces=True).pieces[0]
    assert copier.finish() == digest
    copier.discard()


@pytest.mark.parametrize("swap", ["link", "fifo"])
def test_a_download_swapped_for_a_link_or_fifo_is_refused(helper: Any, tmp_path: Path, swap: str) -> None:
    """The helper owns its directory and could put a link to a root-only file where its download was."""
    from bootseer_cli.p2p.copyout import PrefixCopier

    cache = BlobCache(tmp_path / "cache", 1 << 30)
    handle, digest, _ = _download(helper, tmp_path)
    dl = _helper_file(helper, handle)
    dl.unlink(missing_ok=True)
    secret = tmp_path / "root-only"
    secret.write_bytes(b"root's secret")
    secret.chmod(0o600)
    if swap == "link":
        dl.symlink_to(secret)
    else:
        os.mkfifo(dl)
    copier = PrefixCopier(helper, handle, cache, digest)
    copier.start()
    with pytest.raises(OSError):
        copier.finish()
    copier.discard()
    assert cache.get(digest) is None


def test_a_dead_helper_is_an_oserror_not_a_hang(helper: Any) -> None:
    """The fetch treats it as any swarm failure (delivery falls back to the store)."""
    from bootseer_cli.p2p.remote import HelperGone

    os.kill(helper.pid, 9)
    helper.proc.wait(10)
    with pytest.raises(HelperGone):
        helper.counters()


def test_wire_refuses_oversized_frames() -> None:
    from bootseer_cli.p2p.wire import HEAD, MAX_PAYLOAD, Channel, WireError

    a, b = socket.socketpair()
    try:
        a.sendall(HEAD.pack(2, MAX_PAYLOAD + 1) + b"{}")
        with pytest.raises(WireError, match="over the limit"):
            Channel(b).recv()
        a.sendall(struct.pack(">II", 3, 0) + b"[1]")
        with pytest.raises(WireError):
            Channel(b).recv()
    finally:
        a.close()
        b.close()


def test_the_helper_work_dir_is_private(helper: Any) -> None:
    st = os.stat(helper.work)
    assert stat.S_IMODE(st.st_mode) == 0o700
    if os.geteuid() == 0:
        assert st.st_uid != 0


def test_a_helper_that_stops_answering_is_given_up_within_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every wait has a deadline of our own: a stopped (or hostile) helper ends the swarm, not the fetch."""
    import signal
    import time

    from bootseer_cli.p2p import remote

    monkeypatch.setattr(remote, "CALL_S", 2.0)
    swarm = remote.RemoteSwarm("127.0.0.1", port_range(), "127.0.0.1", tmp_path / "cache" / ".p2p", "nobody")
    try:
        assert swarm.port > 0
        os.kill(swarm.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(remote.HelperGone, match="stopped answering"):
            swarm.counters()
        assert time.monotonic() - t0 < 2.0 + 3.0
        os.kill(swarm.pid, signal.SIGCONT)
        with pytest.raises(remote.HelperGone):  # out of step now: never trusted again
            swarm.counters()
    finally:
        os.kill(swarm.pid, signal.SIGCONT)
        swarm.close()


def test_wire_big_payloads_keep_the_frames_and_descriptors_that_follow() -> None:
    """A piece is read straight into its own buffer: exactly its bytes, the next frame (and the
    descriptor that travels with its first byte) still queued after it."""
    from bootseer_cli.p2p.wire import BIG_PAYLOAD, Channel

    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        sender, receiver = Channel(a), Channel(b)
        big = os.urandom(3 * BIG_PAYLOAD + 7)

        def send() -> None:  # from another thread: the frames are bigger than the socket's buffer
            sender.send({"op": "piece", "i": 1}, big)
            sender.send({"op": "add", "fds": 1}, b"small", (r,))
            sender.send({"op": "piece", "i": 2}, big[::-1])

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        assert receiver.recv() == ({"op": "piece", "i": 1}, big, [])
        header, payload, fds = receiver.recv()
        assert (header["op"], payload, len(fds)) == ("add", b"small", 1)
        os.write(w, b"x")
        assert os.read(fds[0], 1) == b"x"  # the descriptor sent, not another
        os.close(fds[0])
        assert receiver.recv() == ({"op": "piece", "i": 2}, big[::-1], [])
        thread.join(10)
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()
