"""A miss whose setup changes little (a small layer's capture): the whole `bootseer exec -- true`,
this checkout against another, interleaved in one run.

The capture of such a setup writes its blob in a few tens of ms; until session 16 it then waited
for the look outside the roots (a warning only), which spent its whole budget share walking the
base interpreter's site-packages when that is large (0.27 s here), though nothing was installed
there. Each start gets a fresh venv (`python -m venv --without-pip`, copied per start), a fresh
node cache and a fresh file:// store; its setup writes `--files` small modules into the venv. With
the agent (the default) the start captures, stamps and hands the upload over; `--agent false`
publishes inside the start. Between starts the agent's upload is waited for, so it never loads the
next start.

    python tests/benchmarks/bench_small_miss.py --against OLD_SRC [--runs 10] [--files 100] [--agent false]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compile import wait_agent

SETUP = """import pathlib, sys
site = pathlib.Path(sys.argv[1])
for i in range(int(sys.argv[2])):
    (site / f"small_mod_{i}.py").write_text(f"X = {i}\\n" * 20)
"""


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def start(work: Path, template: Path, src: str, files: int, agent: bool) -> tuple[float, str]:
    """One miss on a fresh node: (wall seconds of `bootseer exec -- true`, its env summary line)."""
    node = Path(tempfile.mkdtemp(prefix="node-", dir=work))
    venv = node / "venv"
    subprocess.run(["cp", "-a", str(template), str(venv)], check=True)
    (node / "setup.py").write_text(SETUP)
    setup = f"{sys.executable} {node / 'setup.py'} {_site(venv)} {files}"
    (node / "bootseer.toml").write_text(
        f'[store]\nuri = "{(node / "store").as_uri()}"\n[exec]\nagent = {json.dumps(agent)}\n'
        f'[env]\nroots = ["{venv}"]\nsetup = {json.dumps([setup])}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["XDG_CACHE_HOME"] = str(node / "cache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "exec", "--", "true"], cwd=node, env=env, capture_output=True, text=True
    )
    took = time.perf_counter() - t
    if out.returncode != 0 or ("captured" not in out.stderr and "published" not in out.stderr):
        sys.exit(f"the start did not capture:\n{out.stderr}")
    if agent:
        wait_agent(node / "cache")
    line = next((m.group(1) for ln in out.stderr.splitlines() if (m := re.search(r"\| (env [^|]*)", ln))), "")
    shutil.rmtree(node, ignore_errors=True)
    return took, line.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="another checkout's src/ directory, in the same rounds")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--files", type=int, default=100, help="small modules the setup writes")
    ap.add_argument("--agent", choices=("true", "false"), default="true", help="[exec] agent")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parents[2] / "src")
    variants = {"this checkout": here, "against": str(Path(args.against).resolve())}
    work = Path(tempfile.mkdtemp(prefix="bench-small-miss-"))
    try:
        template = work / "template"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(template)], check=True)
        print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores; setup writes {args.files} files")
        times: dict[str, list[float]] = {k: [] for k in variants}
        for i in range(args.runs):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for name in order:
                took, line = start(work, template, variants[name], args.files, args.agent == "true")
                times[name].append(took)
                if i == 0:
                    print(f"{name}: {line}")
        a, b = (statistics.median(times[k]) for k in variants)
        for k, v in times.items():
            print(f"{k}: median {statistics.median(v):.3f} s (runs {', '.join(f'{x:.3f}' for x in v)})")
        print(f"this checkout: {a - b:+.3f} s, {a / b:.2f}x the other's time")
        print(f"load average after: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
