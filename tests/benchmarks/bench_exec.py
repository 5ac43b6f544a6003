"""What `bootseer exec` adds to a start when it has nothing to do (goal: ≤ 0.3 s).

Runs the launcher alone and through `bootseer exec`, interleaved so machine noise hits both alike,
and prints the medians and the difference. Usage: python tests/benchmarks/bench_exec.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    bootseer = shutil.which("bootseer") or sys.exit("bootseer is not on PATH (pip install -e .)")
    cwd = tempfile.mkdtemp(prefix="bench-exec-")  # no bootseer.toml here: nothing to do
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["XDG_CACHE_HOME"] = os.path.join(cwd, "cache")
    launchers = {"true": ["true"], "python -c pass": [sys.executable, "-c", "pass"]}
    print(f"{'launcher':18} {'alone (median)':>15} {'via exec':>10} {'added':>9}   runs={args.runs}")
    for name, argv in launchers.items():
        alone, via = [], []
        for _ in range(args.runs):
            alone.append(timed(argv, cwd, env))
            via.append(timed([bootseer, "exec", "--", *argv], cwd, env))
        a, v = statistics.median(alone), statistics.median(via)
        print(f"{name:18} {a * 1000:12.0f} ms {v * 1000:7.0f} ms {(v - a) * 1000:6.0f} ms")
    shutil.rmtree(cwd, ignore_errors=True)


if __name__ == "__main__":
    main()
