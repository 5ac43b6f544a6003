"""Benchmark: striped checkpoints read at the aggregate bandwidth of several storage servers.

    python tests/benchmarks/bench_stripe.py [--size-mib 1024] [--rate-mbit 400] [--servers 4]

Four `rclone serve s3` servers, each in its own network namespace with its egress capped by `tc tbf`
(tests/support/netns.py; the client runs in the root namespace, attached to the same bridge), and a
`torch.save` checkpoint of --size-mib. Side by side, in one run:

  single stream   the checkpoint as one object on one server, read by one stream (the baseline the
                  paper calls plain HDFS-FUSE: one client, one server): `curl` with one GET (the
                  ratios are against this), and bootseer's own `fetch_blob` (pyarrow, verified)
  ckpt pull       `bootseer ckpt pull` of the checkpoint pushed as 4 stripes over the 4 servers
  mount: cat      sequential `cat` through `bootseer ckpt mount`
  mount: torch    `torch.load` through a fresh `bootseer ckpt mount`

and then, uncapped on loopback (4 servers on 127.0.0.1), `ckpt pull` against `cat` through the mount.
Throughput is the checkpoint's bytes over the transfer time (measured inside the process: the
transfer, without interpreter start-up); the whole-process wall time is reported beside it.

`--against OLD_SRC --reps N` runs every row with this checkout's `src` and with OLD_SRC in turn, N
rounds, and prints each row's median transfer time and the pull's CPU seconds for both, and their
ratio (a change to the read path, measured side by side).

Everything it creates (namespaces, servers, mounts, files) is removed however it ends.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.netns import Lab, available  # noqa: E402

ACCESS, SECRET = "bench-access", "bench-secret-key"
ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS,
    "AWS_SECRET_ACCESS_KEY": SECRET,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
}
BUCKET = "bench"
PROCS: list[subprocess.Popen] = []
MOUNTS: list[str] = []


def cleanup() -> None:
    for mp in MOUNTS:
        subprocess.run(["fusermount3", "-u", mp], capture_output=True)
        subprocess.run(["umount", "-l", mp], capture_output=True)
    MOUNTS.clear()
    for p in PROCS:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    PROCS.clear()


def start_server(data: Path, ip: str, port: int, netns: str | None) -> str:
    """`rclone serve s3` on ip:port (inside `netns` if given); returns the endpoint."""
    (data / BUCKET).mkdir(parents=True, exist_ok=True)
    argv = [shutil.which("rclone") or "rclone", "serve", "s3", "--addr", f"{ip}:{port}"]
    argv += ["--auth-key", f"{ACCESS},{SECRET}", "--config", "/dev/null", str(data)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    log = open(data.parent / f"rclone-{ip}-{port}.log", "wb")  # noqa: SIM115 - lives with the process
    PROCS.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.time() + 20
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=0.5):
            return f"{ip}:{port}"
        time.sleep(0.1)
    raise RuntimeError(f"rclone did not listen on {ip}:{port}")


def uri(endpoint: str, prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


def make_checkpoint(d: Path, size_mib: int) -> int:
    import torch

    d.mkdir(parents=True)
    n = size_mib // 64
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(4096, 4096, generator=g) for i in range(n)}  # 64 MiB each
    torch.save(state, d / "model.pt")
    return (d / "model.pt").stat().st_size


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run a command; (whole-process seconds, stdout)."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **ENV, **(env or {})})
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}…: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return took, r.stdout


PY = sys.executable
SINGLE = """
import sys, time
from pathlib import Path
from bootseer_cli.store.core import Store
t = time.perf_counter()
n = Store(sys.argv[1]).fetch_blob(sys.argv[2], Path(sys.argv[3]))
print(n, time.perf_counter() - t)
"""
TIMED_PULL = """
import sys, time
from pathlib import Path
from bootseer_cli.store.core import Store
from bootseer_cli.stripe.catalog import Targets, load_manifest
from bootseer_cli.stripe.pull import pull
st = Store(sys.argv[1])
m = load_manifest(st, sys.argv[2])
t, c = time.perf_counter(), time.process_time()
r = pull(m, Targets(st, sys.argv[4].split(",")), Path(sys.argv[3]))  # the targets are configured, as a user's
print(r.bytes, time.perf_counter() - t, time.process_time() - c)
"""
TORCH_LOAD = """
import sys, time
t = time.perf_counter()
import torch
t1 = time.perf_counter()
sd = torch.load(sys.argv[1], weights_only=True, mmap=False)
n = sum(v.numel() * v.element_size() for v in sd.values())
print(n, time.perf_counter() - t1)
"""


def drop_caches() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3")


def measure(
    work: Path, main_uri: str, targets: list[str], single: tuple[str, str, str] | None, size: int, src: str
) -> dict:
    """One scenario with bootseer from `src`: rows of (label, transfer s, whole-process s)."""
    rows = {}
    env = {"BOOTSEER_STORE": main_uri, "BOOTSEER_CHECKPOINT_TARGETS": ",".join(targets), "PYTHONPATH": src}
    if single:
        drop_caches()
        # One GET over one connection (curl, SigV4): the plain single-stream baseline.
        whole, out = run(
            [
                "curl",
                "-sS",
                "-f",
                "--aws-sigv4",
                "aws:amz:us-east-1:s3",
                "--user",
                f"{ACCESS}:{SECRET}",
                "-o",
                str(work / "single.bin"),
                "-w",
                "%{time_total}",
                single[2],
            ]
        )
        rows["single stream (curl, one GET)"] = (float(out), whole)
        (work / "single.bin").unlink()
        drop_caches()
        whole, out = run([PY, "-c", SINGLE, single[0], single[1], str(work / "single.bin")], env)
        rows["single stream (bootseer fetch_blob)"] = (float(out.split()[1]), whole)
        (work / "single.bin").unlink()
    drop_caches()
    whole, out = run([PY, "-c", TIMED_PULL, main_uri, "ck", str(work / "pulled"), ",".join(targets)], env)
    rows["ckpt pull (4 stripes)"] = (float(out.split()[1]), whole)
    rows["  its CPU seconds"] = (None, float(out.split()[2]))
    whole_cli, _ = run([PY, "-m", "bootseer_cli", "ckpt", "pull", "ck", str(work / "pulled-cli")], env)
    rows["  `bootseer ckpt pull` process"] = (None, whole_cli)
    shutil.rmtree(work / "pulled", ignore_errors=True)
    shutil.rmtree(work / "pulled-cli", ignore_errors=True)
    for pulled in work.glob(".pulled*"):
        pulled.unlink()
    for label in ("mount: cat", "mount: torch.load"):
        mp = str(work / "mnt")
        drop_caches()
        t_mount, _ = run([PY, "-m", "bootseer_cli", "ckpt", "mount", "ck", mp], env)
        MOUNTS.append(mp)
        try:
            if label == "mount: cat":
                t0 = time.perf_counter()
                subprocess.run(["cat", f"{mp}/model.pt"], stdout=subprocess.DEVNULL, check=True)
                took = time.perf_counter() - t0
                rows[label] = (took, took + t_mount)
            else:
                whole, out = run([PY, "-c", TORCH_LOAD, f"{mp}/model.pt"])
                rows[label] = (float(out.split()[1]), whole + t_mount)
        finally:
            run([PY, "-m", "bootseer_cli", "ckpt", "umount", mp], env)
            MOUNTS.remove(mp)
    return rows


def measure_all(work: Path, main_uri: str, targets: list[str], single: tuple | None, size: int, srcs: dict, reps: int):
    """Each rep measures every src in turn (the order alternating): {src name: [rows per rep]}."""
    runs: dict[str, list[dict]] = {name: [] for name in srcs}
    for rep in range(reps):
        names = list(srcs) if rep % 2 == 0 else list(reversed(srcs))
        for name in names:
            runs[name].append(measure(work, main_uri, targets, single, size, srcs[name]))
    return runs


def medians(runs: list[dict]) -> dict:
    """Each row's (transfer s, whole-process s) as the median over the rounds."""
    import statistics

    def median(label: str, i: int) -> float | None:
        return None if runs[0][label][i] is None else statistics.median(r[label][i] for r in runs)

    return {label: (median(label, 0), median(label, 1)) for label in runs[0]}


def compare(title: str, runs: dict[str, list[dict]]) -> list[str]:
    """this / other per row, of the medians (transfer time; the whole process where there is none)."""
    this, other = medians(runs["this"]), medians(runs["other"])
    lines = [f"\n{title}: this / other, medians of {len(runs['this'])} interleaved rounds"]
    for label, (t, whole) in this.items():
        ot, ow = other[label]
        a, b = (t, ot) if t is not None else (whole, ow)
        lines.append(f"{label:32} {a:>8.2f} {b:>8.2f} {a / b:>7.3f}")
    return lines


def table(title: str, rows: dict, size: int, base: str | None) -> list[str]:
    lines = [f"\n{title}", f"{'':32} {'transfer':>10} {'MiB/s':>8} {'ratio':>7} {'whole process':>14}"]
    base_rate = size / rows[base][0] if base else None
    for label, (t, whole) in rows.items():
        if t is None:
            lines.append(f"{label:32} {'':>10} {'':>8} {'':>7} {whole:>12.2f} s")
            continue
        rate = size / t
        ratio = f"{rate / base_rate:.2f}x" if base_rate else ""
        lines.append(f"{label:32} {t:>8.2f} s {rate / 2**20:>8.0f} {ratio:>7} {whole:>12.2f} s")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rate-mbit", type=float, default=400)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--cell-size", default="1MiB")
    ap.add_argument("--skip-uncapped", action="store_true")
    ap.add_argument("--against", help="another checkout's src/ directory, measured in the same rounds")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    srcs = {"this": str(ROOT / "src")}
    if args.against:
        srcs["other"] = str(Path(args.against).resolve())
    if not available():
        print("needs root with iproute2 and tc", file=sys.stderr)
        return 2
    os.environ.update(ENV)
    work = Path(tempfile.mkdtemp(prefix="bootseer-bench-stripe-"))
    lab = Lab("bsck", subnet="10.201.44")  # its own subnet: other benchmarks may run a lab at the same time
    atexit.register(lambda: shutil.rmtree(work, ignore_errors=True))
    atexit.register(cleanup)  # atexit runs last-registered first: unmount and kill before removing files
    out: list[str] = []
    try:
        from bootseer_cli.store.core import Store, blob_path
        from bootseer_cli.stripe.push import push

        size = make_checkpoint(work / "ckpt", args.size_mib)
        hosts = [lab.add_host(rate_mbit=args.rate_mbit) for _ in range(args.servers)]
        lab.attach_root()
        eps = [start_server(work / f"srv{i}" / "data", h.ip, 9000, h.name) for i, h in enumerate(hosts)]
        main_uri, targets = uri(eps[0], "main"), [uri(e, "stripes") for e in eps]
        t0 = time.time()
        digest = Store(uri(eps[0], "single")).put_blob_file(work / "ckpt" / "model.pt")
        push(Store(main_uri), work / "ckpt", "ck", "v1", stripes=args.servers, targets=[Store(t) for t in targets])
        print(f"setup: {size / 2**20:.0f} MiB checkpoint pushed in {time.time() - t0:.1f} s", file=sys.stderr)
        url = f"http://{eps[0]}/{BUCKET}/single/{blob_path(digest)}"
        single = (uri(eps[0], "single"), digest, url)
        runs = measure_all(work, main_uri, targets, single, size, srcs, args.reps)
        rows = medians(runs["this"])
        title = (
            f"{args.servers} S3 servers, each capped at {args.rate_mbit:g} mbit (tc tbf, own netns); "
            f"{size / 2**20:.0f} MiB torch.save checkpoint, {args.servers} stripes"
        )
        out += table(title, rows, size, "single stream (curl, one GET)")
        if args.against:
            out += compare("capped", runs)
        if not args.skip_uncapped:
            eps2 = [start_server(work / f"lo{i}" / "data", "127.0.0.1", _free_port(), None) for i in range(4)]
            main2, targets2 = uri(eps2[0], "main"), [uri(e, "stripes") for e in eps2]
            push(Store(main2), work / "ckpt", "ck", "v1", stripes=4, targets=[Store(t) for t in targets2])
            runs2 = measure_all(work, main2, targets2, None, size, srcs, args.reps)
            out += table("uncapped, 4 servers on loopback", medians(runs2["this"]), size, "ckpt pull (4 stripes)")
            if args.against:
                out += compare("uncapped", runs2)
        print("\n".join(out))
        print(json.dumps({"rows": {k: v for k, v in rows.items()}, "size": size}), file=sys.stderr)
    finally:
        cleanup()
        lab.destroy()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
