"""Startup time of a real torchrun job to its first training step, every variant side by side in one run.

    python tests/benchmarks/bench_e2e.py [--quick] [--only a,b,c,d,e] [--rounds N] [--store s3|file]
                                         [--drop-caches] [--json out.json]

The job is examples/torchrun-job (CPU torch 2.13.0, gloo, `torchrun --nproc-per-node 2`, resume from
the latest checkpoint, `bootseer_cli.ready()` after the first step). Each node is a bare venv at one
fixed path (its own mount namespace) over a base that holds only bootseer: the job's setup
`python -m pip install -r requirements.txt` installs torch, its dependencies, three small wheels and
one C extension built from an sdist, all from a loopback package index (the machine's pip
configuration cleared: PIP_CONFIG_FILE=/dev/null, no PIP_*, no PYTHONDONTWRITEBYTECODE).

- (a) without bootseer: a fresh node runs the setup, then torchrun resumes from a checkpoint on local disk;
- (b) bootseer cold: a fresh node, an empty store: `bootseer exec` runs the setup once, captures and
  publishes it, arranges the hot-block record, and the job pushes its checkpoint. Split into setup,
  capture (+ publish), exec overhead, hot-block record cost (before exec; the agent's scan is behind
  the launcher and shown apart), checkpoint;
- (c) bootseer fresh node on the warm store, THE HEADLINE: a restart into a fresh container (new venv,
  empty node cache): env restore, hot-block replay, checkpoint mount;
- (d) bootseer warm restart on the same node as (b) (env stamp, replay, mount);
- (e) the compiled job (`train.py --compile`) restarted into a fresh node of the warm store, with the
  compile stage (`bootseer-compile.toml`; its cache published by one compiled start before) and
  without it (an empty TORCHINDUCTOR_CACHE_DIR): time to the first step, and the first compiled step
  inside it from the job's own log (`train: compiled first_step_s=…`).

(c), (d) and (e) need the warm store that (b) makes: asked for without (b), the cold start still
runs (and is shown). Startup = from the node's first command to rank 0's first finished step
(`train: ready`). The breakdown comes from the nodes' own stage events (what `bootseer report`
reads). Goals: (c) removes >= 80% of (a)'s startup (issue 15); (b) <= 1.15x (a) and <= 5 s added
before exec beyond the setup (issue 16); (e) the first compiled step >= 5x faster with the stage
(issue 18). `--quick` (one round, short hold) runs in under 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import (  # noqa: E402
    EXAMPLE,
    Node,
    PackageIndex,
    Run,
    build_sdist,
    kill_node_processes,
)
from tests.support.s3server import S3_ENV, S3Server  # noqa: E402

from bootseer_cli.store.core import open_store  # noqa: E402

CACHE = Path(os.environ.get("BOOTSEER_BENCH_CACHE", "/tmp/bootseer-bench-e2e"))
BENCH_WHEELS = ["torch==2.13.0", "einops==0.8.2", "tabulate==0.10.0", "msgpack==1.2.3", "setuptools", "wheel"]
VARIANTS = "abcde"
LABELS = {
    "a": "(a) without bootseer",
    "b": "(b) bootseer cold",
    "c": "(c) bootseer fresh node",
    "d": "(d) bootseer warm restart",
    "e0": "(e) compiled, publishing start",
    "e+": "(e) compiled, compile stage",
    "e-": "(e) compiled, no compile stage",
}
STAGES = ("image", "env", "checkpoint", "compile")  # the stages before exec whose time the breakdown shows
TIMEOUT = 1800.0


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
    # The base is an editable install: reuse it only when it points at this checkout (a base made from
    # another worktree would measure that worktree's code).
    done = base / ".complete"
    if not done.exists() or done.read_text().strip() != str(REPO):
        shutil.rmtree(base, ignore_errors=True)
        sh([sys.executable, "-m", "venv", str(base)])
        sh([str(base / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(REPO)])
        probe = subprocess.run([str(base / "bin" / "python"), "-c", "import torch"], capture_output=True)
        if probe.returncode == 0:
            raise SystemExit(f"{base} has torch: the job's setup would not install it")
        done.write_text(str(REPO))
    return [str(site)]


# ---------------------------------------------------------------- where a start's time went


def last_events(run: Run) -> dict[str, dict]:
    """The node's events of this start by stage (the last of each: a stage runs once per start)."""
    return {e["stage"]: e for e in run.events if isinstance(e.get("duration_s"), int | float)}


def extra_of(event: dict) -> dict:
    """An event's stage-specific facts (`extra`: a JSON object, as events.record writes it)."""
    try:
        extra = json.loads(event.get("extra") or "{}")
    except (TypeError, ValueError):
        return {}
    return extra if isinstance(extra, dict) else {}


def env_parts(env: dict) -> dict[str, float]:
    """The env stage: a restore is one figure; a build is the setup and what bootseer added to it."""
    dur = float(env["duration_s"])
    extra = extra_of(env)
    if "setup_s" not in extra:
        out = {f"env {env.get('outcome', '')}".rstrip(): dur}
        if "fetch_s" in extra:  # a restore: of it, the blob's fetch (swarm or store) and its extraction
            out.update({"of it fetch": float(extra["fetch_s"]), "of it extract": float(extra["extract_s"])})
            out["of it from peers MB"] = float(env.get("bytes_from_peers") or 0) / 1e6
        return out
    setup = float(extra["setup_s"])
    if "capture_s" in extra:  # the stage may time capture and publish apart (issue 16)
        out = {"setup": setup, "capture": float(extra["capture_s"])}
        if "publish_s" in extra:
            out["publish"] = float(extra["publish_s"])
        return out
    return {"setup": setup, "capture + publish": dur - setup}


def stage_parts(run: Run) -> dict[str, float]:
    """Where a bootseer start's time went: bootseer's own overhead (interpreter start, config, keys,
    anything outside the stages), each stage before exec, the launcher to its first step, and what the
    agent did behind the launcher (not in the startup time: the hot-block scan, uploads)."""
    ev = last_events(run)
    boot = ev.get("bootseer")
    if boot is None:
        return {}
    t_exec = float(boot["end"])
    parts: dict[str, float] = {}
    in_stages = 0.0
    for name in STAGES:
        if name in ev:
            in_stages += float(ev[name]["duration_s"])
            if name == "env":
                parts.update(env_parts(ev[name]))
            elif name == "image":
                what = "hot-block record (evict)" if ev[name].get("outcome") == "miss" else "hot-block replay"
                parts[what] = float(ev[name]["duration_s"])
            else:
                parts[name] = float(ev[name]["duration_s"])
    parts["exec overhead"] = max(0.0, t_exec - run.started - in_stages)
    parts["launcher to first step"] = run.ready_s - (t_exec - run.started)
    for name, e in ev.items():
        if name not in (*STAGES, "bootseer", "ready") and float(e.get("start", 0)) >= t_exec:
            parts[f"{name} (agent, behind the launcher)"] = float(e["duration_s"])
    return parts


def compiled_parts(run: Run) -> dict[str, float]:
    """The compiled job: its first step, compilation included, as the job itself timed it."""
    return {"first compiled step": float(run.one("compiled")["first_step_s"])}


# ---------------------------------------------------------------- the bench


@dataclass
class Bench:
    """One benchmark run: its work directory, index, base, image reference, nodes and figures."""

    args: argparse.Namespace
    work: Path
    index: PackageIndex
    sites: list[str]
    image: str = field(default_factory=lambda: f"bootseer-bench@sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}")
    servers: list[object] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    rows: dict[str, list[float]] = field(default_factory=dict)
    parts: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def store(self, tag: str) -> str:
        if self.args.store == "file":
            return (self.work / f"store-{tag}").as_uri()
        s3 = S3Server(self.work / f"s3-{tag}" / "data").start()
        self.servers.append(s3)
        return s3.uri("store")

    def node(self, name: str, store: str, job: str, config: str | None = None, **env: str) -> Node:
        """A fresh node: new venv, empty cache (XDG_CACHE_HOME), the example's files."""
        n = Node(
            self.work / name,
            name,
            store,
            job,
            index=self.index,
            base_sites=self.sites,
            torchrun_script=False,  # the setup installs torch, and with it the torchrun entry point
            env_extra={"BOOTSEER_IMAGE": self.image, "PIP_NO_CACHE_DIR": "1", **env},
        )
        self.nodes.append(n)
        n.create()
        return n.use_config(config) if config else n

    def retire(self, n: Node) -> None:
        """A node done with: its processes ended and its venv (~900 MB) removed, so disk stays bounded."""
        kill_node_processes(n)
        shutil.rmtree(n.venv, ignore_errors=True)

    def settle(self) -> None:
        """Before each measured start: with --drop-caches, a cold page cache, as on a new machine."""
        if self.args.drop_caches:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")

    def start(self, n: Node, resumes: bool = True, **kw) -> Run:
        self.settle()
        run = n.run_job(timeout=TIMEOUT, steps=self.args.steps, **kw)
        if run.rc != 0 or (resumes and not run.train("resumed")):
            raise SystemExit(f"{n.name}: the job failed (rc={run.rc}):\n{run.output[-4000:]}")
        return run

    def add(self, key: str, startup: float, parts: dict[str, float]) -> None:
        self.rows.setdefault(key, []).append(startup)
        self.parts.setdefault(key, []).append(parts)

    def cleanup(self) -> None:
        for n in self.nodes:
            kill_node_processes(n)
        for s in self.servers:
            s.stop()  # type: ignore[attr-defined]
        shutil.rmtree(self.work, ignore_errors=True)


def cold_start(b: Bench, rnd: int, store: str) -> tuple[Node, Path]:
    """(b): a fresh node on an empty store. The job runs on after its first step (as real ones do, for
    hours): time for the agent to scan the page cache and publish the hot-block record."""
    n = b.node(f"cold{rnd}", store, f"bench-cold-{rnd}")
    run = b.start(n, resumes=False, train_args=["--sleep-per-step", str(b.args.hold_s)])
    if not open_store(store).list_refs("hot"):
        print("warning: no hot-block record was published by the cold start (raise --hold-s)", flush=True)
    b.add("b", run.ready_s, stage_parts(run))
    return n, n.work / run.one("saved")["dir"]


def warm_restart(b: Bench, rnd: int, n: Node) -> None:
    """(d): the cold node again: its env is present (stamp), the hot blocks replay, the checkpoint mounts."""
    n.job_id = f"bench-warm-{rnd}"
    run = b.start(n, train_args=["--no-push"])
    b.add("d", run.ready_s, stage_parts(run))


def fresh_node(b: Bench, rnd: int, store: str) -> None:
    """(c), the headline: a fresh node (new venv, empty node cache) on the warm store."""
    n = b.node(f"fresh{rnd}", store, f"bench-fresh-{rnd}")
    run = b.start(n, train_args=["--no-push"])
    b.add("c", run.ready_s, stage_parts(run))
    b.retire(n)


def compiled(b: Bench, rnd: int, store: str) -> None:
    """(e): the compiled job on fresh nodes of the warm store. One compiled start with the stage
    publishes the compile cache; then a fresh node with the stage (restores it) and one without
    (compiles from an empty TORCHINDUCTOR_CACHE_DIR of its own), their order alternating by round so
    that what one leaves in the page cache (the compiler, torch's headers) favours neither."""
    with_stage = ("e+", "with", {})
    root = b.work / f"compile-without{rnd}"
    without_stage = (
        "e-",
        "without",
        {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")},
    )
    pair = [with_stage, without_stage] if rnd % 2 == 0 else [without_stage, with_stage]
    for key, name, env in [("e0", "publish", {}), *pair]:
        config = "bootseer-compile.toml" if key != "e-" else None
        n = b.node(f"compile-{name}{rnd}", store, f"bench-compile-{name}-{rnd}", config=config, **env)
        run = b.start(n, train_args=["--no-push", "--compile"])
        b.add(key, run.ready_s, {**compiled_parts(run), **stage_parts(run)})
        b.retire(n)


def without(b: Bench, rnd: int, store: str, ckpt: Path | None) -> None:
    """(a): a fresh node runs the setup, then torchrun loads the checkpoint from local disk (from
    scratch when (b) did not run: no checkpoint exists)."""
    n = b.node(f"plain{rnd}", store, f"bench-plain-{rnd}")
    train_args = ["--no-push"]
    if ckpt is not None:
        local = n.root / "ckpt"
        shutil.copytree(ckpt, local)
        train_args += ["--resume-from", str(local)]
    b.settle()
    t0 = time.time()
    setup = n.run_raw(["python", "-m", "pip", "install", "-r", "requirements.txt"])
    if setup.returncode != 0:
        raise SystemExit(f"{n.name}: the setup failed:\n{setup.stderr[-4000:]}")
    setup_s = time.time() - t0
    run = n.run_job(timeout=TIMEOUT, steps=b.args.steps, bootseer=False, train_args=train_args)
    if run.rc != 0:
        raise SystemExit(f"{n.name}: the job failed (rc={run.rc}):\n{run.output[-4000:]}")
    b.add("a", setup_s + run.ready_s, {"setup (pip)": setup_s, "launcher to first step": run.ready_s})
    b.retire(n)


def one_round(b: Bench, rnd: int, only: set[str]) -> None:
    store = b.store(f"r{rnd}")
    ckpt = None
    if only & set("bcde"):
        cold_node, ckpt = cold_start(b, rnd, store)
        if "d" in only:
            warm_restart(b, rnd, cold_node)
        b.retire(cold_node)
    if "c" in only:
        fresh_node(b, rnd, store)
    if "e" in only:
        compiled(b, rnd, store)
    if "a" in only:
        without(b, rnd, store, ckpt)
    for n in b.nodes:
        kill_node_processes(n)


# ---------------------------------------------------------------- figures


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def med_parts(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each part's median over the rounds, in the order the parts first appeared."""
    keys = list(dict.fromkeys(k for p in runs for k in p))
    return {k: med([p[k] for p in runs if k in p]) for k in keys}


def ratios(b: Bench) -> dict[str, float]:
    """The figures the issues set goals for, from the medians (only those whose variants ran)."""
    m = {k: med(v) for k, v in b.rows.items()}
    out: dict[str, float] = {}
    if "a" in m:
        for key, name in (("c", "fresh_node_cut"), ("d", "warm_restart_cut"), ("e+", "compiled_fresh_cut")):
            if key in m:
                out[name] = 1 - m[key] / m["a"]
        if "b" in m:
            out["cold_over_without"] = m["b"] / m["a"]
    if "b" in m:
        cold = med_parts(b.parts["b"])
        out["cold_added_before_exec_s"] = sum(
            v for k, v in cold.items() if k not in ("setup", "launcher to first step") and "agent" not in k
        )
    if "e+" in m and "e-" in m:
        w, wo = med_parts(b.parts["e+"]), med_parts(b.parts["e-"])
        out["compile_speedup"] = wo["first compiled step"] / w["first compiled step"]
        out["compiled_startup_cut"] = 1 - m["e+"] / m["e-"]
    if "e0" in m and "compile" in (first := med_parts(b.parts["e0"])):
        out["compile_stage_empty_s"] = first["compile"]
    return out


def print_table(b: Bench) -> None:
    base = med(b.rows["a"]) if "a" in b.rows else None
    print(f"\nstartup to the first training step ({b.args.rounds} round(s), median), store {b.args.store}")
    print(f"{'variant':32} {'seconds':>9} {'vs (a)':>8}  breakdown (seconds)")
    for key in LABELS:
        if key not in b.rows:
            continue
        s = med(b.rows[key])
        vs = f"{s / base - 1:+8.0%}" if base else f"{'-':>8}"
        br = ", ".join(f"{k} {v:.1f}" for k, v in med_parts(b.parts[key]).items())
        print(f"{LABELS[key]:32} {s:9.1f} {vs}  {br}")


def print_ratios(r: dict[str, float]) -> None:
    lines = [
        ("fresh_node_cut", "HEADLINE (c) fresh node on the warm store removes {:.0%} of (a)'s startup (goal >= 80%)"),
        ("warm_restart_cut", "(d) warm restart on the same node removes {:.0%} of (a)'s startup"),
        ("cold_over_without", "(b) cold start / (a) without bootseer: {:.2f}x (goal <= 1.15x)"),
        ("cold_added_before_exec_s", "(b) added before exec beyond the setup: {:.1f} s (goal <= 5 s)"),
        ("compile_speedup", "(e) first compiled step {:.1f}x faster with the compile stage (goal >= 5x)"),
        ("compile_stage_empty_s", "(e) the compile stage with nothing to restore: {:.2f} s (goal <= 0.2 s)"),
        ("compiled_startup_cut", "(e) the compile stage removes {:.0%} of the compiled job's startup"),
        ("compiled_fresh_cut", "(e) the compiled job with the stage removes {:.0%} of (a)'s (uncompiled) startup"),
    ]
    print()
    for key, text in lines:
        if key in r:
            print(text.format(r[key]))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=VARIANTS, help="variants to run, e.g. a,c,e (default: all of a-e)")
    ap.add_argument("--quick", action="store_true", help="one round and a short hold (under 10 minutes)")
    ap.add_argument("--store", choices=["s3", "file"], default="s3")
    ap.add_argument("--rounds", type=int, default=None, help="repeat every variant, report medians (default 3)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--hold-s", type=float, default=None, help="pause per step of the cold run (default 60, quick 15)")
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before each measured start")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    only = set(args.only.replace(",", "").replace(" ", "").lower())
    if not only or only - set(VARIANTS):
        ap.error(f"--only: variants are letters of {','.join(VARIANTS)} (got {args.only!r})")
    args.only = only
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.hold_s = args.hold_s if args.hold_s is not None else (15.0 if args.quick else 60.0)
    return args


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: each node runs in its own mount namespace (unshare -m)")
    compile_vars = ("TORCHINDUCTOR_", "TRITON_", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH")
    for k in [k for k in os.environ if k.startswith(compile_vars)]:
        del os.environ[k]  # every node starts with empty compile caches unless bootseer restores them
    os.environ.update(S3_ENV)
    t_all, load_before = time.time(), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    index = PackageIndex(bench_index()).start()
    b = Bench(args, work, index, bootseer_base())
    b.servers.append(index)
    atexit.register(b.cleanup)
    print(f"prepared the index and the bootseer-only base in {time.time() - t_all:.0f} s", flush=True)
    for rnd in range(args.rounds):
        one_round(b, rnd, args.only)
    print_table(b)
    r = ratios(b)
    print_ratios(r)
    load = os.getloadavg()
    print(
        f"\nmachine: {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} after; {time.time() - t_all:.0f} s in all"
    )
    if args.json:
        doc = {
            "rows": b.rows,
            "parts": b.parts,
            "ratios": r,
            "labels": LABELS,
            "load_before": load_before,
            "load_after": load,
            "args": {**vars(args), "only": sorted(args.only), "json": str(args.json)},
        }
        tmp = args.json.with_name(f".{args.json.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=2, default=str))
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
