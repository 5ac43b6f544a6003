"""The swarm path of fetch_blob with real libtorrent sessions: one process per node, each with its own
node cache, over loopback; the store on file:// and on the loopback S3 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.p2p.publish import publish_file
from bootseer_cli.store.core import Store
from tests.p2p.nodes import REPO, STARTED, node_env, port_range, random_file, sha256, start_node, swarm_secret_file
from tests.support.s3server import S3Server
from tests.support.silentendpoint import StallingProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MiB = 1 << 20


def _publish(tmp_path: Path, store_uri: str, size: int) -> tuple[Store, str, Path]:
    src = random_file(tmp_path / "blob.bin", size, seed=size)
    store = Store(store_uri)
    digest, tdigest = publish_file(store, src)
    assert tdigest and store.read_ref("torrent", digest) == {"torrent": tdigest, "size": size}
    return store, digest, src


def _summary(docs: list[dict]) -> str:
    return "\n".join(
        f"{d['source']} store={d['bytes_from_store']} peers={d['bytes_from_peers']} {d['seconds']}s "
        f"note={d['note']!r} err={d['stderr'][-300:]!r}"
        for d in docs
    )


def _check_copy(doc: dict, digest: str) -> None:
    assert sha256(Path(doc["path"])) == digest, f"{doc['path']} is not the blob"


def test_swarm_store_serves_about_one_copy(tmp_path: Path, store_uri: str) -> None:
    size = 24 * MiB
    store, digest, _ = _publish(tmp_path, store_uri, size)
    ports = port_range()
    nodes = [start_node(node_env(tmp_path, f"n{i}", store_uri, ports, deadline_s=3), digest) for i in range(4)]
    docs = [n.result() for n in nodes]
    for doc in docs:
        _check_copy(doc, digest)
    from_store = sum(d["bytes_from_store"] for d in docs)
    from_peers = sum(d["bytes_from_peers"] for d in docs)
    # One origin read the blob (plus small torrents); three nodes got it from the swarm.
    assert from_store < 1.5 * size, _summary(docs)
    assert from_peers >= 2.5 * size, _summary(docs)
    assert sum(1 for d in docs if d["source"] == "peers") >= 3, _summary(docs)
    # Every node left the swarm's directory in the store when it was done.
    assert store.list(f"swarm/{digest}") == []
    # No half-written leftovers in the node caches.
    for i in range(4):
        leftovers = [p for p in (tmp_path / f"n{i}").rglob("*") if p.is_file() and ".p2p" in p.parts]
        assert leftovers == []


def _start_swarm(tmp_path: Path, store: Store, store_uri: str, digest: str, n: int, **env: object) -> tuple:
    """n nodes at once; returns (origin, the others) once the origin is known from the blob's lease."""
    ports = port_range()
    nodes = [start_node(node_env(tmp_path, f"n{i}", store_uri, ports, **env), digest) for i in range(n)]
    deadline = time.time() + 60
    while time.time() < deadline:
        lease = store.read_lease(f"p2p-{digest}")
        if lease and any(x.proc.pid == lease.get("pid") for x in nodes):
            origin = next(x for x in nodes if x.proc.pid == lease["pid"])
            return origin, [x for x in nodes if x is not origin]
        time.sleep(0.1)
    raise AssertionError("no node took the blob's lease")


def test_peer_killed_mid_transfer_others_finish(tmp_path: Path) -> None:
    size = 24 * MiB
    store_uri = (tmp_path / "store").as_uri()
    store, digest, _ = _publish(tmp_path, store_uri, size)
    # The origin reads at 16 Mbit/s, so the transfer lasts ~12 s and there is a "mid" to kill in.
    origin, others = _start_swarm(tmp_path, store, store_uri, digest, 4, origin_mbps=16, deadline_s=4)
    time.sleep(4)
    victim = others[0]
    cache_file = tmp_path / victim.name / "bootseer" / "blobs" / "sha256" / digest[:2] / digest
    assert victim.proc.poll() is None and not cache_file.exists(), "the victim finished before it was killed"
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(10)
    docs = [n.result() for n in [origin, *others[1:]]]
    for doc in docs:
        _check_copy(doc, digest)
    assert docs[0]["bytes_from_store"] >= size, _summary(docs)  # the origin
    assert all(d["bytes_from_peers"] > 0 for d in docs[1:]), _summary(docs)
    assert sum(d["bytes_from_store"] for d in docs) < 1.5 * size, _summary(docs)
    assert not cache_file.exists()


def test_origin_killed_mid_transfer_others_finish_from_each_other_and_store(tmp_path: Path) -> None:
    size = 24 * MiB
    store_uri = (tmp_path / "store").as_uri()
    store, digest, _ = _publish(tmp_path, store_uri, size)
    origin, others = _start_swarm(tmp_path, store, store_uri, digest, 4, origin_mbps=16, deadline_s=2)
    time.sleep(4)
    assert origin.proc.poll() is None, "the origin finished before it was killed"
    os.kill(origin.proc.pid, signal.SIGKILL)
    origin.proc.wait(10)
    t_kill = time.time()
    docs = [n.result() for n in others]
    for doc in docs:
        _check_copy(doc, digest)
    assert all(d["bytes_from_peers"] > 0 for d in docs), _summary(docs)
    assert any("stalled" in d["note"] for d in docs), _summary(docs)
    # The survivors read only what they were missing, in different orders: well under 3 copies.
    assert sum(d["bytes_from_store"] for d in docs) < 2.5 * size, _summary(docs)
    assert max(d["done_at"] for d in docs) - t_kill < 30


def test_corrupt_peer_rejected_and_blob_finished_from_store(tmp_path: Path, store_uri: str) -> None:
    size = 8 * MiB
    _store, digest, _ = _publish(tmp_path, store_uri, size)
    ports = port_range()
    secret = str(swarm_secret_file(tmp_path))
    bad = subprocess.Popen(
        [sys.executable, "-m", "tests.p2p.badpeer", store_uri, digest, str(tmp_path / "bad"), ports, secret],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(bad)
    try:
        assert bad.stdout is not None
        assert bad.stdout.readline().strip() == "ready", bad.stderr.read() if bad.poll() is not None else ""
        node = start_node(node_env(tmp_path, "good", store_uri, ports, deadline_s=3), digest)
        doc = node.result()
    finally:
        bad.kill()
        bad.wait(10)
    _check_copy(doc, digest)
    assert "corrupt" in doc["note"], doc
    assert doc["bytes_from_store"] >= size * 0.5, doc  # what the bad peer sent was thrown away
    assert doc["seconds"] < 30


def test_no_peer_falls_back_to_store_within_deadline(tmp_path: Path, store_uri: str) -> None:
    size = 4 * MiB
    store, digest, _ = _publish(tmp_path, store_uri, size)
    # Another node holds the blob's lease (it would be the origin) but never shows up in the swarm.
    assert store.try_lease(f"p2p-{digest}", 120) is not None
    node = start_node(node_env(tmp_path, "lonely", store_uri, port_range(), deadline_s=2), digest)
    doc = node.result()
    _check_copy(doc, digest)
    assert "no peer within 2 s" in doc["note"], doc
    assert doc["bytes_from_peers"] == 0 and doc["bytes_from_store"] >= size
    assert doc["seconds"] < 2 + 8, doc  # the deadline, then one local read


def test_a_store_that_stops_sending_fails_the_fetch_soon(tmp_path: Path, s3_server: S3Server) -> None:
    """The store answers the torrent's ref and the lease, then sends 64 kB of each response and nothing
    more. The origin's reads waited the S3 client's low-speed timeout (60 s, three attempts), the read
    from the store after it as long again, and the process's exit waited for its abandoned request:
    `bootseer p2p fetch` failed after 401 s. Now each read has `storeguard.STALL_S` (20 s), the store is
    then taken for down, and the exit does not wait for the read it gave up."""
    from bootseer_cli.store.guard import STALL_S

    uri = s3_server.uri(f"t-{os.urandom(6).hex()}")
    _, digest, _ = _publish(tmp_path, uri, 8 * MiB)
    proxy = StallingProxy(("127.0.0.1", s3_server.port))
    proxy.stall()
    try:
        stalled = uri.replace(s3_server.endpoint, f"127.0.0.1:{proxy.port}")
        node = start_node(node_env(tmp_path, "n0", stalled, port_range()), digest)
        _, err = node.proc.communicate(timeout=STALL_S + 60)
        took = time.time() - node.started
    finally:
        proxy.close()
    assert node.proc.returncode == 1, err
    assert took < STALL_S + 10, f"{took:.1f} s: {err}"
    assert "swarm failed (the store sent nothing for 20 s" in err, err
    assert err.strip().splitlines()[-1].startswith("bootseer: error: ") and "Traceback" not in err, err


def _wait_seeding(run_dir: Path, agent: subprocess.Popen[str], timeout: float = 20) -> None:
    """Until the agent's status file says it serves (its seed task started)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        doc = json.loads((run_dir / "p2p.json").read_text()) if (run_dir / "p2p.json").exists() else {}
        if doc.get("state") == "seeding":
            return
        time.sleep(0.2)
    raise AssertionError(f"the agent did not start seeding: {agent.stdout}")


def test_agent_keeps_seeding_after_the_fetch(tmp_path: Path) -> None:
    """The seed task serves a fetched blob from the node cache: a late node gets it with the store gone."""
    size = 6 * MiB
    store_uri = (tmp_path / "store").as_uri()
    store, digest, _ = _publish(tmp_path, store_uri, size)
    ports = port_range()
    env = node_env(tmp_path, "early", store_uri, ports, seed_s=60)
    early = start_node(env, digest).result()
    assert early["source"] == "store"  # alone: it was the origin
    # An agent for a "launcher" that lives a few seconds, with the task exec would hand over.
    from bootseer_cli.p2p.fetch import NoSwarm  # noqa: F401  (the package imports without libtorrent state)

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"job": "j", "node": "early", "rank": 0, "run": "r1"}))
    launcher = subprocess.Popen(["sleep", "12"])
    STARTED.append(launcher)
    tref = store.read_ref("torrent", digest)
    task = {"kind": "seed", "blobs": [{"digest": digest, "torrent": tref["torrent"]}], "fetches": []}
    (run_dir / "agent.json").write_text(
        json.dumps({"store_uri": store_uri, "launcher_pid": launcher.pid, "tasks": [task], "config_file": None})
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "bootseer_cli", "agent", "--run-dir", str(run_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    STARTED.append(agent)
    try:
        _wait_seeding(run_dir, agent)
        # The store loses the blob (its torrent stays): only the agent can serve it now.
        store.delete_blob(digest)
        late = start_node(node_env(tmp_path, "late", store_uri, ports, deadline_s=20), digest).result()
        _check_copy(late, digest)
        assert late["bytes_from_peers"] == size and late["source"] == "peers"
        status = subprocess.run(
            [sys.executable, "-m", "bootseer_cli", "p2p", "status", "--run-dir", str(run_dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert status.returncode == 0, status.stderr
        assert f"seeding {digest[:12]}" in status.stdout
    finally:
        launcher.kill()
        launcher.wait()
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 0, out
    final = json.loads((run_dir / "p2p.json").read_text())
    assert final["state"] == "done"
    assert final["blobs"][0]["uploaded"] >= size, final
    assert store.list(f"swarm/{digest}") == []


def test_ckpt_pull_through_the_swarm_makes_the_stripe_torrents(tmp_path: Path) -> None:
    """`bootseer ckpt pull` on three nodes: the stripes were pushed without torrents (cut on the fly);
    their first fetchers publish them, the others join, and every node gets the same files."""
    store_uri = (tmp_path / "store").as_uri()
    src = tmp_path / "ckpt"
    src.mkdir()
    random_file(src / "model.bin", 10 * MiB, seed=11)
    random_file(src / "optim.bin", 6 * MiB + 5, seed=12)
    env = node_env(tmp_path, "pusher", store_uri, port_range())
    push = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "ckpt", "push", str(src), "--name", "ck", "--tag", "t1", "-k", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert push.returncode == 0, push.stderr
    store = Store(store_uri)
    assert store.list_refs("torrent") == []
    ports = port_range()
    procs = []
    for i in range(3):
        e = node_env(tmp_path, f"n{i}", store_uri, ports, deadline_s=10)
        argv = [sys.executable, "-m", "bootseer_cli", "ckpt", "pull", "ck:t1", str(tmp_path / f"out{i}")]
        procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        STARTED.append(procs[-1])
    for p in procs:
        _out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err
    for i in range(3):
        for name in ("model.bin", "optim.bin"):
            assert sha256(tmp_path / f"out{i}" / name) == sha256(src / name)
    assert len(store.list_refs("torrent")) == 2  # one torrent per stripe, made by its first fetcher


def test_exec_hands_the_swarm_blobs_to_the_agent(tmp_path: Path) -> None:
    """`bootseer exec` pulling a checkpoint through the swarm: the agent seeds the stripes while the
    launcher runs (`bootseer p2p status` shows it), and stops with the launcher."""
    store_uri = (tmp_path / "store").as_uri()
    src = tmp_path / "ckpt"
    src.mkdir()
    random_file(src / "model.bin", 4 * MiB, seed=31)
    env = node_env(tmp_path, "node", store_uri, port_range(), seed_s=120)
    env.update(
        BOOTSEER_CHECKPOINT_NAME="ck",
        BOOTSEER_CHECKPOINT_TAG="t1",
        BOOTSEER_CHECKPOINT_MODE="pull",
        BOOTSEER_CHECKPOINT_MOUNTPOINT=str(tmp_path / "pulled"),
    )
    run = lambda *a, **kw: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "bootseer_cli", *a], env=env, capture_output=True, text=True, timeout=120, **kw
    )
    push = run("ckpt", "push", str(src), "--name", "ck", "--tag", "t1", "-k", "2")
    assert push.returncode == 0, push.stderr
    exe = subprocess.Popen(
        [sys.executable, "-m", "bootseer_cli", "exec", "--", "sleep", "10"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(exe)
    runs = tmp_path / "node" / "bootseer" / "runs"
    deadline = time.time() + 60
    seeding = None
    while time.time() < deadline and seeding is None:
        for status_file in runs.glob("*/p2p.json"):
            doc = json.loads(status_file.read_text())
            if doc.get("state") == "seeding":
                seeding = status_file
        time.sleep(0.3)
    assert seeding is not None, exe.stderr.read() if exe.poll() is not None else "no seeding status"
    status = run("p2p", "status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("\n  seeding ") == 2, status.stdout  # both stripes
    assert "from the store" in status.stdout
    _, err = exe.communicate(timeout=60)
    assert exe.returncode == 0, err
    assert sha256(tmp_path / "pulled" / "model.bin") == sha256(src / "model.bin")
    deadline = time.time() + 60
    while time.time() < deadline and json.loads(seeding.read_text()).get("state") != "done":
        time.sleep(0.3)
    assert json.loads(seeding.read_text())["state"] == "done"  # the agent stopped with the launcher
    assert Store(store_uri).list("swarm", recursive=True) == []
