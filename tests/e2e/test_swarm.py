"""A peer of the job's swarm killed mid-transfer of the env snapshot (P2P delivery)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from bootseer_cli.trust import default_domain
from tests.e2e.harness import DEPS_COMMAND, env_kind, wait_for
from tests.p2p.nodes import swarm_secret_file

pytestmark = pytest.mark.integration


# The setup also fetches a 12 MB data file (random, so it does not compress): a snapshot of a dozen
# 1 MiB pieces, which the origin feeds into the swarm at a capped rate, so a transfer lasts seconds.
MAKE_DATA = """import os, sys
path = os.path.join(sys.prefix, "share", "e2e-data.bin")
os.makedirs(os.path.dirname(path), exist_ok=True)
open(path, "wb").write(os.urandom(12 << 20))
"""


def with_data_setup(node) -> None:
    (node.work / "make_data.py").write_text(MAKE_DATA)
    toml = node.work / "bootseer.toml"
    toml.write_text(
        toml.read_text().replace(
            'setup = ["python -m pip install -r requirements.txt"]',
            'setup = ["python -m pip install -r requirements.txt", "python make_data.py"]',
        )
    )


def test_peer_killed_mid_transfer(cluster, tmp_path):
    """Two nodes restore one snapshot through the swarm; the origin (the peer reading the store for
    the swarm) is killed mid-transfer. The other finishes (missing pieces from the store); the killed
    node restarts into a whole env."""
    store_dir = tmp_path / "store"
    p2p = {
        "BOOTSEER_P2P_ENABLED": "1",
        "BOOTSEER_P2P_SEED_S": "0",
        "BOOTSEER_EXEC_SKIP": "image,checkpoint",
        "BOOTSEER_P2P_KEY_FILE": str(swarm_secret_file(tmp_path)),  # the job's swarm secret (0600)
    }
    builder = cluster.node("n1", store_dir.as_uri(), **p2p)
    with_data_setup(builder)
    built = builder.start(command=DEPS_COMMAND).wait()
    assert built.rc == 0 and env_kind(built) == "built", built.output[-4000:]
    domain = store_dir / default_domain()  # refs, swarm entries and leases live in the user's trust domain
    assert list((domain / "refs" / "torrent").glob("*.json")), "no torrent was published with the snapshot"
    digest = json.loads(next((domain / "refs" / "env").glob("*.json")).read_text())["blob"]

    # The origin feeds the swarm at 8 Mbit/s: the ~12 MB snapshot takes seconds to go round.
    slow = {**p2p, "BOOTSEER_P2P_ORIGIN_MBPS": "8", "BOOTSEER_P2P_DEADLINE_S": "3"}
    peers = [cluster.node(n, store_dir.as_uri(), **slow) for n in ("n2", "n3")]
    for p in peers:
        with_data_setup(p)
    # Both start at once, so their swarm helpers listen on the default ports at the same moment: a port
    # taken between one's bind and listen is skipped (swarm.py), or that peer would never join. A wait
    # that times out shows both peers' stages (the env stage's reason says why it did not use the swarm).
    started = [p.start(command=DEPS_COMMAND) for p in peers]
    swarm = domain / "swarm" / digest
    wait_for(lambda: len(list(swarm.glob("*.json"))) >= 2, 180, "both nodes to join the swarm", show=started)
    lease = wait_for(lambda: list((domain / "leases").glob("p2p-*")), 30, "the swarm's origin", show=started)
    owner = json.loads(lease[0].read_text())["pid"]
    victim = next(i for i, p in enumerate(peers) if owner in p.processes())
    time.sleep(4.0)  # mid-transfer: the other peer holds part of the pieces (12 MB at 1 MB/s)
    for pid in peers[victim].processes():
        os.kill(pid, signal.SIGKILL)
    survivor = started[1 - victim].wait()
    assert survivor.rc == 0, survivor.output[-4000:]
    env = survivor.stage("env")
    assert env["outcome"] == "restored", env
    # The swarm was in use when its origin died: the survivor got pieces from it, or (on a machine
    # where joining took longer than the kill delay) its fetch note says what the swarm lacked
    # came from the store. Either way the survivor went through the swarm and finished.
    assert env["bytes_from_peers"] > 0 or "read from the store" in env.get("reason", ""), env
    assert survivor.versions()["tabulate"] == "0.10.0"
    assert peers[1 - victim].pip_freeze() == builder.pip_freeze()

    # The killed node left no half env: its next start restores the whole one.
    started[victim].proc.wait(30)
    again = peers[victim].start(command=DEPS_COMMAND).wait()
    assert again.rc == 0, again.output[-4000:]
    assert env_kind(again) == "restored"
    assert peers[victim].pip_freeze() == builder.pip_freeze()
