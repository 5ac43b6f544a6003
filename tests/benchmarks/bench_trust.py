#!/usr/bin/env python
"""Benchmark: what signed refs cost a restart (goal: signing and verifying add <= 20 ms).

Two parts, side by side in one run:

1. A restart with the env, image, checkpoint (pull) and compile stages on, onto a fresh node (empty tree,
   empty node cache), from a local store that holds a published env snapshot, a checkpoint and a
   compile cache: once in a domain with keys (every document signed, every read verified) and once in
   a domain without (unsigned), interleaved, medians of --rounds. The image stage has no record here
   (it reads one ref and misses): what it verifies is what a replay would.
2. The parts on their own, in fresh interpreters: loading the trust (the `cryptography` import and the
   key files), and verifying the documents such a restart reads.

    python tests/benchmarks/bench_trust.py [--rounds 9]

Everything lives in a temporary directory, removed at the end.
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

PY = sys.executable


def bootseer(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "bootseer_cli", *args], cwd=cwd, env=env, capture_output=True, text=True)


def project(base: Path, name: str, keys: bool) -> tuple[Path, dict[str, str]]:
    """A project whose store holds an env snapshot, a checkpoint and a compile cache, in its own domain."""
    proj = base / name
    tree = proj / "tree"
    tree.mkdir(parents=True)
    setup = f'mkdir -p {tree}/pkg && for i in $(seq 200); do echo "X = $i" > {tree}/pkg/m$i.py; done'
    trust = ""
    if keys:
        bootseer(["trust", "keygen", "--domain", name, "--out", str(proj / "k")], proj, os.environ.copy())
        trust = f'[trust]\nsigning_key = "{proj}/k.key"\nverify_keys = ["{proj}/k.pub"]\n'
    (proj / "ck").mkdir()
    (proj / "ck" / "weights.bin").write_bytes(os.urandom(8 << 20))
    (proj / "bootseer.toml").write_text(
        f'[store]\nuri = "{(base / "store").as_uri()}"\ndomain = "{name}"\n[exec]\nagent = false\nquiet = true\n'
        f'[env]\nroots = ["{tree}"]\nsetup = [{json.dumps(setup)}]\n[image]\nenabled = true\nrecord = "never"\n'
        f'[checkpoint]\nname = "m"\nmode = "pull"\nmountpoint = "{proj}/ckpt"\n[compile]\nenabled = true\n'
        f'cache_dir = "{proj}/compile"\npublish = false\npython = "{PY}"\n{trust}'
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(proj / "node")}
    for k in [k for k in env if k.startswith("BOOTSEER_")]:
        del env[k]
    for args in (["exec", "--", "true"], ["ckpt", "push", "ck", "--name", "m"]):
        r = bootseer(args, proj, env)
        if r.returncode:
            sys.exit(f"{name}: bootseer {' '.join(args)} failed: {r.stderr}")
    code = (
        "import time; from bootseer_cli.config import load; from bootseer_cli.settings import Settings; "
        "from bootseer_cli.store.core import open_store_for; from bootseer_cli.identity import keys_for; "
        "from bootseer_cli.compilecache.key import current_compile_key; "
        "from bootseer_cli.compilecache.jobpython import for_command; "
        "from bootseer_cli.compilecache.index import Entry, write_index; "
        "s = Settings.from_config(load()); st = open_store_for(s); "
        "ck = current_compile_key(keys_for(s), for_command(s, [])); "
        "d = st.put_blob_bytes(b'x' * 4096); "
        "write_index(st, ck.digest, 'n', {f'inductor/f{i}.py': Entry(d, 4096, time.time()) for i in range(20)}, [])"
    )
    subprocess.run([PY, "-c", code], cwd=proj, env=env, check=True)
    return proj, env


def fresh_restart(proj: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU of bootseer's process tree) of one restart onto a fresh node."""
    import resource

    for d in ("tree", "node", "compile", "ckpt"):
        shutil.rmtree(proj / d, ignore_errors=True)
    (proj / "tree").mkdir()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = bootseer(["exec", "--", "true"], proj, env)
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode or "warning" in r.stderr:
        sys.exit(f"restart failed or warned: {r.stderr}")
    return took, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


PARTS = """
import time, json, sys
t0 = time.perf_counter()
from bootseer_cli.config import load
from bootseer_cli.settings import Settings
from bootseer_cli.trust import trust_for, canonical
s = Settings.from_config(load())
t1 = time.perf_counter()
t = trust_for(s)
t2 = time.perf_counter()
doc = {"blob": "a" * 64, "size": 1, "entries": {f"inductor/f{i}.py": {"digest": "b" * 64} for i in range(20)}}
signed = t.sign(t.domain, "refs/env/x.json", doc)
t3 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    assert t.check(t.domain, "refs/env/x.json", signed) == ""
t4 = time.perf_counter()
print(json.dumps({"load_ms": 1e3 * (t2 - t1), "sign_ms": 1e3 * (t3 - t2), "verify_ms": 1e3 * (t4 - t3)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--docs", type=int, default=8, help="documents a restart verifies (part 2)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-trust-"))
    try:
        signed, plain = project(base, "signed", True), project(base, "plain", False)
        times: dict[str, list[tuple[float, float]]] = {"signed": [], "plain": []}
        for _ in range(args.rounds):
            times["signed"].append(fresh_restart(*signed))
            times["plain"].append(fresh_restart(*plain))
        for i, what in ((0, "wall"), (1, "CPU")):
            s = statistics.median(x[i] for x in times["signed"])
            p = statistics.median(x[i] for x in times["plain"])
            print(
                f"restart, 4 stages, fresh node, {what}: signed {s * 1e3:.0f} ms, unsigned {p * 1e3:.0f} ms, "
                f"added {1e3 * (s - p):+.0f} ms (medians of {args.rounds}, interleaved)"
            )
        parts = [
            json.loads(
                subprocess.run(
                    [PY, "-c", PARTS, str(args.docs)],
                    cwd=signed[0],
                    env=signed[1],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )
            for _ in range(args.rounds)
        ]
        med = {k: statistics.median(x[k] for x in parts) for k in parts[0]}
        print(
            f"parts (fresh interpreter, medians): trust load incl. cryptography import {med['load_ms']:.1f} ms, "
            f"one signature {med['sign_ms']:.2f} ms, {args.docs} verifications {med['verify_ms']:.2f} ms"
        )
        print(f"load average {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
