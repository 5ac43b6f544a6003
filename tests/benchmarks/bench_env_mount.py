"""Issue 48 figure: on a fresh node, the time until a program importing the env's packages has run,
with the env mounted (`[env] mode = "mount"`) against extracted. Root only (drop_caches, mounts).

    python tests/benchmarks/bench_env_mount.py [--packages torch,...] [--imports torch] [--rounds 3]

The env is a copy of some packages of this interpreter's site-packages (default: CPU torch and what
`import torch` needs) put at `<work>/env/site` by the setup of a real `bootseer exec` (mode "mount"),
which publishes the tar snapshot and the squashfs image into a local store; the builder's node cache
then holds both, as a fresh node's would once fetched (so every step below starts "blob local").
Each round, in a rotating order, with the tree removed and `sync; echo 3 > drop_caches` before each:
- `tar`: GNU tar extracts tar's own zstd archive of the tree, then the import (the issue's baseline);
- `extract`: `bootseer exec` in mode "extract" restores the snapshot, the launcher imports;
- `mount`: `bootseer exec` in mode "mount" (root: the kernel's squashfs on a loop device + overlayfs);
- `fuse`: the same exec with `mount` off PATH, so the image goes through `squashfuse_ll` + `fuse-overlayfs`
  (the plain user's path).
`--warm` keeps the page cache (each step runs once untimed first): a restart on the same node, where
issue 48 asks the mounted env to be within 1.05x of the extracted tree. `extract` then finds the tree
it left (env present, nothing extracted); the mount steps mount again over the emptied root.
`--layer PACKAGE` adds step `layer`: the builder publishes the env again with PACKAGE (a directory of
this interpreter's site-packages) copied in, a layer over the env above, whose image holds only that
change and is mounted over the env's (issue 48 item 3); the two images' sizes are printed.
Printed: each step's median wall time, the ratio to `extract` and to `tar`, and for the two exec steps the
env stage's own seconds (its event). Lazy ranged fill (the image only in the store) is a later step.
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
import time
from pathlib import Path

TORCH = (
    "torch,functorch,torchgen,typing_extensions.py,sympy,mpmath,networkx,jinja2,markupsafe,filelock,fsspec,"
    "numpy,numpy.libs"
)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _bootseer(args: list[str], cache: Path, mode: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(cache), "BOOTSEER_ENV_MODE": mode, "BOOTSEER_TRUST_VERIFY": "off"})
    if path:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "bootseer_cli", *args], env=env, capture_output=True, text=True)


def _agents_done(cache: Path) -> None:
    """Wait until every run's agent has logged its end (the mounts are down then)."""
    for _ in range(1200):
        logs = list((cache / "bootseer" / "runs").glob("*/agent.log"))
        if all("agent done" in p.read_text() for p in logs):
            return
        time.sleep(0.1)
    raise SystemExit("an agent did not finish")


def _env_stage_s(cache: Path) -> float:
    """The newest run's env stage duration (its event)."""
    runs = sorted((cache / "bootseer" / "runs").glob("*/events.jsonl"), key=lambda p: p.stat().st_mtime)
    events = [json.loads(line) for line in runs[-1].read_text().splitlines()]
    return float(next(e["duration_s"] for e in events if e["stage"] == "env"))


def setup(work: Path, packages: list[str]) -> tuple[Path, Path, Path]:
    """The config, the builder's node cache (snapshot and image in it) and tar's archive of the tree."""
    site = Path(sysconfig.get_paths()["purelib"])
    src = work / "src"
    if not src.exists():
        src.mkdir(parents=True)
        for name in packages:
            p = site / name
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, src / name)  # type: ignore[operator]
    root = work / "env"
    cfg = work / "bootseer.toml"
    cfg.write_text(
        f'[store]\nuri = "{(work / "store").as_uri()}"\n[exec]\nagent = true\n'
        f'[env]\nroots = ["{root}"]\nsetup = ["mkdir -p {root}/site && cp -a {src}/. {root}/site/"]\n'
    )
    cache = work / "node"
    if not (work / "published").exists():
        shutil.rmtree(root, ignore_errors=True)
        (work / "store").mkdir(exist_ok=True)
        env = {**os.environ, "BOOTSEER_EXEC_AGENT": "0"}
        t = time.time()
        r = subprocess.run(
            [sys.executable, "-m", "bootseer_cli", "exec", "--config", str(cfg), "--", "true"],
            env={**env, "XDG_CACHE_HOME": str(cache), "BOOTSEER_ENV_MODE": "mount", "BOOTSEER_TRUST_VERIFY": "off"},
            capture_output=True,
            text=True,
        )
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        print(f"built and published (snapshot + image) in {time.time() - t:.1f} s", file=sys.stderr)
        (work / "published").touch()
    tar = work / "env.tar.zst"
    if not tar.exists():
        subprocess.run(["tar", "-I", "zstd -T0", "-C", "/", "-cf", str(tar), str(root).lstrip("/")], check=True)
    return cfg, cache, tar


def layer_config(work: Path, cfg: Path, cache: Path, extra: str) -> tuple[Path, str]:
    """--layer: the setup plus one more package copied in (`extra`, from this interpreter's site-packages),
    published by the builder as a layer over the env above: its config, and the two images' sizes."""
    site = Path(sysconfig.get_paths()["purelib"])
    root = work / "env"
    text = cfg.read_text()
    setup = text.split("setup = [")[1].rstrip().rstrip("]")
    cfg2 = work / "bootseer-layer.toml"
    cfg2.write_text(text.replace(f"setup = [{setup}]", f'setup = [{setup}, "cp -a {site / extra} {root}/site/"]'))
    if not (work / "published-layer").exists():
        _empty(root)  # the builder's tree: the env above, then the bump over it
        r = _bootseer(["exec", "--config", str(cfg), "--", "true"], cache, "extract")
        r2 = _bootseer(["exec", "--config", str(cfg2), "--", "true"], cache, "mount") if not r.returncode else r
        if r2.returncode or "layer" not in r2.stderr:
            raise SystemExit(f"the layer was not published: {r2.stderr[-2000:]}")
        _agents_done(cache)
        (work / "published-layer").touch()
    refs = [json.loads(p.read_text()) for p in (work / "store").rglob("refs/env/*.json")]
    sizes = sorted((r.get("fs_image") or {}).get("size", 0) for r in refs)
    return cfg2, f"images: {', '.join(f'{n / 1e6:.1f} MB' for n in sizes)} (the layer's, the whole tree's)"


def _lowers_down(cache: Path, keep: str) -> None:
    """Take down the node's shared image lowers (envmount/lowers.py) but those mounted `keep` ways
    ("kernel" or "fuse"; "" for none): a fresh node has none, and a restart keeps its own kind's."""
    for rec in (cache / "bootseer" / "env-images").glob("*.json"):
        if keep and json.loads(rec.read_text()).get("how") == keep:
            continue
        mp = str(rec.with_suffix(""))
        for argv in (["umount", mp], ["fusermount3", "-u", mp], ["umount", "-l", mp]):
            if subprocess.run(argv, capture_output=True).returncode == 0:
                break
        rec.unlink()


def _empty(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()


def step(
    name: str, work: Path, cfg: Path, cache: Path, tar: Path, imports: str, warm: bool = False
) -> tuple[float, float | None]:
    """One timed step from a removed tree and a dropped page cache: (wall s, env stage s or None)."""
    root = work / "env"
    prog = f"import sys; sys.path.insert(0, {str(root / 'site')!r}); import {imports}"
    if warm and name == "extract":  # a restart: the tree the last extract left stays (env present)
        if not (root / "site").is_dir():
            _empty(root)
            _bootseer(["exec", "--config", str(cfg), "--", "true"], cache, "extract")
            _agents_done(cache)
    else:
        _empty(root)
    _lowers_down(cache, {"mount": "kernel", "layer": "kernel", "fuse": "fuse"}.get(name, "") if warm else "")
    if not warm:
        drop_caches()
    t = time.perf_counter()
    if name == "tar":
        subprocess.run(["tar", "-I", "zstd -T0", "-C", "/", "-xf", str(tar)], check=True)
        subprocess.run([sys.executable, "-c", prog], check=True)
        return time.perf_counter() - t, None
    mode = "mount" if name in ("fuse", "layer") else name
    path = _fuse_path(work) if name == "fuse" else None
    if name == "layer":  # the env with one package more, a layer: its image stacked over the one above
        cfg = work / "bootseer-layer.toml"
    r = _bootseer(["exec", "--config", str(cfg), "--", sys.executable, "-c", prog], cache, mode, path)
    took = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    _agents_done(cache)
    shows = {"mount": "kernel squashfs", "fuse": "fuse squashfs + fuse overlay", "layer": "2 images"}
    how = "env present" if warm and name == "extract" else shows.get(name, "restored")
    if how not in r.stderr:
        raise SystemExit(f"{name}: not what was measured: {r.stderr[-1500:]}")
    return took, _env_stage_s(cache)


def _fuse_path(work: Path) -> str:
    """A PATH without `mount`: root's start then takes the plain user's way (squashfuse + fuse-overlayfs)."""
    d = work / "fuse-bin"
    d.mkdir(exist_ok=True)
    for tool in ("squashfuse_ll", "squashfuse", "fuse-overlayfs", "fusermount3", "fusermount", "sh", "env", "tar"):
        found = shutil.which(tool)
        if found and not (d / tool).exists():
            (d / tool).symlink_to(found)
    return str(d)


def _is_image(p: Path) -> bool:
    if not p.is_file() or p.stat().st_size < 4:
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"hsqs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packages", default=TORCH)
    ap.add_argument("--imports", default="torch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/bootseer-bench-env-mount"))
    ap.add_argument("--steps", default="tar,extract,mount,fuse")
    ap.add_argument(
        "--warm", action="store_true", help="the page cache kept (a restart on the same node): no drop before a step"
    )
    ap.add_argument(
        "--layer",
        default="",
        metavar="PACKAGE",
        help="also a layer adding PACKAGE (a directory of site-packages): step 'layer' mounts its image over the env's",
    )
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (drop_caches, kernel mounts)")
    a.work.mkdir(parents=True, exist_ok=True)
    cfg, cache, tar = setup(a.work, a.packages.split(","))
    names = a.steps.split(",")
    if a.layer:
        _, sizes = layer_config(a.work, cfg, cache, a.layer)
        print(sizes)
        names += [] if "layer" in names else ["layer"]
    walls: dict[str, list[float]] = {n: [] for n in names}
    stages: dict[str, list[float]] = {n: [] for n in names}
    if a.warm and "tar" in names:
        raise SystemExit("--warm: the steps are extract, mount, fuse, layer (a restart extracts nothing)")
    # Cold, the steps rotate round by round. Warm (restarts on one node), each step's rounds run back to
    # back after one untimed run: a kernel and a FUSE mount of one image cannot share its node lower
    # (envmount/lowers.py), so rotating would make every mount step a first mount.
    rounds = [names[i % len(names) :] + names[: i % len(names)] for i in range(a.rounds)]
    if a.warm:
        rounds = [[n] * (a.rounds + 1) for n in names]
    for order in rounds:
        for k, name in enumerate(order):
            wall, stage_s = step(name, a.work, cfg, cache, tar, a.imports, warm=a.warm)
            if a.warm and k == 0:
                continue  # the untimed first run: its files into the page cache, its lower mounted
            walls[name].append(wall)
            if stage_s is not None:
                stages[name].append(stage_s)
            stage_text = f" (env stage {stage_s:.3f} s)" if stage_s else ""
            print(f"round {len(walls[name])} {name}: {wall:.2f} s{stage_text}")
    base = {b: statistics.median(walls[b]) for b in ("extract", "tar") if walls.get(b)}
    print(f"\nload: {os.getloadavg()}, {os.cpu_count()} cores, image {_image_size(cache)}")
    for n in names:
        med = statistics.median(walls[n])
        ratios = ", ".join(f"{med / v:.2f}x {b}" for b, v in base.items())
        st = f", env stage median {statistics.median(stages[n]):.3f} s" if stages[n] else ""
        print(f"{n:8} median {med:.2f} s ({ratios}){st}")


def _image_size(cache: Path) -> str:
    sizes = [p.stat().st_size for p in cache.rglob("*") if _is_image(p)]
    return f"{sizes[0] / 1e6:.0f} MB" if sizes else "?"


if __name__ == "__main__":
    main()
