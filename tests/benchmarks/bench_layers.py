#!/usr/bin/env python
"""Benchmark: the change cycle (issue 27), side by side in one run.

An env of numpy, pandas, scipy, a source-built C-extension sdist (`bsdemo-cext`) and a pinned pure
package (`bslayer`, wheels written here, 200 modules), plus CPU torch with `--torch` (the wheel from
this machine's disk), served by one loopback index (PIP_CONFIG_FILE=/dev/null, no PIP_*). Then the
change: a patch bump of pandas (3.1.0 -> 3.1.1) and one new small package (six). Measured:

  first start after the change, with layers        (the builder carries the parent env: setup over it,
                                                     capture the layer, publish it)
  the same start with `[env] layers = false`        (the full setup from the image, capture, publish)
  the same start without bootseer                   (pip install -r into a fresh venv)
  bytes published for the change                    (the layer's blob vs the installed size of what changed)
  a fresh node with the parent in its node cache    (restore of the child vs restore of the parent, cached;
                                                     the bytes the child's restore added to the node cache)
  ten successive one-package changes (bslayer 1.1 … 1.10, each built over the last; squashed at
  `max_layers` = 8): the restore of the tenth on a fresh node vs the restore of a full snapshot of the
  same env on a fresh node

Every start is `bootseer exec` with `[exec] agent = false` (the upload is inside the timed start: the
conservative figure). Everything lives under --work and is removed at the end.

    python tests/benchmarks/bench_layers.py [--torch] [--work /tmp/bootseer-bench-layers]

`--profile FILE` measures nothing side by side: it builds the parent and runs the layered first start
after the change under cProfile (FILE: its stats), then prints where bootseer's own seconds went.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.bench_envsnap import TORCH, machine_wheels  # noqa: E402
from tests.envsnap.test_layers import write_wheel  # noqa: E402
from tests.support import pkgindex  # noqa: E402

BASE = ["numpy", "pandas==3.1.0", "scipy", "bsdemo-cext", "bslayer==1.0"]
REPS = 3  # the restore comparisons: medians of interleaved runs
PROFILED = """
import cProfile, os, sys
pr, real = cProfile.Profile(), os.execve
def execve(*a):
    pr.disable(); pr.dump_stats({path!r}); real(*a)
os.execve = execve
sys.argv[0] = "bootseer"
from bootseer_cli.entry import main
pr.enable()
main()
"""
CHANGED = ["numpy", "pandas==3.1.1", "scipy", "bsdemo-cext", "bslayer==1.0", "six==1.17.0"]


def wheels(dest: Path, torch: bool) -> None:
    pkgindex.wheelhouse(dest, ["numpy", "pandas==3.1.0", "pandas==3.1.1", "scipy", "six==1.17.0"])
    pkgindex.wheelhouse(dest, pkgindex.BUILD_WHEELS)
    pkgindex.write_c_sdist(dest)
    for v in range(11):
        files = {f"bslayer/m{i}.py": f"# {v}\n" + "X = 1\n" * 200 for i in range(200)}
        files["bslayer/__init__.py"] = f"VERSION = '1.{v}'\n"
        write_wheel(dest, "bslayer", f"1.{v}", files)
    if torch:
        machine_wheels(dest, TORCH[0])


class Bench:
    def __init__(self, work: Path, index: pkgindex.PackageIndex, torch: bool) -> None:
        self.work = work
        self.venv = work / "venv"
        self.index = index
        self.torch = torch
        self.pip = [sys.executable, "-m", "pip", "--python", str(self.venv / "bin" / "python"), "install"]

    def reqs(self, lines: list[str]) -> None:
        (self.work / "reqs.txt").write_text("\n".join(([TORCH[0]] if self.torch else []) + lines) + "\n")

    def config(self, store: str, layers: bool = True) -> None:
        install = " ".join(self.pip) + " -r reqs.txt"
        (self.work / "bootseer.toml").write_text(
            f'[store]\nuri = "{(self.work / store).as_uri()}"\n[exec]\nagent = false\n'
            f'[env]\nroots = ["{self.venv}"]\nwait_s = 600\nlayers = {"true" if layers else "false"}\n'
            f'setup = ["{install}"]\n'
        )

    def fresh_venv(self) -> None:
        shutil.rmtree(self.venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)

    def env(self, node: str) -> dict[str, str]:
        e = {k: v for k, v in self.index.pip_env().items() if not k.startswith("BOOTSEER_")}
        e["XDG_CACHE_HOME"] = str(self.work / f"{node}-cache")
        return e

    def start(self, node: str, profile: Path | None = None) -> tuple[float, str]:
        """`bootseer exec` of an import check (under cProfile into `profile`); its wall time and stderr."""
        argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", *self.check()]
        if profile:  # exec ends in execve: the stats are written just before it
            argv[1:3] = ["-c", PROFILED.format(path=str(profile))]
        t0 = time.monotonic()
        r = subprocess.run(argv, cwd=self.work, env=self.env(node), capture_output=True, text=True)
        took = time.monotonic() - t0
        if r.returncode != 0:
            raise SystemExit(f"exec failed: {r.stderr[-3000:]}")
        return took, r.stderr

    def check(self) -> list[str]:
        """The program every start runs: the imports that prove the env works."""
        mods = "import numpy, pandas, scipy, bsdemo_cext, bslayer" + (", torch" if self.torch else "")
        return [str(self.venv / "bin" / "python"), "-c", mods]

    def without_bootseer(self, node: str) -> float:
        """`pip install -r` into a fresh venv on `node`, whose pip cache is warm from its own earlier
        setups (the built sdist's wheel included), then the program: the same start without bootseer."""
        self.fresh_venv()
        t0 = time.monotonic()
        subprocess.run([*self.pip, "-q", "-r", "reqs.txt"], cwd=self.work, env=self.env(node), check=True)
        subprocess.run(self.check(), cwd=self.work, env=self.env(node), check=True)
        return time.monotonic() - t0

    def ref(self, store: str) -> dict:
        refs = sorted((self.work / store).rglob("refs/env/*.json"), key=lambda p: p.stat().st_mtime)
        doc = json.loads(refs[-1].read_text())
        return doc.get("doc", doc)

    def cache_bytes(self, node: str) -> int:
        root = self.work / f"{node}-cache"
        return sum(p.stat().st_size for p in root.rglob("sha256/*/*") if p.is_file()) if root.exists() else 0

    def installed(self, names: tuple[str, ...]) -> int:
        """Installed bytes of the site-packages entries whose names start with one of `names`."""
        site = next(self.venv.glob("lib/python*/site-packages"))
        total = 0
        for p in site.iterdir():
            if p.name.lower().startswith(names):
                files = [p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()]
                total += sum(q.stat().st_size for q in files)
        pyc = site / "__pycache__"
        if pyc.is_dir():
            total += sum(q.stat().st_size for q in pyc.iterdir() if q.name.startswith(names))
        return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch", action="store_true", help="CPU torch in the env too (its wheel from this machine)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bootseer-bench-layers"))
    ap.add_argument("--profile", type=Path, help="only profile the layered first start after the change")
    args = ap.parse_args()
    for k in [k for k in os.environ if k.startswith("PIP_")] + ["PYTHONDONTWRITEBYTECODE"]:
        os.environ.pop(k, None)
    os.environ["PIP_CONFIG_FILE"] = os.devnull
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    wheels(work / "wheels", args.torch)
    out: dict[str, float] = {}
    try:
        with pkgindex.PackageIndex(work / "wheels") as index:
            if args.profile:
                profile(Bench(work, index, args.torch), args.profile.resolve(), out)
            else:
                run(Bench(work, index, args.torch), out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: round(v, 3) for k, v in out.items()}, indent=2))


def setup_seconds(stderr: str) -> float:
    """The setup's own seconds, from the env stage's summary (`setup 12.3 s` / `setup over … (layer 1) 3.1 s`)."""
    m = re.search(r"setup(?: over \S+ \(layer \d+\))? ([0-9.]+) s", stderr)
    return float(m.group(1)) if m else -1.0


def profile(b: Bench, path: Path, out: dict[str, float]) -> None:
    """The parent built, then the layered first start after the change under cProfile."""
    import pstats

    b.fresh_venv()
    b.config("store")
    b.reqs(BASE)
    out["base_build_s"], _ = b.start("A")
    b.reqs(CHANGED)
    out["change_layers_profiled_s"], err = b.start("A", profile=path)
    assert "setup over" in err, err
    out["change_layers_setup_only_s"] = setup_seconds(err)
    print(err.splitlines()[-1], file=sys.stderr)
    pstats.Stats(str(path), stream=sys.stderr).sort_stats("cumulative").print_stats(45)


def run(b: Bench, out: dict[str, float]) -> None:
    # the parent: built once on node A, the store copied for the `layers = false` run
    b.fresh_venv()
    b.config("store")
    b.reqs(BASE)
    out["base_build_s"], _ = b.start("A")
    shutil.copytree(b.work / "store", b.work / "store-flat")
    parent = b.ref("store")

    # 1. the first start after the change, three ways
    b.reqs(CHANGED)
    out["change_layers_s"], err = b.start("A")
    assert "setup over" in err, err
    print("the layered first start's log:\n" + err, file=sys.stderr)
    out["change_layers_setup_only_s"] = setup_seconds(err)
    layer = b.ref("store")
    b.fresh_venv()
    b.config("store-flat", layers=False)
    b.reqs(BASE)
    b.start("F")  # node F carries the parent env, as node A did
    b.reqs(CHANGED)
    out["change_layers_false_s"], err = b.start("F")
    assert "setup over" not in err
    out["change_layers_false_setup_only_s"] = setup_seconds(err)
    flat = b.ref("store-flat")
    out["change_without_bootseer_s"] = b.without_bootseer("F")  # F's pip cache: as warm as its runs left it
    out["ratio_layers_vs_layers_false"] = out["change_layers_s"] / out["change_layers_false_s"]
    out["ratio_layers_vs_without_bootseer"] = out["change_layers_s"] / out["change_without_bootseer_s"]

    # 2. bytes published for the change vs the installed size of what changed (pandas 3.1.1 and six)
    out["layer_blob_bytes"] = layer["size"]
    out["full_blob_bytes"] = flat["size"]
    out["changed_installed_bytes"] = b.installed(("pandas", "six"))
    out["ratio_published_vs_changed"] = layer["size"] / out["changed_installed_bytes"]

    # 3. a fresh node with the parent in its node cache
    b.config("store")
    b.reqs(BASE)
    b.fresh_venv()
    b.start("B")  # the parent into B's cache (untimed)
    parent_s, child_s = [], []
    for rep in range(REPS):  # interleaved: parent, child, parent, child …; the medians
        b.reqs(BASE)
        b.fresh_venv()
        parent_s.append(b.start("B")[0])
        b.reqs(CHANGED)
        b.fresh_venv()
        before = b.cache_bytes("B")
        child_s.append(b.start("B")[0])
        if rep == 0:  # the first: the layer alone comes from the store
            out["child_restore_bytes_fetched"] = b.cache_bytes("B") - before
    out["parent_restore_cached_s"] = statistics.median(parent_s)
    out["child_restore_parent_cached_s"] = statistics.median(child_s)
    out["ratio_child_vs_parent_restore"] = out["child_restore_parent_cached_s"] / out["parent_restore_cached_s"]
    assert parent["blob"] != layer["blob"]

    # 4. ten successive one-package changes on node A (carrying the changed env), then restore the tenth
    b.fresh_venv()
    b.start("A")  # A's tree back to the changed env (restored from its cache)
    depths = []
    for v in range(1, 11):
        b.reqs([*CHANGED[:-2], f"bslayer==1.{v}", CHANGED[-1]])
        took, _ = b.start("A")
        out[f"change_{v}_s"] = took
        depths.append(b.ref("store").get("depth", 0))
    out["max_depth_seen"] = max(depths)
    b.config("store-flat", layers=False)
    b.fresh_venv()
    b.start("F2")  # a full snapshot of the same env, built from the image
    tenth_s, full_s = [], []
    for rep in range(REPS):  # interleaved, each on a fresh node with an empty node cache
        b.config("store")
        b.fresh_venv()
        tenth_s.append(b.start(f"C{rep}")[0])
        b.config("store-flat", layers=False)
        b.fresh_venv()
        full_s.append(b.start(f"F3{rep}")[0])
    out["tenth_restore_fresh_s"] = statistics.median(tenth_s)
    out["full_restore_fresh_s"] = statistics.median(full_s)
    out["ratio_tenth_vs_full_restore"] = out["tenth_restore_fresh_s"] / out["full_restore_fresh_s"]
    print("depth after each change:", depths, file=sys.stderr)


if __name__ == "__main__":
    main()
