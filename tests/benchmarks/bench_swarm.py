"""The swarm side by side: another checkout (e.g. 81c1020, libtorrent in the root process, plaintext)
against this one (an unprivileged helper, secret info-hashes, forced encryption), in one lab.

The lab is bench_p2p's: every node a real `bootseer p2p fetch` process in its own network namespace,
the store a real `rclone serve s3` in another, each namespace's egress capped with tbf, the store's
lower than the nodes'. Rounds alternate the order of the two checkouts (A B, B A, …) so that a
drift in the machine's load hits both alike. Per run: the bytes the store's interface sent (in
copies of the blob) and the time until the last node holds a verified copy.

    python tests/benchmarks/bench_swarm.py --base /path/to/81c1020-checkout [--size-mb 256] [--nodes 4]
        [--rounds 3] [--store-mbit 400] [--node-mbit 800]

Needs root (ip netns, tc) and rclone. Node caches on /dev/shm; everything is removed however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tests.benchmarks.bench_p2p import tx_bytes  # noqa: E402
from tests.p2p.nodes import random_file, swarm_secret_file  # noqa: E402
from tests.support.netns import Lab, available  # noqa: E402
from tests.support.s3server import S3_ENV, S3Server  # noqa: E402

PREFIX = "bsp2p"
PORT = 9000


def node_env(src: Path, base: Path, name: str, host_ip: str, store_uri: str, secret: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "PIP_"))}
    env.update(S3_ENV)
    env.update(
        XDG_CACHE_HOME=str(base / name),
        BOOTSEER_STORE=store_uri,
        BOOTSEER_NODE=name,
        BOOTSEER_P2P_ENABLED="1",
        BOOTSEER_P2P_HOST=host_ip,
        BOOTSEER_P2P_PORT="6881-6891",
        BOOTSEER_P2P_DEADLINE_S="30",
        PYTHONPATH=str(src / "src"),
    )
    if (src / "src" / "bootseer_cli" / "p2p" / "secret.py").exists():  # a checkout with secret swarms
        env["BOOTSEER_P2P_KEY_FILE"] = str(secret)
    return env


def run(src: Path, hosts, store_host, store_uri: str, base: Path, digest: str, n: int, secret: Path) -> dict:  # type: ignore[no-untyped-def]
    shutil.rmtree(base / "nodes", ignore_errors=True)
    (base / "nodes").mkdir()
    before = tx_bytes(store_host)
    t0 = time.time()
    procs = []
    for i, host in enumerate(hosts[:n]):
        env = node_env(src, base / "nodes", f"n{i}", host.ip, store_uri, secret)
        argv = [sys.executable, "-m", "bootseer_cli", "p2p", "fetch", digest, "--json"]
        procs.append(host.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"node failed ({p.returncode}): {err[-1500:]}")
        docs.append(json.loads(lines[-1]))
    if os.environ.get("BENCH_VERBOSE"):
        for d in sorted(docs, key=lambda d: d["done_at"]):
            print(
                f"   {d['source']:<5} start+{d['done_at'] - d['seconds'] - t0:5.1f} s, fetch {d['seconds']:5.1f} s, "
                f"store {d['bytes_from_store'] / 1e6:7.1f} MB, peers {d['bytes_from_peers'] / 1e6:7.1f} MB {d['note']}"
            )
    peers = sum(1 for d in docs if d["source"] == "peers")
    return {"last_s": max(d["done_at"] for d in docs) - t0, "served": tx_bytes(store_host) - before, "peers": peers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its src/ is used)")
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store-mbit", type=float, default=400)
    ap.add_argument("--node-mbit", type=float, default=800)
    args = ap.parse_args()
    if os.geteuid() != 0 or not available():
        print("bench_swarm needs root with ip netns and tc", file=sys.stderr)
        return 2
    size = args.size_mb << 20
    base = Path(tempfile.mkdtemp(prefix="bench-swarm-", dir="/dev/shm"))
    variants = {"base": args.base.resolve(), "this": REPO}
    server = None
    lab = Lab(PREFIX)
    try:
        store_host = lab.add_host(rate_mbit=args.store_mbit)
        hosts = [lab.add_host(rate_mbit=args.node_mbit) for _ in range(args.nodes)]
        lab.attach_root()
        server = S3Server(base / "s3", host=store_host.ip, port=PORT, netns=store_host.name).start()
        store_uri = server.uri("store")
        os.environ.update(S3_ENV)
        from bootseer_cli.p2p.publish import publish_file
        from bootseer_cli.store import Store

        blob = random_file(base / "blob.bin", size, seed=1)
        digest, _ = publish_file(Store(store_uri), blob)  # the stored torrent is the same for both
        blob.unlink()
        secret = swarm_secret_file(base)
        print(f"load before: {os.getloadavg()}", flush=True)
        results: dict[str, list[dict]] = {k: [] for k in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                res = run(variants[name], hosts, store_host, store_uri, base, digest, args.nodes, secret)
                results[name].append(res)
                print(
                    f"round {r + 1} {name:<4}: last done {res['last_s']:6.2f} s, store sent "
                    f"{res['served'] / size:.3f} copies, {res['peers']}/{args.nodes} nodes from peers, "
                    f"load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        print()
        print(
            f"blob {args.size_mb} MiB, {args.nodes} nodes; store egress {args.store_mbit:g} Mbit/s, "
            f"node egress {args.node_mbit:g} Mbit/s (tbf); load after: {os.getloadavg()}"
        )
        med = {k: statistics.median(x["last_s"] for x in v) for k, v in results.items()}
        for k, v in results.items():
            copies = max(x["served"] for x in v) / size
            print(f"{k:<4} ({variants[k]}): median last done {med[k]:.2f} s, most store copies {copies:.3f}")
        print(f"this / base: {med['this'] / med['base']:.3f}")
        return 0
    finally:
        if server is not None:
            server.stop()
        lab.destroy()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
