"""What `bootseer exec` adds to a start when it has nothing to do (goal: ≤ 0.3 s).

Runs the launcher alone and through `bootseer exec`, interleaved so machine noise hits both alike,
and prints the medians and the difference. `--against SRC` runs another checkout's `src/` (e.g. a
`git worktree` of the last release) in the same rounds: the wall and CPU time each adds, side by side.

    python tests/benchmarks/bench_exec.py [--runs N] [--against /path/to/other/src]
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
    ap.add_argument("--against", help="another checkout's src/ directory, measured in the same rounds")
    args = ap.parse_args()
    if args.against:
        compare(args.runs, args.against)
        return
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


def _cpu(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU of the child) of one run."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(argv, cwd, env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def compare(runs: int, other_src: str) -> None:
    """This checkout against `other_src`, `bootseer exec -- true` with nothing to do, interleaved."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
    cwd = tempfile.mkdtemp(prefix="bench-exec-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    base["XDG_CACHE_HOME"] = os.path.join(cwd, "cache")
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"]
    trees = {"this checkout": os.path.abspath(here), "--against": os.path.abspath(other_src)}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    for _ in range(runs):
        for name, src in trees.items():
            got[name].append(_cpu(argv, cwd, {**base, "PYTHONPATH": src}))
    print(
        f"{'exec -- true':16} {'wall (median)':>14} {'CPU (median)':>13}   runs={runs}, load {os.getloadavg()[0]:.2f}"
    )
    for name, rows in got.items():
        wall = statistics.median(w for w, _ in rows) * 1000
        cpu = statistics.median(c for _, c in rows) * 1000
        print(f"{name:16} {wall:11.1f} ms {cpu:10.1f} ms")
    shutil.rmtree(cwd, ignore_errors=True)


if __name__ == "__main__":
    main()
