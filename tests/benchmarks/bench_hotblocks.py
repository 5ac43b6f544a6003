"""Benchmark: a cold start of an import-heavy program from a lazily loaded tree, with and without replay.

The tree is a venv (torch CPU, numpy, pandas, scipy) served through `tests/support/lazyfs.py`: each
1 MiB chunk is fetched on its first read after a fixed delay (the round trip to a registry that
stargz, SOCI or nydus pay), as netem is not available on this kernel. Before every run the page
cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`) and the lazy filesystem is restarted, so
both the kernel's cache and the chunk cache are cold. Cases, side by side, interleaved per round:

  no replay          the program alone (no bootseer at all)
  replay foreground  `bootseer exec` replays the record fully, then execs the program
  replay concurrent  `bootseer exec` with foreground_s = 0: the agent replays while the program runs
  stale record       every recorded file's mtime changed: replay checks and skips all of it
                     (record = "never", so the cost measured is the replay path's, not a new recording)
  … and the same program from the venv on the local disk: no replay vs replay foreground.

    python tests/benchmarks/bench_hotblocks.py [--delay-ms 10] [--rounds 3] [--program "import torch"]

Needs root (drop_caches, FUSE). Cleans up its mount and processes however it ends.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.lazyfs import LazyMount  # noqa: E402

WORK = Path("/var/tmp/bootseer-bench")
PACKAGES = ["torch==2.13.0", "numpy", "pandas", "scipy"]


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def ensure_venv(venv: Path) -> None:
    if (venv / "bin" / "python").exists():
        ok = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch, pandas, scipy"], capture_output=True)
        if ok.returncode == 0:
            return
    print(f"building {venv} ({' '.join(PACKAGES)}) …", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    sh([sys.executable, "-m", "venv", str(venv)])
    sh([str(venv / "bin" / "pip"), "install", "-q", *PACKAGES])


def bootseer_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["XDG_CACHE_HOME"] = str(home)
    return env


def write_cfg(path: Path, roots: list[Path], **image: object) -> Path:
    lines = ["[image]", f"roots = {json.dumps([str(r) for r in roots])}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in image.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and the children it waited for)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err.decode(errors='replace')[-2000:]}")
    return dt, usage.ru_utime + usage.ru_stime


def wait_agents(home: Path, timeout: float = 60) -> None:
    """Let the previous run's agent finish, so it does not overlap the next measurement."""
    runs = home / "bootseer" / "runs"
    deadline = time.time() + timeout
    while time.time() < deadline and runs.exists() and any(runs.glob("*/agent.pid")):
        time.sleep(0.2)


def set_mtimes(files: dict[str, tuple[int, int]], source: Path, mnt: Path, shift_ns: int) -> None:
    for path, (_size, mtime_ns) in files.items():
        real = source / Path(path).relative_to(mnt)
        os.utime(real, ns=(mtime_ns + shift_ns, mtime_ns + shift_ns))


def main() -> int:
    ap = argparse.ArgumentParser(description="hot-block replay on a lazily loaded tree")
    ap.add_argument("--delay-ms", type=float, default=10.0)
    ap.add_argument("--mbps", type=float, default=0.0, help="lazy fs per-fetch bandwidth (0: delay only)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--program", default="import torch")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--skip-local", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (drop_caches, FUSE)")
    # SIGTERM/SIGHUP unwind like Ctrl-C, so the finally below unmounts the lazy tree
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))

    WORK.mkdir(parents=True, exist_ok=True)
    venv = WORK / "venv"
    ensure_venv(venv)
    mnt = WORK / "mnt"
    lazy = LazyMount(venv, mnt, delay_ms=args.delay_ms, mbps=args.mbps)
    atexit.register(lazy.stop)
    home_lazy, home_local = WORK / "home-lazy", WORK / "home-local"
    for h in (home_lazy, home_local):
        shutil.rmtree(h, ignore_errors=True)
        h.mkdir()
    bs = [sys.executable, "-m", "bootseer_cli"]
    prog_lazy = [str(mnt / "bin" / "python"), "-c", args.program]
    prog_local = [str(venv / "bin" / "python"), "-c", args.program]
    common = {"prefetch_threads": args.threads, "record": "never"}
    cfg_fg = write_cfg(WORK / "fg.toml", [mnt], foreground_s=600.0, **common)
    cfg_bg = write_cfg(WORK / "bg.toml", [mnt], foreground_s=0.0, **common)
    cfg_local = write_cfg(WORK / "local.toml", [venv], foreground_s=600.0, **common)
    env_lazy, env_local = bootseer_env(home_lazy), bootseer_env(home_local)

    try:
        # the record: one cold start of the program, through the lazy tree (and one on local disk)
        lazy.start()
        drop_caches()
        sh([*bs, "hot", "record", "--root", str(mnt), "--ready", "quiet", "--", *prog_lazy], env=env_lazy, cwd=WORK)
        show = json.loads(sh([*bs, "hot", "show", "--json", "-c", str(cfg_fg)], env=env_lazy, cwd=WORK).stdout)
        record_fetches = len(lazy.fetches())
        if not show.get("record"):  # e.g. another process dropped the page cache before the scan
            raise SystemExit("the recording start left nothing resident to record; run the benchmark again")
        if not args.skip_local:
            drop_caches()
            sh(
                [*bs, "hot", "record", "--root", str(venv), "--ready", "quiet", "--", *prog_local],
                env=env_local,
                cwd=WORK,
            )
        from bootseer_cli.hotblocks.record import from_parquet

        blob = next((home_lazy / "bootseer" / "blobs").rglob(show["record"]))
        files = from_parquet(blob.read_bytes()).files

        order = ["lazy: no replay", "lazy: replay foreground", "lazy: replay concurrent", "lazy: stale record"]
        order += [] if args.skip_local else ["local: no replay", "local: replay foreground"]
        cases: dict[str, list[float]] = {name: [] for name in order}
        cpu: dict[str, list[float]] = {name: [] for name in order}

        def note(name: str, wall_cpu: tuple[float, float]) -> None:
            cases.setdefault(name, []).append(wall_cpu[0])
            cpu.setdefault(name, []).append(wall_cpu[1])

        fetches: dict[str, list[int]] = {}

        def lazy_case(name: str, cmd: list[str], env: dict[str, str], stale: bool = False) -> None:
            lazy.restart()
            if stale:
                set_mtimes(files, venv, mnt, 10**9)
            try:
                drop_caches()
                note(name, timed(cmd, env, WORK))
                fetches.setdefault(name, []).append(len(lazy.fetches()))
            finally:
                if stale:
                    set_mtimes(files, venv, mnt, 0)
            wait_agents(home_lazy)

        exec_fg = [*bs, "exec", "-q", "-c", str(cfg_fg), "--", *prog_lazy]
        exec_bg = [*bs, "exec", "-q", "-c", str(cfg_bg), "--", *prog_lazy]
        exec_local = [*bs, "exec", "-q", "-c", str(cfg_local), "--", *prog_local]

        def local_case(name: str, cmd: list[str]) -> None:
            lazy.stop()
            drop_caches()
            note(name, timed(cmd, env_local, WORK))
            wait_agents(home_local)

        steps = [
            lambda: lazy_case("lazy: no replay", prog_lazy, env_lazy),
            lambda: lazy_case("lazy: replay foreground", exec_fg, env_lazy),
            lambda: lazy_case("lazy: replay concurrent", exec_bg, env_lazy),
            lambda: lazy_case("lazy: stale record", exec_fg, env_lazy, stale=True),
        ]
        if not args.skip_local:
            steps += [
                lambda: local_case("local: no replay", prog_local),
                lambda: local_case("local: replay foreground", exec_local),
            ]
        for rnd in range(args.rounds):
            # a different order each round, so a drift in the machine's load does not favour one case
            for step in steps[rnd % len(steps) :] + steps[: rnd % len(steps)]:
                step()
            print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    finally:
        lazy.stop()

    print()
    print(f"program: python -c {args.program!r} from a venv ({' '.join(PACKAGES)})")
    print(
        f"lazy tree: 1 MiB chunks, {args.delay_ms:g} ms per first fetch, "
        f"bandwidth {'unlimited (local disk behind)' if not args.mbps else f'{args.mbps:g} MB/s per fetch'}; "
        f"caches dropped and lazy fs restarted before every run; {args.rounds} rounds, median"
    )
    print(
        f"record: {show['files']} files, {show['extents']} extents, {show['bytes'] / 1e6:.0f} MB "
        f"({show['share_of_roots']:.1%} of {show['roots_bytes'] / 1e6:.0f} MB); the recorded start fetched "
        f"{record_fetches} chunks; replay threads {args.threads}"
    )
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    print()
    base = {"lazy": statistics.median(cases["lazy: no replay"])}
    if "local: no replay" in cases:
        base["local"] = statistics.median(cases["local: no replay"])
    print(f"{'case':26} {'median s':>9} {'runs (s)':>22} {'vs no replay':>14} {'CPU s':>6} {'chunks':>7}")
    for name, times in cases.items():
        med = statistics.median(times)
        ref = base[name.split(":")[0]]
        speed = f"{ref / med:.2f}x faster" if med <= ref else f"{(med / ref - 1) * 100:.1f}% slower"
        runs = " ".join(f"{t:.2f}" for t in times)
        chunks = f"{statistics.median(fetches[name]):.0f}" if name in fetches else "-"
        print(f"{name:26} {med:9.2f} {runs:>22} {speed:>14} {statistics.median(cpu[name]):6.2f} {chunks:>7}")
    print("CPU s: user+sys of the launched process (bootseer exec and the program it became), median;")
    print("the agent and the lazy filesystem server are not included")
    return 0


if __name__ == "__main__":
    sys.exit(main())
