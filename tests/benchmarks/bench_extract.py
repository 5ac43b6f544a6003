"""The extraction alone, several source trees of bootseer against each other (see bench_envsnap.py
--extract): the restore is on a job's critical path, so a safer `extract()` must keep its time.

The tree is captured once (by the first source tree), then every rep restores it into the wiped
target with each source tree in turn, the order alternating between reps, so a change in machine
load hits all alike. The time is `extract()`'s own (plan, moves, frames, modes), in a fresh process.
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


def extract_bench(srcs: list[str], target: Path, files: int, tree: Path | None, reps: int) -> None:
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
    try:
        for rep in range(reps):
            order = srcs if rep % 2 == 0 else list(reversed(srcs))
            for src in order:
                shutil.rmtree(root, ignore_errors=True)
                os.sync()
                got = json.loads(_run(src, EXTRACT, str(blob), str(root)))
                times[src].append(got["s"])
                cpus[src].append(got["cpu"])
                print(f"rep {rep + 1}: {src}: {got['s']:.3f} s, cpu {got['cpu']:.2f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        blob.unlink(missing_ok=True)
    ref, ref_cpu = statistics.median(times[srcs[0]]), statistics.median(cpus[srcs[0]])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"extract() of {entries} entries, blob {size / 1e6:.1f} MB, {reps} reps, load average {load}")
    for src, ts in times.items():
        med, cpu = statistics.median(ts), statistics.median(cpus[src])
        print(
            f"  {src:30s} wall median {med:.3f} s (min {min(ts):.3f}, {med / ref:.3f}×)"
            f"  cpu median {cpu:.2f} s ({cpu / ref_cpu:.3f}×)"
        )
