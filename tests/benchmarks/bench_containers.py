"""The first production start of a container, with and without a CI pre-warm, side by side in one run.

    python tests/benchmarks/bench_containers.py [--json out.json]

Each start is a fresh container of the same image (the test image of tests/support/images.py, pushed
to a loopback registry and pulled by digest), network "host" so that it reaches a loopback package
index and a loopback S3 store (rclone). The job's setup is
`pip install --no-index --find-links http://127.0.0.1:PORT/ -r requirements.txt` with `torch==2.13.0`
(CPU) and its dependencies; the job's command is `python3 -c "import torch"`.

- no bootseer: the container runs the setup, then the command;
- bootseer, cold store: `bootseer exec` runs the setup, captures and publishes, then the command;
- bootseer after `bootseer prewarm`: `bootseer exec` restores the snapshot and replays the hot blocks.

The pre-warm itself runs in CI, before any GPU is allocated; its time is shown for reference.
The machine's pip configuration is cleared inside the containers (they have none) and on the host
(PIP_CONFIG_FILE=/dev/null for the wheel download, which only happens when no wheel cache exists).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import http.server
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support import images  # noqa: E402
from tests.support.s3server import S3_ENV, S3Server  # noqa: E402

from bootseer_cli.containers import engine  # noqa: E402

WHEELS = Path(os.environ.get("BOOTSEER_BENCH_WHEELS", "/tmp/bootseer-bench-e2e/index"))
NEEDED = ["torch==2.13.0"]
PROBE = ["python3", "-c", "import torch; print('torch', torch.__version__)"]


def wheels() -> Path:
    """torch and its dependencies as wheels (reused from the e2e benchmark's cache when there)."""
    if any(WHEELS.glob("torch-*.whl")):
        return WHEELS
    WHEELS.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = "/dev/null"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-d", str(WHEELS), "--find-links", "/opt/wheels", *NEEDED],
        check=True,
        env=env,
    )
    return WHEELS


class Index:
    """The wheel directory over HTTP on loopback (pip --find-links)."""

    def __init__(self, root: Path) -> None:
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

        handler = functools.partial(Quiet, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()


def timed(client, image: str, command: list[str], env: dict[str, str], job: Path) -> tuple[float, str]:
    t0 = time.time()
    res = engine.run_container(
        client,
        image,
        command,
        environment=env,
        binds={str(job): {"bind": "/bootseer/work", "mode": "ro"}},
        network_mode="host",
        working_dir="/bootseer/work",
        name_hint="bench",
    )
    took = time.time() - t0
    if res.exit_code != 0:
        raise RuntimeError(f"{command} failed ({res.exit_code}):\n{res.output[-3000:]}")
    return took, res.output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="Write the figures here too.")
    args = ap.parse_args()

    import docker

    client = docker.from_env(timeout=600)
    tmp = Path(tempfile.mkdtemp(prefix="bootseer-bench-containers-"))
    servers: list = []
    cleanup: list = []

    def finish() -> None:
        for stop in reversed(cleanup):
            with contextlib.suppress(Exception):
                stop()
        for c in client.containers.list(all=True, filters={"label": engine.LABEL}):
            with contextlib.suppress(Exception):
                c.remove(force=True)
        shutil.rmtree(tmp, ignore_errors=True)

    atexit.register(finish)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # atexit runs on a plain kill too
    os.environ.update(S3_ENV)

    print("image: building or reusing the test image, pushing it to a loopback registry …", flush=True)
    registry = images.Registry(tmp / "registry", storage=images.CACHE_DIR / "registry").start()
    cleanup.append(registry.stop)
    image = images.publish(client, registry, images.ensure_app(client, images.ensure_base(client)), "bootseer-test")
    index = Index(wheels())
    cleanup.append(index.stop)
    s3 = S3Server(tmp / "s3").start()
    servers.append(s3)
    cleanup.append(s3.stop)

    job = tmp / "job"
    job.mkdir()
    (job / "requirements.txt").write_text("\n".join(NEEDED) + "\n")
    setup = f"pip install --no-index --find-links {index.url} -r requirements.txt"
    (job / "bootseer.toml").write_text(f'[env]\nsetup = ["{setup}"]\n\n[image]\nenabled = true\n')
    common = {"BOOTSEER_IMAGE": image.pinned, "BOOTSEER_EXEC_AGENT": "0", **S3_ENV}

    rows = []
    t, _ = timed(client, image.pinned, ["sh", "-c", f"{setup} && {shlex.join(PROBE)}"], {}, job)
    rows.append(("no bootseer (setup, then the command)", t))
    exec_probe = ["bootseer", "exec", "--", *PROBE]
    t, out = timed(client, image.pinned, exec_probe, {**common, "BOOTSEER_STORE": s3.uri("cold")}, job)
    rows.append(("bootseer, cold store (setup + capture + publish)", t))
    warm_store = s3.uri("warm")
    t0 = time.time()
    subprocess.run(
        ["bootseer", "prewarm", "--image", image.ref, "-c", str(job / "bootseer.toml"), "--probe", shlex.join(PROBE)],
        check=True,
        env=dict(os.environ, BOOTSEER_STORE=warm_store),
        capture_output=True,
        text=True,
    )
    prewarm_s = time.time() - t0
    t, out = timed(client, image.pinned, exec_probe, {**common, "BOOTSEER_STORE": warm_store}, job)
    rows.append(("bootseer after prewarm (restore + replay)", t))
    summary = next((ln for ln in out.splitlines() if ln.startswith("bootseer: image")), "")

    base = rows[0][1]
    print()
    print(f"{'first start of a fresh container':52} {'seconds':>8} {'vs no bootseer':>15}")
    for name, s in rows:
        print(f"{name:52} {s:8.1f} {base / s:14.1f}×")
    print(f"{'(CI) bootseer prewarm, off the critical path':52} {prewarm_s:8.1f}")
    print(f"\nwarm start: {summary}")
    print(f"setup: {setup}  ({', '.join(NEEDED)} and dependencies); image {image.pinned}; {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(
            json.dumps({"rows": dict(rows), "prewarm_s": prewarm_s, "warm_summary": summary}, indent=2)
        )


if __name__ == "__main__":
    main()
