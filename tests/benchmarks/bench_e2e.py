"""Startup time of a real torchrun job to its first training step: without bootseer, bootseer cold,
bootseer warm restart (and a fresh node restoring), side by side in one run.

    python tests/benchmarks/bench_e2e.py [--store s3|file] [--rounds 1] [--json out.json]

The job is examples/torchrun-job (CPU torch 2.13.0, gloo, `torchrun --nproc-per-node 2`, resume from
the latest checkpoint, `bootseer_cli.ready()` after the first step). Each node is a bare venv at one
fixed path (its own mount namespace) over a base that holds only bootseer: the job's setup
`python -m pip install -r requirements.txt` installs torch, its dependencies, three small wheels and
one C extension built from an sdist, all from a loopback package index (the machine's pip
configuration cleared: PIP_CONFIG_FILE=/dev/null, no PIP_*, no PYTHONDONTWRITEBYTECODE).

- without bootseer: a fresh node runs the setup, then torchrun resumes from the checkpoint on local disk;
- bootseer cold: a fresh node and an empty store: `bootseer exec` runs the setup once, captures and
  publishes it, records the hot blocks, and the job pushes its checkpoint;
- bootseer warm restart: the same node again (env stamp, hot-block replay, checkpoint mount);
- bootseer fresh node: another node on the warm store (env restore, replay, mount).

Startup = from the node's first command to rank 0's first finished step. The stage breakdown comes
from `bootseer report --job … --json`. Goal: the warm restart removes >= 80% of the startup time
of the job without bootseer.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import (  # noqa: E402
    EXAMPLE,
    Node,
    PackageIndex,
    build_sdist,
    kill_node_processes,
)
from tests.support.s3server import S3_ENV, S3Server  # noqa: E402

from bootseer_cli.store import open_store  # noqa: E402

CACHE = Path(os.environ.get("BOOTSEER_BENCH_CACHE", "/tmp/bootseer-bench-e2e"))
BENCH_WHEELS = ["torch==2.13.0", "einops==0.8.2", "tabulate==0.10.0", "msgpack==1.2.3", "setuptools", "wheel"]


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kw)


def bench_index() -> Path:
    """torch and the job's wheels with their dependencies (through this machine's own pip setup,
    from its local mirror), plus the sdist of the job's C extension. Kept between runs."""
    d = CACHE / "index"
    if not (d / ".complete").exists():
        d.mkdir(parents=True, exist_ok=True)
        sh([sys.executable, "-m", "pip", "download", "--only-binary", ":all:", "-d", str(d), *BENCH_WHEELS])
        build_sdist(EXAMPLE / "fnv", d)
        (d / ".complete").touch()
    return d


def bootseer_base() -> list[str]:
    """A venv holding bootseer (editable, this checkout) and nothing of the job: the job's image."""
    base = CACHE / "base"
    site = base / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if not (base / ".complete").exists():
        shutil.rmtree(base, ignore_errors=True)
        sh([sys.executable, "-m", "venv", str(base)])
        sh([str(base / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(REPO)])
        probe = subprocess.run([str(base / "bin" / "python"), "-c", "import torch"], capture_output=True)
        if probe.returncode == 0:
            raise SystemExit(f"{base} has torch: the job's setup would not install it")
        (base / ".complete").touch()
    return [str(site)]


def report(store_uri: str, job: str, env: dict[str, str]) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "report", "--store", store_uri, "--job", job, "--json"],
        text=True,
        capture_output=True,
        env=env,
    )
    if r.returncode != 0:
        return {"error": r.stderr.strip()}
    return json.loads(r.stdout)


def stage_seconds(rep: dict) -> dict[str, float]:
    """Per-stage max over nodes from the report's JSON (one node per job here)."""
    out: dict[str, float] = {}
    for st in rep.get("stages", []):
        name = st.get("label") or st.get("stage")
        value = st.get("max_s")
        if name and isinstance(value, int | float):
            out[name] = float(value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=["s3", "file"], default="s3")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the four variants, report the median")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--hold-s", type=float, default=60.0, help="pause per step of the cold run (for the record)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()

    if os.geteuid() != 0:
        raise SystemExit("needs root: each node runs in its own mount namespace (unshare -m)")
    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    servers: list[object] = []
    nodes: list[Node] = []

    def cleanup() -> None:
        for n in nodes:
            kill_node_processes(n)
        for s in servers:
            s.stop()  # type: ignore[attr-defined]
        shutil.rmtree(work, ignore_errors=True)

    atexit.register(cleanup)
    t = time.time()
    index = PackageIndex(bench_index()).start()
    servers.append(index)
    sites = bootseer_base()
    print(f"prepared the index and the bootseer-only base in {time.time() - t:.0f} s", flush=True)
    os.environ.update(S3_ENV)
    image = f"bootseer-bench@sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}"

    def make_store(tag: str) -> str:
        if args.store == "file":
            return (work / f"store-{tag}").as_uri()
        s3 = S3Server(work / f"s3-{tag}" / "data").start()
        servers.append(s3)
        return s3.uri("store")

    def node(name: str, store: str, job: str) -> Node:
        n = Node(
            work / name,
            name,
            store,
            job,
            index=index,
            base_sites=sites,
            torchrun_script=False,  # the setup installs torch, and with it the torchrun entry point
            env_extra={"BOOTSEER_IMAGE": image, "PIP_NO_CACHE_DIR": "1"},
        )
        nodes.append(n)
        return n.create()

    rows: dict[str, list[float]] = {"without bootseer": [], "bootseer cold": [], "bootseer warm restart": []}
    rows["bootseer fresh node"] = []
    parts: dict[str, dict[str, float]] = {}
    for rnd in range(args.rounds):
        store = make_store(f"r{rnd}")

        # bootseer cold: a fresh node, an empty store.
        # The job runs on after its first step (as real ones do, for hours): time for the agent to scan
        # the page cache and publish the hot-block record before the launcher ends.
        cold_node = node(f"cold{rnd}", store, f"bench-cold-{rnd}")
        hold = ["--sleep-per-step", str(args.hold_s)]
        cold = cold_node.run_job(steps=args.steps, train_args=hold, timeout=1800)
        assert cold.rc == 0, cold.output[-4000:]
        if not open_store(store).list_refs("hot"):
            print("warning: no hot-block record was published by the cold start (raise --hold-s)", flush=True)
        rows["bootseer cold"].append(cold.ready_s)
        ckpt_dir = cold_node.work / cold.one("saved")["dir"]

        # bootseer warm restart: the same node again.
        cold_node.job_id = f"bench-warm-{rnd}"
        warm = cold_node.run_job(steps=args.steps, train_args=["--no-push"], timeout=1800)
        assert warm.rc == 0 and warm.train("resumed"), warm.output[-4000:]
        rows["bootseer warm restart"].append(warm.ready_s)

        # bootseer on a fresh node of the warm store.
        fresh = node(f"fresh{rnd}", store, f"bench-fresh-{rnd}").run_job(
            steps=args.steps, train_args=["--no-push"], timeout=1800
        )
        assert fresh.rc == 0 and fresh.train("resumed"), fresh.output[-4000:]
        rows["bootseer fresh node"].append(fresh.ready_s)

        # without bootseer: a fresh node runs the setup, then the job loads the checkpoint from local disk.
        plain_node = node(f"plain{rnd}", store, f"bench-plain-{rnd}")
        local_ckpt = plain_node.root / "ckpt"
        shutil.copytree(ckpt_dir, local_ckpt)
        t0 = time.time()
        setup = plain_node.run_raw(["python", "-m", "pip", "install", "-r", "requirements.txt"])
        assert setup.returncode == 0, setup.stderr[-4000:]
        setup_s = time.time() - t0
        plain = plain_node.run_job(
            steps=args.steps, bootseer=False, train_args=["--no-push", "--resume-from", str(local_ckpt)], timeout=1800
        )
        assert plain.rc == 0 and plain.train("resumed"), plain.output[-4000:]
        rows["without bootseer"].append(setup_s + plain.ready_s)
        parts.setdefault("without bootseer", {}).update(
            {"setup (pip)": setup_s, "launcher to first step": plain.ready_s}
        )

        env = {**os.environ, "XDG_CACHE_HOME": str(cold_node.cache)}
        for label, job, run in (
            ("bootseer cold", f"bench-cold-{rnd}", cold),
            ("bootseer warm restart", f"bench-warm-{rnd}", warm),
            ("bootseer fresh node", f"bench-fresh-{rnd}", fresh),
        ):
            rep = report(store, job, env)
            stages = stage_seconds(rep)
            if not stages:  # fall back to the node's own events
                stages = {
                    e["stage"]: e["duration_s"] for e in run.events if e["stage"] in ("image", "env", "checkpoint")
                }
            exec_s = sum(e["duration_s"] for e in run.events if e["stage"] == "bootseer")
            stages["launcher to first step"] = run.ready_s - exec_s
            parts[label] = {**stages, "_report": rep.get("error", "ok")}  # type: ignore[dict-item]
        for n in nodes:
            kill_node_processes(n)

    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2]

    base = med(rows["without bootseer"])
    print()
    print(f"startup to the first training step ({args.rounds} round(s), median), store {args.store}")
    print(f"{'variant':26} {'seconds':>9} {'vs without':>11}  breakdown")
    for label, xs in rows.items():
        s = med(xs)
        br = ", ".join(f"{k} {v:.1f} s" for k, v in parts.get(label, {}).items() if not k.startswith("_"))
        print(f"{label:26} {s:9.1f} {1 - s / base:10.0%}  {br}")
    warm_cut = 1 - med(rows["bootseer warm restart"]) / base
    print(f"\nwarm restart removes {warm_cut:.0%} of the startup time without bootseer (goal >= 80%)")
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "parts": parts, "warm_cut": warm_cut}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
