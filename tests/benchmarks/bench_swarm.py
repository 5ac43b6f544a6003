"""The swarm of another checkout (e.g. 81c1020: libtorrent in the root process, plaintext) side by side
with this one's (an unprivileged helper, secret info-hashes, forced encryption): `bench_p2p.py
--against`, under the name the earlier figures used. The lab and the runs are bench_p2p's.

    python tests/benchmarks/bench_swarm.py --base /path/to/81c1020-checkout [--size-mb 256] [--rounds 3]
        [--nodes 4 --store-mbit 400 --node-mbit 800 | --configs cpu:4:400:800,net:2:200:200]

With --nodes (or the caps) one configuration is run; by default both of bench_p2p's.
Needs root (ip netns, tc) and rclone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_p2p import main as bench_p2p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its src/ is used)")
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--store-mbit", type=float, default=400)
    ap.add_argument("--node-mbit", type=float, default=800)
    ap.add_argument("--configs", default="cpu:4:400:800,net:2:200:200")
    args = ap.parse_args()
    configs = args.configs
    if args.nodes is not None:
        configs = f"swarm:{args.nodes}:{args.store_mbit:g}:{args.node_mbit:g}"
    argv = ["--against", str(args.base), "--size-mb", str(args.size_mb), "--rounds", str(args.rounds)]
    return bench_p2p([*argv, "--configs", configs])


if __name__ == "__main__":
    sys.exit(main())
