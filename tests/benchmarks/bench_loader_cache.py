"""Benchmark (issue 28, item 5): replay into a loader's own disk cache, side by side with the same loader
keeping nothing. For `rclone mount --vfs-cache-mode full` and `off` of one bucket, in one run:

  cold         a fresh mount (its disk cache empty), page cache dropped, the program alone
  warm mount   the program again right after, on the same mount (what the loader's cache gives)
  replay       a fresh mount, page cache dropped, `bootseer exec` with the record (taken once per mode
               by a recording start): the stage judges the loader by a timed re-read and replays or not

and the ratios: speed-up of the warm mount and of the replay over cold, and the replay's share of the
warm mount's speed-up (issue 28's goal: >= 80 % on rclone full; never slower on rclone off).

Payloads: `--payload synth` (default; a package of `--modules` modules of `--module-kb` kB, precompiled
as unchecked-hash .pyc, `import synth`) or `--payload venv` (the site-packages of bench_hotblocks.py's
venv, `--program "import torch"`). The bucket is served by `rclone serve s3` from the directory (no
upload) behind the delaying proxy (`--delay-ms` per request); the network is capped by rclone's own
`--bwlimit` (default 50M, i.e. 400 mbit) or, with `--rate-mbit`, by tbf in a network namespace.

    python tests/benchmarks/bench_loader_cache.py [--payload synth|venv] [--rounds 3] [--delay-ms 4]
        [--bwlimit 50M] [--rate-mbit 0] [--queue-ms 400] [--direct] [--program "import torch"]
        [--packages torch==2.13.0 ...] [--modes full,off]

Each run also says how many CPU-seconds the whole machine spent busy over it and whose they were (the
program with the stage, rclone, the S3 server, the proxy): on a machine of N cores no run ends before
its CPU-s / N. `--timeline` prints each cold and replay run every 0.25 s (cores busy, MB/s the bucket
sent, HEADs, GETs and listings), `--trace-stage` marks the stage's parts on it (stage_trace.py).

Needs root (drop_caches, FUSE, fanotify). Cleans up its mounts, server, proxy and namespace however it ends.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_hotblocks as bh
from tests.support.delayproxy import DelayProxy
from tests.support.rclonemount import RcloneMount

WORK = bh.WORK / "loader-cache"
MODES = ("full", "off")
CASES = ("cold", "warm mount", "replay")


class CappedRclone(RcloneMount):
    """`rclone mount` with `--bwlimit` (empty: none)."""

    bwlimit = ""

    def argv(self) -> list[str]:
        return [*super().argv(), *(["--bwlimit", self.bwlimit] if self.bwlimit else [])]


TICK = os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU-seconds every core has spent busy since boot (/proc/stat: all but idle, iowait and steal)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, *_ = (int(x) for x in f.readline().split()[1:])
    return (user + nice + system + irq + softirq) / TICK


def _proc_cpu_s(pid: int | None) -> float:
    """CPU-seconds of one process and its reaped children so far (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return sum(int(x) for x in fields[11:15]) / TICK


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class CpuClock:
    """Where a timed run's CPU went, on the whole machine: is the start bound by the cores?

    `machine` is every core's busy time over the run; `program` the timed command's own (the stage
    and the program: a waited child); `loader` the rclone mount's; `server` the S3 server's; `proxy`
    this process's (the delaying proxy's threads). What is left (the agent, the kernel's writeback) is
    the machine's less those."""

    PARTS = ("machine", "program", "loader", "server", "proxy")

    def __init__(self, mount: RcloneMount, server: Any) -> None:
        self.mount, self.server = mount, server

    def _now(self) -> dict[str, float]:
        mount_pid = self.mount.proc.pid if self.mount.proc else None
        server_pid = self.server.proc.pid if getattr(self.server, "proc", None) else None
        return {
            "machine": _machine_busy_s(),
            "program": _children_cpu_s(),
            "loader": _proc_cpu_s(mount_pid),
            "server": _proc_cpu_s(server_pid),
            "proxy": _self_cpu_s(),
        }

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> dict[str, float]:
        t1 = self._now()
        return {k: t1[k] - self._t0[k] for k in self.PARTS}


class Timeline:
    """Every 0.25 s of one timed run: the cores' busy share and what the bucket sent (MB/s through the
    proxy), to see whether a start waits on the link, on the cores, or on neither (round trips)."""

    STEP_S = 0.25

    def __init__(self, proxy: DelayProxy | LinkCount) -> None:
        self.proxy = proxy
        self.rows: list[tuple[float, float, float, str]] = []
        self._stop = threading.Event()

    def _run(self) -> None:
        t0 = self.t0 = time.monotonic()
        busy, sent, last, seen = _machine_busy_s(), self.proxy.bytes_down, t0, len(self.proxy.lines)
        while not self._stop.wait(self.STEP_S):
            now = time.monotonic()
            b, s, n = _machine_busy_s(), self.proxy.bytes_down, len(self.proxy.lines)
            asked = self.proxy.lines[seen:n]
            lists = sum(1 for x in asked if x.startswith("GET") and ("list-type" in x or "delimiter" in x))
            gets = sum(1 for x in asked if x.startswith("GET")) - lists
            heads = sum(1 for x in asked if x.startswith("HEAD"))
            dt = now - last
            cpu = (b - busy) / dt / (os.cpu_count() or 1)
            self.rows.append((now - t0, cpu, (s - sent) / dt / 1e6, f"{heads:4} {gets:4} {lists:4}"))
            busy, sent, last, seen = b, s, now, n

    def __enter__(self) -> Timeline:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def print(self, title: str, err: str = "") -> None:
        """The rows, with the stage's parts (`stage_trace.py`'s lines in `err`) where they fall."""
        marks = []
        for line in err.splitlines():
            if line.startswith("stage-trace "):
                _, at, what, name = line.split(maxsplit=3)
                marks.append((float(at) - self.t0, f"{what} {name}"))
        print(f"timeline of {title}: t s, cores busy, MB/s the bucket sent, HEADs GETs listings")
        for t, cpu, mbs, asked in self.rows:
            while marks and marks[0][0] <= t:
                at, what = marks.pop(0)
                print(f"  {at:5.2f}                         <- {what}")
            print(f"  {t:5.2f} {cpu:5.0%} {mbs:6.1f} {asked} {'#' * round(cpu * 20):20} {'=' * round(mbs / 2.5)}")


class LinkCount:
    """In place of the proxy where rclone talks to the server directly (`--direct`): what the bucket
    sent is what the root namespace's link to the lab received (the server's egress, through the cap);
    no request is counted or logged. Without the proxy the harness spends no CPU relaying (0.7-1.0
    CPU-s of a replay start) and a response crosses one TCP connection, not two."""

    def __init__(self, link: str, endpoint: str) -> None:
        self.requests = 0
        self.lines: list[str] = []
        self.counter = Path("/sys/class/net") / link / "statistics" / "rx_bytes"
        self.endpoint = endpoint

    @property
    def bytes_down(self) -> int:
        return int(self.counter.read_text())


def make_synth(base: Path, modules: int, module_kb: int) -> Path:
    """`base/synth-tree/synth`: `modules` modules importing a shared one, all imported by the package."""
    tree = base / "synth-tree"
    marker = tree / f".built-{modules}-{module_kb}"
    if marker.exists():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    pkg = tree / "synth"
    pkg.mkdir(parents=True)
    (pkg / "common.py").write_text("SEEN = []\n")
    for i in range(modules):
        body = f"from . import common\nDATA = {os.urandom(module_kb * 1000)!r}\ncommon.SEEN.append({i})\n"
        (pkg / f"m{i:04d}.py").write_text(body)
    names = ", ".join(f"m{i:04d}" for i in range(modules))
    (pkg / "__init__.py").write_text(f"from . import common\nfrom . import {names}\n")
    compileall.compile_dir(
        str(pkg), quiet=1, invalidation_mode=compileall.py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    marker.write_text("")
    return tree


def measure_mode(
    mode: str, tree: Path, proxy: DelayProxy | LinkCount, server: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """The recording start, then `rounds` of cold / warm mount / replay on one mount mode."""
    home = WORK / f"home-{mode}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["XDG_CACHE_HOME"] = str(home)
    mount = CappedRclone(proxy.endpoint, tree.name, WORK / f"mnt-{mode}", mode, WORK)
    mount.bwlimit = args.bwlimit
    prog = [sys.executable, "-c", f"import sys; sys.path[:0] = [{str(mount.mountpoint)!r}]; {args.program}"]
    common = {"prefetch_threads": args.threads, "ready": "quiet", "foreground_s": args.foreground_s}
    cfg_rec = bh.write_cfg(WORK / f"{mode}-rec.toml", [mount.mountpoint], **common)
    cfg = bh.write_cfg(WORK / f"{mode}.toml", [mount.mountpoint], record="never", **common)
    ld = bh.Loader(f"rclone-{mode}", mount, mount.mountpoint, proxy=proxy, server=server)
    out: dict[str, Any] = {"times": {c: [] for c in CASES}, "gets": {c: [] for c in CASES}, "lines": []}
    out["mb"] = {c: [] for c in CASES}  # what the bucket sent (at the proxy), MB
    out["cached_mb"] = []  # what rclone's cache held after each replay start: what it fetched and kept
    out["cpu"] = {c: [] for c in CASES}
    clock = CpuClock(mount, server)
    # --trace-stage: the replay start through stage_trace.py, which marks the stage's parts
    bs = [sys.executable, str(Path(__file__).with_name("stage_trace.py"))] if args.trace_stage else bh.BS
    try:
        mount.start()
        bh.measure(ld, "record", [*bh.BS, "exec", "-c", str(cfg_rec), "--", *prog], env, home)
        show = json.loads(bh.sh([*bh.BS, "hot", "show", "--json", "-c", str(cfg)], env=env, cwd=WORK).stdout)
        out["record"] = show
        for rnd in range(args.rounds):
            for case in CASES if rnd % 2 == 0 else (CASES[2], CASES[0], CASES[1]):
                if case == "warm mount":
                    continue  # measured right after its cold run, below
                cmd = prog if case == "cold" else [*bs, "exec", "-c", str(cfg), "--", *prog]
                ld.cold()
                before, sent = proxy.requests, proxy.bytes_down
                clock.start()
                if args.timeline:
                    with Timeline(proxy) as tl:
                        dt, err = bh.timed(cmd, env, bh.RUN_TIMEOUT_S, ld.stop)
                    tl.print(f"{mode} {case}, round {rnd + 1}: {dt:.2f} s", err)
                else:
                    dt, err = bh.timed(cmd, env, bh.RUN_TIMEOUT_S, ld.stop)
                out["cpu"][case].append(clock.stop())
                out["times"][case].append(dt)
                out["gets"][case].append(proxy.requests - before)
                out["mb"][case].append((proxy.bytes_down - sent) / 1e6)
                if case == "replay":
                    out["cached_mb"].append(cache_mb(mount))
                    out["lines"].append(_replay_line(err))
                else:  # the warm mount: the same program again, nothing restarted or dropped
                    before, sent = proxy.requests, proxy.bytes_down
                    clock.start()
                    dt, _ = bh.timed(prog, env, bh.RUN_TIMEOUT_S, ld.stop)
                    out["cpu"]["warm mount"].append(clock.stop())
                    out["times"]["warm mount"].append(dt)
                    out["gets"]["warm mount"].append(proxy.requests - before)
                    out["mb"]["warm mount"].append((proxy.bytes_down - sent) / 1e6)
                bh.wait_agents(home)
            print(f"rclone {mode}: round {rnd + 1}/{args.rounds} done", flush=True)
    finally:
        mount.stop()
    return out


def _replay_line(err: str) -> str:
    """A replay start's stage line and, where the loader was judged, the verdict and how it was had:
    timed by this start or read from the store (each round's, so a reader sees which rounds paid for
    the judgement)."""
    lines = err.splitlines()
    stage = next((x for x in lines if "image " in x and "|" in x), "").strip()
    stage = stage.removeprefix("bootseer: ").split(" | ")[0]
    judged = next((x for x in lines if "cache of its own" in x), "")
    if not judged:
        return stage
    verdict = next((v for v in ("keeps no cache", "cannot tell") if v in judged), "keeps a cache")
    how = "read from the store" if "decided by an earlier start" in judged else "timed by this start"
    return f"{stage}; loader {verdict} ({how})"


def cache_mb(mount: RcloneMount) -> float:
    """MB in the mount's disk cache (the blocks of its sparse files): what rclone fetched and kept."""
    root = mount.workdir / f"rclone-cache-{mount.mountpoint.name}" / "vfs"
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file()) / 1e6


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print()
    print(f"program: {args.program!r} ({args.payload}); rclone mount, --buffer-size 0, 1M chunks")
    cap = f"rclone --bwlimit {args.bwlimit}" if args.bwlimit else "no rclone --bwlimit"
    cap += f", S3 server egress tbf {args.rate_mbit:g} mbit, queue {args.queue_ms:g} ms" if args.rate_mbit else ""
    how = "no proxy: requests not counted" if args.direct else f"{args.delay_ms:g} ms per request (delaying proxy)"
    print(f"network: {cap}; {how}; {args.rounds} rounds, median")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")
    print()
    head = f"{'mode':6} {'cold s':>8} {'warm s':>8} {'replay s':>9} {'warm x':>7} {'replay x':>9} {'share':>6}"
    print(f"{head} {'GETs cold/warm/replay':>22}  record")
    for mode, r in results.items():
        med = {c: statistics.median(r["times"][c]) for c in CASES}
        gets = "/".join(f"{statistics.median(r['gets'][c]):.0f}" for c in CASES)
        warm_x, replay_x = med["cold"] / med["warm mount"], med["cold"] / med["replay"]
        share = replay_x / warm_x
        rec = r.get("record") or {}
        what = f"{rec.get('files')} files, {rec.get('bytes', 0) / 1e6:.1f} MB, {rec.get('method')}"
        print(
            f"{mode:6} {med['cold']:8.2f} {med['warm mount']:8.2f} {med['replay']:9.2f} {warm_x:6.2f}x "
            f"{replay_x:8.2f}x {share:6.0%} {gets:>22}  {what}"
        )
        for case in CASES:
            print(f"{'':6}   {case:11} runs: {' '.join(f'{t:.2f}' for t in r['times'][case])}")
        sent = "/".join(f"{statistics.median(r['mb'][c]):.0f}" for c in CASES)
        kept = f"{statistics.median(r['cached_mb']):.0f} MB" if r["cached_mb"] else "-"
        print(f"{'':6}   MB the bucket sent cold/warm/replay: {sent}; rclone's cache after the replay start: {kept}")
        ncpu = os.cpu_count() or 1
        for case in CASES:
            cpu = {k: statistics.median(x[k] for x in r["cpu"][case]) for k in CpuClock.PARTS}
            parts = ", ".join(f"{k} {cpu[k]:.2f}" for k in CpuClock.PARTS[1:])
            print(
                f"{'':6}   CPU-s {case:11}: machine {cpu['machine']:.2f} ({parts}); "
                f"{ncpu} cores busy for at least {cpu['machine'] / ncpu:.2f} s"
            )
        for i, line in enumerate(r["lines"]):
            print(f"{'':6}   replay start {i + 1}: {line}")
    print("share: replay speed-up / warm-mount speed-up (issue 28's goal on rclone full: >= 80 %)")
    print("CPU-s: medians; a run cannot take less than the machine's CPU-s over its cores")


def main() -> int:
    ap = argparse.ArgumentParser(description="replay into a loader's own cache: rclone full and off side by side")
    ap.add_argument("--payload", choices=("synth", "venv"), default="synth")
    ap.add_argument("--modules", type=int, default=400)
    ap.add_argument("--module-kb", type=int, default=24)
    ap.add_argument("--program", default=None, help="default: 'import synth' (synth) or 'import torch' (venv)")
    ap.add_argument("--packages", nargs="+", default=bh.PACKAGES)
    ap.add_argument("--delay-ms", type=float, default=4.0)
    ap.add_argument("--bwlimit", default="50M", help="rclone --bwlimit (bytes/s; 50M is 400 mbit); '' for none")
    ap.add_argument("--rate-mbit", type=float, default=0.0, help="also cap the S3 server's egress (tbf, netns)")
    ap.add_argument("--queue-ms", type=float, default=400.0, help="with --rate-mbit: tbf's queue (its latency)")
    ap.add_argument(
        "--direct", action="store_true", help="with --rate-mbit and --delay-ms 0: no proxy (bytes at the link)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--foreground-s", type=float, default=600.0, help="[image] foreground_s: the replay before exec")
    ap.add_argument("--timeline", action="store_true", help="print each cold and replay run's timeline")
    ap.add_argument("--trace-stage", action="store_true", help="with --timeline: mark the stage's parts on it")
    ap.add_argument("--modes", default=",".join(MODES), help="rclone cache modes to measure, of: full,off")
    args = ap.parse_args()
    if args.direct and not (args.rate_mbit and args.delay_ms == 0):
        raise SystemExit("--direct: only with --rate-mbit and --delay-ms 0 (the proxy is what delays requests)")
    if not set(args.modes.split(",")) <= set(MODES):
        raise SystemExit(f"--modes: {args.modes!r} is not a list of {', '.join(MODES)}")
    if os.geteuid() != 0:
        raise SystemExit("needs root (drop_caches, FUSE, fanotify)")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))
    WORK.mkdir(parents=True, exist_ok=True)
    if args.payload == "synth":
        args.program = args.program or "import synth"
        tree = make_synth(WORK, args.modules, args.module_kb)
    else:
        args.program = args.program or "import torch"
        name = "venv" if args.packages == bh.PACKAGES else "venv-" + "-".join(p.split("=")[0] for p in args.packages)
        tree = bh.ensure_venv(bh.WORK / name, args.packages, args.program)
    stack: list[Any] = []
    results: dict[str, dict[str, Any]] = {}
    try:
        server = bh.capped_server(WORK / "s3", str(tree.parent), args.rate_mbit, stack, args.queue_ms)
        if args.direct:
            lab = next(x.lab for x in stack if isinstance(x, bh._LabStop))
            proxy: Any = LinkCount(str(lab._root_link), server.endpoint)
        else:
            proxy = DelayProxy((server.host, server.port), delay_ms=args.delay_ms).start()
            stack.append(proxy)
        for mode in args.modes.split(","):
            results[mode] = measure_mode(mode, tree, proxy, server, args)
    finally:
        for thing in reversed(stack):
            thing.stop()
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
