"""Benchmark: the writable checkpoint directory (issue 44 item 2), side by side in one run.

    python tests/benchmarks/bench_ckpt_write.py [--size-mib 512] [--reps 3] [--mixed]

A `torch.save` checkpoint of --size-mib is pushed as 4 stripes to a store on local disk (file://; its
stripe files are read once before each row, so every row reads them from the page cache and the rows
differ only in the path under test). Each round, in alternating order:

  resume read   `torch.load` of the restored `ckpt.pt` through a fresh read-only mount (the baseline)
                and through a fresh writable view (overlay over a fresh read-only mount): >= 95 %
  save          `torch.save` + fsync of a new state of the same size into a local-disk directory (the
                baseline) and over `ckpt.pt` in the writable view (the trainer's save; copy-up): >= 90 %
  push          `ckpt push` of a local directory holding such a checkpoint into an empty store (the
                baseline) and the agent's write-back push of the view's save (writeback.finish, until
                the tag is in the store: the staging copy it then sets aside is removed untimed, as
                the baseline's local directory is left in place): >= 90 %

With --mixed, also: the job keeps `ckpt.pt` and saves `checkpoint-2/ckpt.pt` beside it, so the
write-back re-pushes the kept file from the parent's stripes (`ckpt push` of the same two files is the
baseline; the new tag cannot share the parent's stripes, see writeback.py).

Speeds are the checkpoint's bytes over the time of the operation; the ratio is the view's speed over
the baseline's, medians of --reps rounds, and the median of each round's own ratio (the two run back to
back, so a loaded machine's swings cancel better). Run as root (kernel overlay) or as a user with
fuse-overlayfs. Everything it mounts or writes is removed however it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

CELL = 1 << 20


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _state(size: int, seed: int) -> dict[str, object]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {"step": seed, "w": torch.randint(0, 255, (size,), dtype=torch.uint8, generator=g)}


def _save(state: dict[str, object], path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _load(path: Path) -> None:
    import torch

    torch.load(path)


def _warm(store_root: Path) -> None:
    """Every stripe file read once: every row reads the store from the page cache."""
    for p in (store_root / "blobs").rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass


@contextlib.contextmanager
def _readonly(m, store, mp: Path) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    from bootseer_cli.stripe.mount import mount_detached, umount

    mount_detached(m, mp, store.uri)
    try:
        yield mp
    finally:
        umount(mp)


@contextlib.contextmanager
def _writable(m, store, work: Path, run: str) -> Iterator[tuple[Path, Path]]:  # type: ignore[no-untyped-def]
    """The stage's writable view: a read-only mount under an overlay; yields (view, write-back root)."""
    from bootseer_cli.stripe.overlay import mount_overlay, umount_overlay, write_dirs

    dirs = write_dirs(run)
    view = work / f"view-{run}"
    view.mkdir()
    with _readonly(m, store, work / f"lower-{run}") as lower:
        mount_overlay(str(lower), dirs, str(view))
        try:
            yield view, dirs.root
        finally:
            umount_overlay(str(view))


def _round(work: Path, store, m, size: int, i: int, rows: dict[str, list[float]]) -> None:  # type: ignore[no-untyped-def]
    from bootseer_cli.settings import CheckpointSettings
    from bootseer_cli.store.core import Store
    from bootseer_cli.stripe.push import push
    from bootseer_cli.stripe.rundirs import owner_stamp
    from bootseer_cli.stripe.writeback import Journal, begin, discard_done, finish

    state = _state(size, 100 + i)
    order = ["base", "view"] if i % 2 == 0 else ["view", "base"]
    for which in order:
        _warm(Path(store.uri.removeprefix("file://")))
        if which == "base":
            with _readonly(m, store, work / f"ro-{i}") as mp:
                rows["read: read-only mount"].append(_timed(lambda: _load(mp / "ckpt.pt")))
            local = work / f"local-{i}"
            rows["save: local disk"].append(_timed(lambda local=local: _save(state, local / "ckpt.pt")))
            fresh = Store((work / f"push-store-{i}").as_uri())
            rows["push: ckpt push"].append(
                _timed(lambda fresh=fresh, local=local: push(fresh, local, "bench", "t", stripes=4, cell_size=CELL))
            )
            continue
        with _writable(m, store, work, f"run{i}") as (view, root):
            rows["read: writable view"].append(_timed(lambda: _load(view / "ckpt.pt")))
            rows["save: writable view"].append(_timed(lambda: _save(state, view / "ckpt.pt")))
        begin(root, Journal("overlay", "bench", m.tag, f"wb{i}", str(root / "upper"), owner=owner_stamp(1)))
        settings = CheckpointSettings(stripes=4, cell_size=CELL)
        rows["push: write-back"].append(_timed(lambda s=settings: finish(store, s, root, print)))
        discard_done()  # the staging copy the push set aside: the agent's, after the push (untimed, as the
        # baseline's local copy is left where it is)
    if "push: write-back, half kept" in rows:
        _mixed_round(work, store, m, size, i, rows)


def _mixed_round(work: Path, store, m, size: int, i: int, rows: dict[str, list[float]]) -> None:  # type: ignore[no-untyped-def]
    """--mixed: the job keeps the restored `ckpt.pt` and saves `checkpoint-2/ckpt.pt` beside it; the
    write-back re-pushes the kept file from the parent's stripes (twice the bytes, half from the store),
    against `ckpt push` of a local directory holding the same two files."""
    from bootseer_cli.settings import CheckpointSettings
    from bootseer_cli.store.core import Store
    from bootseer_cli.stripe.push import push
    from bootseer_cli.stripe.rundirs import owner_stamp
    from bootseer_cli.stripe.writeback import Journal, begin, discard_done, finish

    state = _state(size, 200 + i)
    local = work / f"mixed-local-{i}"
    shutil.copytree(work / "src", local)
    _save(state, local / "checkpoint-2" / "ckpt.pt")
    fresh = Store((work / f"mixed-store-{i}").as_uri())
    _warm(Path(store.uri.removeprefix("file://")))
    rows["push: ckpt push, 2 files"].append(_timed(lambda: push(fresh, local, "bench", "t", stripes=4, cell_size=CELL)))
    with _writable(m, store, work, f"mixed{i}") as (view, root):
        _save(state, view / "checkpoint-2" / "ckpt.pt")
    begin(root, Journal("overlay", "bench", m.tag, f"mx{i}", str(root / "upper"), owner=owner_stamp(1)))
    settings = CheckpointSettings(stripes=4, cell_size=CELL)
    _warm(Path(store.uri.removeprefix("file://")))
    rows["push: write-back, half kept"].append(_timed(lambda: finish(store, settings, root, print)))
    discard_done()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work directory (default: a new one under /var/tmp, on disk)")
    ap.add_argument("--mixed", action="store_true", help="also a write-back that re-pushes a kept file")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-write-", dir=args.dir or "/var/tmp"))
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")  # the overlay's upper dir: on the same disk
    try:
        return _run(work, args.size_mib << 20, args.reps, args.mixed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(work: Path, size: int, reps: int, mixed: bool) -> int:
    from bootseer_cli.store.core import Store
    from bootseer_cli.stripe.push import push

    src = work / "src"
    _save(_state(size, 1), src / "ckpt.pt")
    store = Store((work / "store").as_uri())
    m = push(store, src, "bench", "v1", stripes=4, cell_size=CELL)
    total = (src / "ckpt.pt").stat().st_size
    rows: dict[str, list[float]] = {}
    for k in ("read: read-only mount", "read: writable view", "save: local disk", "save: writable view"):
        rows[k] = []
    rows["push: ckpt push"], rows["push: write-back"] = [], []
    if mixed:
        rows["push: ckpt push, 2 files"], rows["push: write-back, half kept"] = [], []
    for i in range(reps):
        _round(work, store, m, size, i, rows)
    print(f"checkpoint {total / 2**20:.0f} MiB, {reps} rounds, medians; load: {os.getloadavg()}")
    pairs = [("read: read-only mount", "read: writable view", 0.95), ("save: local disk", "save: writable view", 0.9)]
    pairs.append(("push: ckpt push", "push: write-back", 0.9))
    if mixed:
        pairs.append(("push: ckpt push, 2 files", "push: write-back, half kept", 0.9))
    for base, view, goal in pairs:
        b, v = statistics.median(rows[base]), statistics.median(rows[view])
        total = (2 if "2 files" in base else 1) * (src / "ckpt.pt").stat().st_size
        print(f"  {base:28s} {b:7.3f} s  {total / b / 1e6:8.1f} MB/s")
        paired = statistics.median(x / y for x, y in zip(rows[base], rows[view], strict=True))
        print(
            f"  {view:28s} {v:7.3f} s  {total / v / 1e6:8.1f} MB/s   {b / v:5.2f}x of the baseline"
            f" (per round, median {paired:4.2f}x; goal >= {goal})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
