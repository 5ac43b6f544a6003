"""The extraction alone, several source trees of bootseer against each other (see bench_envsnap.py
--extract): the restore is on a job's critical path, so a safer `extract()` must keep its time.

The tree is captured once (by the first source tree), then every round restores it into the
removed target with each source tree in turn, the order rotating between rounds, so a change in
machine load hits all alike. Before every timed step: `sync` and `drop_caches` (root), so no step
pays in its own write path for writing back or reclaiming the pages an earlier step left (on ext4
plain file creation varied 15× between identical runs without it). The time is `extract()`'s own
(plan, moves, frames, modes), in a fresh process; the report gives, per tree, the median of the
per-round ratios to the first tree with their quartiles and range, CPU time, and the syscall counts
of one more extraction each under `strace -c -f`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

BUILD = """
import sys
from bootseer_cli.envsnap import format, manifest
root, blob = sys.argv[1], sys.argv[2]
after = manifest.scan([root])
w = format.ArchiveWriter(__import__("pathlib").Path(blob))
for p in sorted(after):
    w.add(p, after[p])
w.finish({"roots": [root], "deletions": []})
"""

EXTRACT = """
import json, os, sys, time
from bootseer_cli.envsnap import extract, reader
blob, root = __import__("pathlib").Path(sys.argv[1]), sys.argv[2]
meta = reader.read_meta(blob)
t, c = time.perf_counter(), sum(os.times()[:4])
extract.extract(blob, meta, [root])
print(json.dumps({"s": time.perf_counter() - t, "cpu": sum(os.times()[:4]) - c}))
"""


def synthetic(root: Path, files: int) -> None:
    """`files` files like a site-packages: packages of ~25 modules two levels deep, mostly small."""
    rng = random.Random(26)
    words = [f"name_{i} = {i!r}\n".encode() for i in range(400)]
    for i in range(files):
        d = root / "lib" / f"pkg{i // 500}" / f"sub{(i // 25) % 20}"
        if i % 25 == 0:
            d.mkdir(parents=True, exist_ok=True)
        size = int(rng.lognormvariate(8, 1.2))
        body = b"".join(rng.choice(words) for _ in range(max(1, size // 14)))
        (d / f"mod{i % 25}.py").write_bytes(body)
        if i % 7 == 0:
            os.chmod(d / f"mod{i % 25}.py", 0o755)


def _run(src: str, script: str, *argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    r = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True, check=False)
    if r.returncode:
        raise SystemExit(f"{src}: {r.stderr[-2000:]}")
    return r.stdout


def drop_caches() -> bool:
    """`sync`, then drop the page cache, dentries and inodes (root only); False where not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _syscalls(src: str, blob: Path, root: Path) -> dict[str, int]:
    """`strace -c -f` of one extraction by `src`: calls per syscall (empty where strace is missing)."""
    if not shutil.which("strace"):
        return {}
    shutil.rmtree(root, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    argv = ["strace", "-c", "-f", "-o", "/dev/stderr", sys.executable, "-c", EXTRACT, str(blob), str(root)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    calls: dict[str, int] = {}
    for line in r.stderr.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1].isidentifier() and parts[-1] != "total" and parts[3].isdigit():
            calls[parts[-1]] = int(parts[3])
    return calls


def extract_bench(srcs: list[str], target: Path, files: int, tree: Path | None, reps: int) -> None:
    """Every round: each source tree restores the blob once, in a rotated order, each step after the
    target is removed and the page cache dropped (`sync; drop_caches`: no step pays for writing back
    or reclaiming what an earlier one left); the ratio to the first tree is taken per round."""
    root = target
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    if tree is not None:
        shutil.copytree(tree, root, symlinks=True)
    else:
        synthetic(root, files)
    blob = root.parent / "extract-bench.blob"
    _run(srcs[0], BUILD, str(root), str(blob))
    entries = sum(len(d) + len(f) for _, d, f in os.walk(root))
    size = blob.stat().st_size
    times: dict[str, list[float]] = {s: [] for s in srcs}
    cpus: dict[str, list[float]] = {s: [] for s in srcs}
    load0 = os.getloadavg()
    dropped = True
    calls: dict[str, dict[str, int]] = {}
    try:
        for rep in range(reps):
            k = rep % len(srcs)
            order = srcs[k:] + srcs[:k] if len(srcs) > 2 else (srcs if rep % 2 == 0 else list(reversed(srcs)))
            for src in order:
                shutil.rmtree(root, ignore_errors=True)
                dropped = drop_caches() and dropped
                got = json.loads(_run(src, EXTRACT, str(blob), str(root)))
                times[src].append(got["s"])
                cpus[src].append(got["cpu"])
                print(f"rep {rep + 1}: {src}: {got['s']:.3f} s, cpu {got['cpu']:.2f} s", file=sys.stderr, flush=True)
        calls = {src: _syscalls(src, blob, root) for src in srcs}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        blob.unlink(missing_ok=True)
    load1 = os.getloadavg()
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(root.parent)], capture_output=True, text=True).stdout.strip()
    print(
        f"extract() of {entries} entries, blob {size / 1e6:.1f} MB, on {fs or '?'}, {reps} rounds, page cache "
        f"{'dropped before every step' if dropped else 'NOT dropped (not root)'}; load average "
        f"{' / '.join(f'{x:.1f}' for x in load0)} before, {' / '.join(f'{x:.1f}' for x in load1)} after"
    )
    ref = srcs[0]
    for src in srcs:
        ts, cs = times[src], cpus[src]
        line = f"  {src:30s} wall median {statistics.median(ts):.3f} s (min {min(ts):.3f}, max {max(ts):.3f})"
        line += f", cpu median {statistics.median(cs):.2f} s"
        if src != ref:
            wr = sorted(a / b for a, b in zip(ts, times[ref], strict=True))
            cr = sorted(a / b for a, b in zip(cs, cpus[ref], strict=True))
            q1, q3 = wr[len(wr) // 4], wr[(3 * len(wr)) // 4]
            line += (
                f"; ÷ {ref}: wall {statistics.median(wr):.3f}× per round (quartiles {q1:.3f}–{q3:.3f}, "
                f"range {wr[0]:.3f}–{wr[-1]:.3f}), cpu {statistics.median(cr):.3f}×"
            )
        print(line)
    if any(calls.values()):
        names = sorted({n for c in calls.values() for n in c}, key=lambda n: -calls[ref].get(n, 0))
        total = {src: sum(c.values()) for src, c in calls.items()}
        print("  syscalls (strace -c -f, one extraction): " + "; ".join(f"{s}: {total[s]}" for s in srcs))
        for n in names[:12]:
            print(f"    {n:18s} " + "  ".join(f"{calls[s].get(n, 0):>8d}" for s in srcs))
