"""Benchmark: a hot-block record taken on a busy node against one taken on a quiet node, side by side.

Issue 44's figure: with another process opening 100,000 files on the same mount during the start, the
record is published and holds >= 95 % of the files a quiet recording holds. Each round records the
same start twice through `bootseer exec` (`[image] record = "always"`, its own store each time): once
alone, once while a neighbour (not a descendant of the launcher) opens distinct files on the roots'
mount as fast as it can, from before exec until the record is published. The start is `import torch`
(and numpy) from the test environment, with its site-packages and the interpreter's stdlib as roots;
the neighbour's files are under a root too, so only the launcher filter keeps them out.

    python tests/benchmarks/bench_hot_busy.py [--rounds 3] [--files 100000] [--program "import torch"]

Needs root (fanotify). Prints the files of each record, the neighbour's opens during the start, the
coverage each record states, and the share of the quiet record's files the busy one holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

BS = [sys.executable, "-m", "bootseer_cli"]

NEIGHBOUR = """
import os, sys, time
d, n, stop, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
names = [os.path.join(d, str(i)) for i in range(n)]
opens = 0
while not os.path.exists(stop):
    for p in names:  # distinct files: fanotify merges repeated opens of one file into one event
        os.close(os.open(p, os.O_RDONLY))
        opens += 1
        if opens % 2000 == 0:
            with open(count + ".tmp", "w") as f:
                f.write(str(opens))
            os.replace(count + ".tmp", count)
"""


def _config(path: Path, roots: list[str]) -> Path:
    path.write_text(
        f'[image]\nroots = [{", ".join(json.dumps(r) for r in roots)}]\nrecord = "always"\nready = "call"\n'
    )
    return path


def _record(work: Path, name: str, roots: list[str], program: str, count: Path | None = None) -> dict:
    """One recording start through `bootseer exec`, in its own store; the record as `hot show --json` says,
    and the neighbour's opens (its `count` file) from before exec to the launcher's end."""
    home = work / name
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    cfg = _config(home / "bootseer.toml", roots)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")} | {
        "XDG_CACHE_HOME": str(home / "cache")
    }
    prog = f"{program}\nimport bootseer_cli\nbootseer_cli.ready()\n"
    before = int(count.read_text() or 0) if count else 0
    t0 = time.monotonic()
    r = subprocess.run([*BS, "exec", "-c", str(cfg), "--", sys.executable, "-c", prog], env=env, capture_output=True)
    start_s = time.monotonic() - t0
    opens = int(count.read_text() or 0) - before if count else 0
    if r.returncode != 0:
        raise SystemExit(f"{name}: exec failed: {r.stderr.decode()[-2000:]}")
    deadline = time.time() + 300
    while not list((home / "cache").rglob("refs/hot/*.json")):
        if time.time() > deadline:
            logs = "".join(p.read_text() for p in (home / "cache").rglob("agent.log"))
            raise SystemExit(f"{name}: no record published:\n{logs[-3000:]}")
        time.sleep(0.2)
    shown = subprocess.run([*BS, "hot", "show", "--json", "-c", str(cfg)], env=env, capture_output=True, text=True)
    doc = json.loads(shown.stdout)
    from bootseer_cli.hotblocks.record import from_parquet

    blob = next((home / "cache").rglob(f"{doc['record']}*"), None)
    files = set(from_parquet(blob.read_bytes()).files) if blob is not None and blob.is_file() else set()
    return {
        "files": files,
        "count": doc["files"],
        "coverage": doc.get("coverage", "full"),
        "start_s": start_s,
        "opens": opens,
    }


def _busy(work: Path, neighbour_dir: Path, n: int, roots: list[str], program: str) -> tuple[dict, int]:
    """The same recording while the neighbour opens files; (record, the neighbour's opens meanwhile)."""
    stop, count = work / "stop", work / "count"
    stop.unlink(missing_ok=True)
    count.unlink(missing_ok=True)
    nb = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(neighbour_dir), str(n), str(stop), str(count)])
    try:
        while not count.exists():  # up to speed before exec
            time.sleep(0.05)
        rec = _record(work, "busy", roots, program, count)
    finally:
        stop.touch()
        nb.wait(timeout=120)
    return rec, rec["opens"]


def main() -> int:
    ap = argparse.ArgumentParser(description="hot-block record on a busy node vs a quiet one")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files", type=int, default=100_000, help="distinct files the neighbour opens, per pass")
    ap.add_argument("--program", default="import torch, numpy")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (fanotify)")
    work = Path(tempfile.mkdtemp(prefix="bootseer-hot-busy-", dir="/var/tmp"))
    neighbour_dir = work / "neighbour"
    neighbour_dir.mkdir()
    for i in range(args.files):
        (neighbour_dir / str(i)).touch()
    roots = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"], str(neighbour_dir)]
    print(f"roots: {roots}; program: {args.program!r}; load: {os.getloadavg()}", flush=True)
    shares: list[float] = []
    try:
        for i in range(args.rounds):
            quiet = _record(work, "quiet", roots, args.program)
            busy, opens = _busy(work, neighbour_dir, args.files, roots, args.program)
            kept = len(busy["files"] & quiet["files"]) / len(quiet["files"]) if quiet["files"] else 0.0
            theirs = sum(1 for p in busy["files"] if p.startswith(str(neighbour_dir)))
            shares.append(kept)
            print(
                f"round {i + 1}: quiet {quiet['count']} files ({quiet['coverage']}, exec {quiet['start_s']:.1f} s); "
                f"busy {busy['count']} files ({busy['coverage']}, exec {busy['start_s']:.1f} s) with {opens} "
                f"opens by the neighbour meanwhile, {theirs} of its files recorded; "
                f"busy holds {kept:.1%} of the quiet record's files",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"median share: {statistics.median(shares):.1%} (>= 95 % asked); load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
