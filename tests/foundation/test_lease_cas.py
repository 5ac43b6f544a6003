"""Issue 28, item 4: a single-flight lease has exactly one holder, however long a taker stalls.

The lease used to be "check, write, settle 1 s, read back" on object stores: a taker that stalled for
a few seconds between its check and its write overwrote the lease another node had meanwhile taken,
and both held it. The stall is injected in our own code (the check, `Store.lease_live`, sleeps for the
stalled taker after it judged the lease free); the servers are real: the local store, an S3 server that
honours conditional writes (moto's, on loopback), and the suite's rclone S3 server, which ignores
them, so that the store keeps the old protocol there and `doctor` says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.errors import StoreError
from bootseer_cli.store.core import Lease, Store, open_store
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, S3Server, free_port

pytestmark = pytest.mark.integration

STALL_S = 3.0  # longer than the old protocol's settle time (1 s), as in the CI flake (4.5 s)
TTL_S = 60.0


@pytest.fixture(scope="module")
def cas_s3(tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]) -> Iterator[str]:
    """moto's S3 server on loopback (it honours If-None-Match and If-Match on PUT); its endpoint."""
    binary = shutil.which("moto_server")
    if binary is None:
        pytest.skip("moto_server is not on PATH (.ci/run installs it in its own venv: pip install 'moto[server]')")
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115 - lives with the process
    # A bare environment: with the client's AWS_* variables (or this checkout on PYTHONPATH) in its
    # own, moto answers CompleteMultipartUpload with an empty body, which pyarrow takes for an error.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path_factory.getbasetemp()),
        "LANG": "C.UTF-8",
    }
    cmd = [binary, "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        _wait_and_make_bucket(port, proc)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


def _wait_and_make_bucket(port: int, proc: subprocess.Popen[bytes]) -> None:
    import pyarrow.fs as pafs

    deadline = time.time() + 30
    while True:
        try:
            fs = pafs.S3FileSystem(
                access_key=ACCESS_KEY,
                secret_key=SECRET_KEY,
                endpoint_override=f"127.0.0.1:{port}",
                scheme="http",
                region="us-east-1",
                allow_bucket_creation=True,
            )
            fs.create_dir("bootseer")
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise
            time.sleep(0.2)


def _uri(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    prefix = f"t-{os.urandom(6).hex()}"
    if kind == "file":
        return (tmp_path / "store").as_uri()
    if kind == "s3-cas":
        endpoint = request.getfixturevalue("cas_s3")
        return f"s3://bootseer/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    server: S3Server = request.getfixturevalue("s3_server")
    return server.uri(prefix)


def _stalled(store: Store, seconds: float) -> Store:
    """`store`, whose lease check sleeps `seconds` after it found the lease free or stale: a GC pause or
    a slow request between the check and the write."""
    real = store.lease_live

    def lease_live(*args: Any, **kwargs: Any) -> bool:
        live = real(*args, **kwargs)
        if not live:
            time.sleep(seconds)
        return live

    store.lease_live = lease_live  # type: ignore[method-assign]
    return store


def _plant(store: Store, key: str, doc: bytes) -> None:
    """Write a lease document as it is. On moto's server through obstore: pyarrow's multipart upload
    fails there now and then (moto's CompleteMultipartUpload answer is taken for an error); the lease
    itself never goes through pyarrow on a server with conditional writes."""
    cas = store.conditional()
    if cas is None:
        store.put_bytes(store._lease_rel(key), doc)
    else:
        assert cas.create(store._lease_rel(key), doc) is not None


def _contend(uri: str, key: str, stall: float = STALL_S) -> dict[str, Lease | None]:
    """Two takers: "stalled" checks first and stalls; "prompt" comes 0.3 s later and does not."""
    got: dict[str, Lease | None] = {}
    errors: list[BaseException] = []

    def taker(name: str, store: Store, delay: float) -> Callable[[], None]:
        def run() -> None:
            time.sleep(delay)
            try:
                got[name] = store.try_lease(key, TTL_S)
            except BaseException as e:
                errors.append(e)

        return run

    threads = [
        threading.Thread(target=taker("stalled", _stalled(open_store(uri), stall), 0.0)),
        threading.Thread(target=taker("prompt", open_store(uri), 0.3)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return got


@pytest.mark.parametrize("kind", ["file", "s3-cas"])
@pytest.mark.parametrize("before", ["free", "stale"])
def test_a_stalled_taker_never_shares_the_lease(
    kind: str, before: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    uri = _uri(kind, tmp_path, request)
    key = f"env-{os.urandom(4).hex()}"
    store = open_store(uri)
    if before == "stale":  # a holder that died an hour ago
        _plant(store, key, store._lease_doc(key, "dead-node", time.time() - 3600, TTL_S))

    got = _contend(uri, key)

    holders = [name for name, lease in got.items() if lease is not None]
    assert len(holders) == 1, f"{holders} all hold the lease"
    lease = got[holders[0]]
    assert lease is not None and json.loads(store.get_bytes(store._lease_rel(key)) or b"{}")["owner"] == lease.owner
    if before == "stale":  # the taker that did not stall took it over; the stalled one lost
        assert holders == ["prompt"]


def test_renew_and_release_never_touch_a_lease_taken_over(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    uri = _uri("s3-cas", tmp_path, request)
    key = f"p2p-{os.urandom(4).hex()}"
    a, b = open_store(uri), open_store(uri)
    mine = a.try_lease(key, 1.0)
    assert mine is not None and mine.etag and b.try_lease(key, TTL_S) is None
    assert mine.renew(1.0) and not mine.lost
    time.sleep(1.8)  # expired (1 s, + skew of 0.5 s) without a renewal: a stalled holder
    theirs = b.try_lease(key, TTL_S)
    assert theirs is not None
    assert not mine.renew(TTL_S) and mine.lost
    mine.release()
    assert json.loads(b.get_bytes(b._lease_rel(key)) or b"{}")["owner"] == theirs.owner
    theirs.release()
    assert a.try_lease(key, TTL_S) is not None  # a released lease is free


def test_a_server_that_ignores_conditional_writes_keeps_the_old_protocol(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """rclone's `serve s3` (the suite's S3 server) answers 200 to a PUT with If-None-Match: * over an
    existing object: trusting it would make every taker a holder. The probe finds that out; the lease
    is then taken with a claim per taker (Lamport's bakery, `store.leases`), which doctor says."""
    from bootseer_cli.doctor import check_leases
    from bootseer_cli.settings import StoreSettings

    rclone = _uri("s3", tmp_path, request)
    store = open_store(rclone)
    assert store.conditional() is None
    lease = store.try_lease("env-x", TTL_S)
    assert lease is not None and not lease.etag and open_store(rclone).try_lease("env-x", TTL_S) is None

    lines = {kind: check_leases(StoreSettings(uri=_uri(kind, tmp_path, request))) for kind in ("file", "s3-cas", "s3")}
    assert lines["file"].status == "ok" and "compare-and-swap" in lines["file"].detail
    assert lines["s3-cas"].status == "ok" and "If-None-Match" in lines["s3-cas"].detail
    assert lines["s3"].status == "ok" and "bakery" in lines["s3"].detail


def _refused_after(store: Store, first: Callable[[], None]) -> Store:
    """`store`, whose next write runs `first` (another taker writing the same key) and is then refused
    by the server, as rclone's `serve s3` refused one of four takers writing one lease at once
    ("UploadPart … Internal Error", CI of session 14): the refusal is injected, the servers are real."""
    real = store.put_bytes

    def put_bytes(rel: str, data: bytes) -> None:
        store.put_bytes = real  # type: ignore[method-assign]
        first()
        raise StoreError(f"store {store.uri}: cannot write {rel}: AWS Error INTERNAL_FAILURE (injected)")

    store.put_bytes = put_bytes  # type: ignore[method-assign]
    return store


def test_a_taker_whose_write_is_refused_in_a_race_it_lost_gets_no_lease_and_no_error(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The old protocol (a server without conditional writes): a taker's write refused while another
    taker's lease went in is a lost race, not a failed start (it made the swarm fall back to the store
    and read a second copy); a write refused with no lease there is still an error."""
    uri = _uri("s3", tmp_path, request)
    key = f"p2p-{os.urandom(4).hex()}"
    other = open_store(uri)
    won: list[Lease | None] = []
    loser = _refused_after(open_store(uri), lambda: won.append(other.try_lease(key, TTL_S)))
    assert loser.conditional() is None  # premise: the old protocol
    assert loser.try_lease(key, TTL_S) is None
    assert won and won[0] is not None
    assert json.loads(other.get_bytes(other._lease_rel(key)) or b"{}")["owner"] == won[0].owner

    alone = _refused_after(open_store(uri), lambda: None)
    with pytest.raises(StoreError, match="cannot write"):
        alone.try_lease(f"p2p-{os.urandom(4).hex()}", TTL_S)
