"""How long `bootseer exec` holds a job back when its S3 store never answers: this checkout against
another, side by side in one run.

The store is a loopback endpoint that is silent one of two ways (`tests/support/silentendpoint.py`):
"hung" takes the connection and never sends a byte (a hung proxy or load balancer), "drops-syn"
never completes it (a firewall that drops packets). Each start runs the env stage (`setup = true`)
and the image stage (a one-file tree) against it, with a fresh node cache, and the job is `true`.
Issue 29's bound on what a start waits for is `[p2p] deadline_s` + 5 s (35 s by default).

    python tests/benchmarks/bench_silent_store.py [--against OLD_SRC] [--how hung,drops-syn] [--runs 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.s3server import S3_ENV  # noqa: E402
from tests.support.silentendpoint import SilentEndpoint  # noqa: E402

TIMEOUT_S = 900.0  # the old code's hung case took 363 s


def start(src: str, how: str, work: Path) -> tuple[float, str]:
    """One start against a silent store: (wall seconds of `bootseer exec -- true`, its summary line)."""
    endpoint = SilentEndpoint(how)
    node = Path(tempfile.mkdtemp(prefix="node-", dir=work))
    try:
        (node / "envroot").mkdir()
        (node / "tree").mkdir()
        (node / "tree" / "f.bin").write_bytes(b"x" * 4096)
        (node / "bootseer.toml").write_text(
            f'[store]\nuri = "s3://bkt/p?endpoint_override=127.0.0.1:{endpoint.port}&scheme=http"\n'
            f'[env]\nsetup = ["true"]\nroots = ["{node / "envroot"}"]\n'
            f'[image]\nroots = ["{node / "tree"}"]\nready = "quiet"\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
        env.update(S3_ENV, XDG_CACHE_HOME=str(node / "cache"), PYTHONPATH=src)
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"],
            cwd=node,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        took = time.perf_counter() - t
    finally:
        endpoint.close()
    if out.returncode != 0:
        sys.exit(f"the job did not start:\n{out.stderr}")
    line = next((ln for ln in out.stderr.splitlines() if ln.startswith("bootseer: image ")), "")
    return took, line.removeprefix("bootseer: ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", help="another checkout's src/ directory, in the same rounds")
    ap.add_argument("--how", default="hung,drops-syn", help="how the store is silent: hung, drops-syn")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    srcs = {"this": str(ROOT / "src")}
    if args.against:
        srcs["other"] = str(Path(args.against).resolve())
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-silent-") as tmp:
        for how in args.how.split(","):
            took: dict[str, list[float]] = {name: [] for name in srcs}
            for _ in range(args.runs):
                for name, src in srcs.items():  # interleaved
                    s, line = start(src, how, Path(tmp))
                    took[name].append(s)
                    print(f"  {how:9} {name:5} {s:7.2f} s  {line}", flush=True)
            med = {name: statistics.median(v) for name, v in took.items()}
            ratio = f"  this/other {med['this'] / med['other']:.3f}" if "other" in med else ""
            print(f"{how:9} " + "  ".join(f"{n} {m:.2f} s" for n, m in med.items()) + ratio, flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
