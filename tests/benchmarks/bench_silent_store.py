"""How long `bootseer exec` holds a job back when its S3 store never answers: this checkout against
another, side by side in one run.

The store is a loopback endpoint that is silent one of two ways (`tests/support/silentendpoint.py`):
"hung" takes the connection and never sends a byte (a hung proxy or load balancer), "drops-syn" never
completes it (a firewall that drops packets). Each start runs the env stage (`setup = true`) and the
image stage (a one-file tree) against it, with a fresh node cache, and the job is `true`. "stalls-blob"
is a real S3 server behind a proxy (`StallingProxy`): a first node publishes a 2 MB env snapshot
(untimed); then the proxy passes only the first 64 kB of each response, and a second node with a fresh
cache and an empty env tree starts (timed): the store answers the ref and stops sending the blob.
"stalls-swarm" is the same store under `bootseer p2p fetch` of a 24 MiB blob on one node (the swarm's
origin): it fails, and the time is until the command has ended. "stalls-ckpt" is the same store under
a start whose checkpoint stage pulls (`[checkpoint] mode = "pull"`) an 8 MiB checkpoint in two stripes
of 1 MiB cells, pushed before the stall (untimed); the job starts without it. Issue 29's bound on what
a start waits for is `[p2p] deadline_s` + 5 s (35 s by default).

    python tests/benchmarks/bench_silent_store.py [--against OLD_SRC] [--runs 1] \
        [--how hung,drops-syn,stalls-blob,stalls-swarm,stalls-ckpt]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.s3server import S3_ENV, S3Server  # noqa: E402
from tests.support.silentendpoint import SilentEndpoint, StallingProxy  # noqa: E402

TIMEOUT_S = 900.0  # the old code's hung case took 363 s


def _exec(src: str, node: Path, cache: Path) -> tuple[float, str]:
    """`bootseer exec -- true` in `node` with its own node cache: (wall seconds, the summary line)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update(S3_ENV, XDG_CACHE_HOME=str(cache), PYTHONPATH=src)
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"],
        cwd=node,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    took = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit(f"the job did not start:\n{out.stderr}")
    line = next((ln for ln in out.stderr.splitlines() if ln.startswith("bootseer: image ")), "")
    return took, line.removeprefix("bootseer: ")


def start(src: str, how: str, work: Path) -> tuple[float, str]:
    """One start against a silent store: (wall seconds of `bootseer exec -- true`, its summary line)."""
    node = Path(tempfile.mkdtemp(prefix="node-", dir=work))
    (node / "envroot").mkdir()
    (node / "tree").mkdir()
    (node / "tree" / "f.bin").write_bytes(b"x" * 4096)
    image = f'[image]\nroots = ["{node / "tree"}"]\nready = "quiet"\n'
    if how == "stalls-blob":
        return _stalled_blob(src, node, image)
    if how == "stalls-swarm":
        return _stalled_swarm(src, node)
    if how == "stalls-ckpt":
        return _stalled_ckpt(src, node)
    endpoint = SilentEndpoint(how)
    try:
        (node / "bootseer.toml").write_text(
            f'[store]\nuri = "s3://bkt/p?endpoint_override=127.0.0.1:{endpoint.port}&scheme=http"\n'
            f'[env]\nsetup = ["true"]\nroots = ["{node / "envroot"}"]\n' + image
        )
        return _exec(src, node, node / "cache")
    finally:
        endpoint.close()


@contextlib.contextmanager
def _stalling_store(node: Path) -> Iterator[tuple[S3Server, StallingProxy]]:
    """A real S3 server behind a `StallingProxy` (not stalling yet), both stopped on the way out."""
    server = S3Server(node / "s3").start()
    proxy = StallingProxy(("127.0.0.1", server.port))
    try:
        yield server, proxy
    finally:
        proxy.close()
        server.stop()


def _stalled_blob(src: str, node: Path, image: str) -> tuple[float, str]:
    """A first node publishes the env (untimed); the second starts while the store stops sending blobs."""
    with _stalling_store(node) as (server, proxy):
        root = node / "envroot"
        (node / "bootseer.toml").write_text(
            f'[store]\nuri = "s3://{server.bucket}/p?endpoint_override=127.0.0.1:{proxy.port}&scheme=http"\n'
            f'[env]\nsetup = ["head -c 2000000 /dev/urandom > {root}/lib.so"]\nroots = ["{root}"]\n'
            f"[exec]\nagent = false\n" + image
        )
        _exec(src, node, node / "cache-a")
        shutil.rmtree(root)  # a new node: an empty tree
        root.mkdir()
        proxy.stall()
        return _exec(src, node, node / "cache-b")


def _stalled_ckpt(src: str, node: Path) -> tuple[float, str]:
    """A checkpoint pushed (untimed); then a start that pulls it while the store stops sending."""
    from bootseer_cli.store.core import Store
    from bootseer_cli.stripe.push import push

    with _stalling_store(node) as (server, proxy):
        os.environ.update(S3_ENV)
        uri = f"s3://{server.bucket}/p?endpoint_override=127.0.0.1:{proxy.port}&scheme=http"
        (node / "ckpt").mkdir()
        (node / "ckpt" / "model.bin").write_bytes(os.urandom(8 << 20))
        push(Store(uri), node / "ckpt", "job", "t1", stripes=2, cell_size=1 << 20)
        (node / "bootseer.toml").write_text(
            f'[store]\nuri = "{uri}"\n[checkpoint]\nname = "job"\nmountpoint = "{node / "ck"}"\nmode = "pull"\n'
        )
        proxy.stall()
        return _exec(src, node, node / "cache")


def _stalled_swarm(src: str, node: Path) -> tuple[float, str]:
    """`bootseer p2p fetch` of a published blob while the store stops sending: (seconds until the command
    ended, its last line)."""
    from tests.p2p.nodes import node_env, port_range, random_file

    from bootseer_cli.p2p.publish import publish_file
    from bootseer_cli.store.core import Store

    with _stalling_store(node) as (server, proxy):
        os.environ.update(S3_ENV)
        digest, _ = publish_file(Store(server.uri("p")), random_file(node / "blob.bin", 24 << 20))
        proxy.stall()
        env = node_env(node, "n0", server.uri("p").replace(server.endpoint, f"127.0.0.1:{proxy.port}"), port_range())
        env["PYTHONPATH"] = os.pathsep.join([src, str(ROOT)])
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "bootseer_cli", "p2p", "fetch", digest],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        took = time.perf_counter() - t
    lines = out.stderr.strip().splitlines()
    return took, f"exit {out.returncode}: {lines[-1][:150] if lines else ''}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", help="another checkout's src/ directory, in the same rounds")
    how = "how the store is silent: hung, drops-syn, stalls-blob, stalls-swarm, stalls-ckpt"
    ap.add_argument("--how", default="hung,drops-syn", help=how)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    srcs = {"this": str(ROOT / "src")}
    if args.against:
        srcs["other"] = str(Path(args.against).resolve())
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-silent-") as tmp:
        for how in args.how.split(","):
            took: dict[str, list[float]] = {name: [] for name in srcs}
            for _ in range(args.runs):
                for name, src in srcs.items():  # interleaved
                    s, line = start(src, how, Path(tmp))
                    took[name].append(s)
                    print(f"  {how:9} {name:5} {s:7.2f} s  {line}", flush=True)
            med = {name: statistics.median(v) for name, v in took.items()}
            ratio = f"  this/other {med['this'] / med['other']:.3f}" if "other" in med else ""
            print(f"{how:9} " + "  ".join(f"{n} {m:.2f} s" for n, m in med.items()) + ratio, flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
