"""A small real training job, started as `bootseer exec -- torchrun --nproc-per-node 2 train.py`.

It is what a real job does at startup, in miniature: import torch and the job's dependencies (one of
them compiled from source by the setup), join a gloo process group, resume from the latest
checkpoint, take a first step, and later save a checkpoint. With bootseer:

- the checkpoint to resume from is the directory `$BOOTSEER_CKPT_DIR` (a read-only mount of the
  striped checkpoint named in bootseer.toml); without bootseer, `--resume-from DIR`;
- after the first step every rank calls `bootseer_cli.ready()`, which closes the startup window that
  `bootseer report` measures (and tells the agent when to take the hot-block record);
- rank 0 saves a checkpoint directory (`torch.save`) and pushes it with `bootseer_cli.ckpt.push`.

Everything a test or a person needs is printed by rank 0 as one line `train: <what> key=value …`:

    train: deps einops=0.8.2 tabulate=0.10.0 msgpack=1.2.3 fnv=0.1.0
    train: resumed step=4 weights=<sha256> from=/tmp/bootseer-ckpt/…
    train: step=5 loss=0.123456
    train: compiled first_step_s=<seconds>      (with --compile: the first step, compilation included)
    train: ready t=<unix time>
    train: saved step=8 weights=<sha256> dir=checkpoints/step-000008
    train: pushed name=torchrun-example tag=step-000008
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import os
import shutil
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

import bsexample_fnv  # the dependency built from source
import einops
import msgpack
import tabulate
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
BATCH = 32


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4, help="steps to train in this run")
    p.add_argument("--ckpt-name", default="torchrun-example", help="name to push checkpoints under")
    p.add_argument("--save-dir", default="checkpoints", help="where checkpoint directories are written")
    p.add_argument("--resume-from", default=None, help="checkpoint directory to resume from (without bootseer)")
    p.add_argument("--no-push", action="store_true", help="do not push the checkpoint (e.g. not the first node)")
    p.add_argument("--sleep-per-step", type=float, default=0.0, help="pause after each step (to watch a run)")
    p.add_argument(
        "--compile", action="store_true", help="wrap the model in torch.compile (see [compile] in bootseer.toml)"
    )
    return p.parse_args()


def say(rank: int, what: str, **fields: object) -> None:
    if rank == 0:
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        print(f"train: {what} {text}".rstrip(), flush=True)


def exit_with_launcher() -> None:
    """End this worker when its launcher is gone (e.g. SIGKILLed): nothing may keep running."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of one step on one rank: a pure function of (step, rank), so a resumed run sees what
    an uninterrupted one would."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = torch.sin(einops.reduce(x[:, :4], "b f -> b 1", "sum"))
    return x, y


def weights_digest(model: nn.Module) -> str:
    """sha256 over the parameters' names and raw bytes: equal digests, equal weights."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(t.detach().contiguous().view(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def find_checkpoint(path: str | None) -> Path | None:
    """`path/model.pt`, or the newest `path/step-*/model.pt`."""
    if not path:
        return None
    d = Path(path)
    if (d / "model.pt").is_file():
        return d / "model.pt"
    steps = sorted(p for p in d.glob("step-*") if (p / "model.pt").is_file())
    return steps[-1] / "model.pt" if steps else None


def save(model: nn.Module, optim: torch.optim.Optimizer, step: int, save_dir: str) -> Path:
    """A complete checkpoint directory or none: written under a temporary name, then renamed."""
    final = Path(save_dir) / f"step-{step:06d}"
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict()}, tmp / "model.pt")
    meta = {"step": step, "fnv": bsexample_fnv.fnv1a64((tmp / "model.pt").read_bytes()), "time": time.time()}
    (tmp / "meta.msgpack").write_bytes(msgpack.packb(meta))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def push(path: Path, name: str, tag: str, rank: int) -> None:
    try:
        from bootseer_cli import ckpt
    except ImportError:
        say(rank, "push-skipped", reason="bootseer_cli.ckpt not available")
        return
    ckpt.push(str(path), name, tag)
    say(rank, "pushed", name=name, tag=tag)


def main() -> None:
    args = parse_args()
    exit_with_launcher()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    deps = {d: version(p) for d, p in [("einops", "einops"), ("tabulate", "tabulate"), ("msgpack", "msgpack")]}
    say(rank, "deps", **deps, fnv=version("bsexample-fnv"))

    torch.manual_seed(0)
    net = Net()
    optim = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    start = 0
    source = os.environ.get("BOOTSEER_CKPT_DIR") or args.resume_from
    found = find_checkpoint(source)
    if found is not None:
        state = torch.load(found, map_location="cpu", weights_only=True)
        net.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])
        say(rank, "resumed", step=start, weights=weights_digest(net), **{"from": found.parent})
    else:
        say(rank, "fresh", step=0, weights=weights_digest(net), searched=source or "-")
    model = DistributedDataParallel(net)
    if args.compile:
        model = torch.compile(model)  # compiled on the first step: its time is what the compile stage saves
    loss_fn = nn.MSELoss()

    step = start
    for step in range(start + 1, start + args.steps + 1):
        t_step = time.perf_counter()
        x, y = batch(step, rank)
        optim.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optim.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        say(rank, "step", step=step, loss=f"{mean.item() / world:.6f}")
        if step == start + 1 and args.compile:
            say(rank, "compiled", first_step_s=f"{time.perf_counter() - t_step:.3f}")
        if step == start + 1:
            try:
                import bootseer_cli

                bootseer_cli.ready()
            except ImportError:
                pass
            say(rank, "ready", t=f"{time.time():.6f}")
        if args.sleep_per_step:
            time.sleep(args.sleep_per_step)

    # Leave the process group together before rank 0's checkpoint I/O: no rank sits in a collective
    # while another writes and uploads, and gloo's connections close while every peer is still there.
    dist.barrier()
    del model  # DDP's reducer holds gloo work: free it before the group goes
    dist.destroy_process_group()
    if rank == 0:
        path = save(net, optim, step, args.save_dir)
        say(rank, "saved", step=step, weights=weights_digest(net), dir=path)
        if not args.no_push:
            push(path, args.ckpt_name, path.name, rank)
        print(tabulate.tabulate([[start, step, world]], headers=["resumed at", "ended at", "ranks"]), flush=True)


def leave() -> None:
    """End this worker after its atexit handlers, without the interpreter's teardown.

    The gloo group outlives `destroy_process_group` once DDP has used it (torch keeps it alive), so
    its worker threads do too. One of them may still be dropping the last collective's work, whose
    tensors need the GIL, when the interpreter finalizes: Python then ends that thread inside a C++
    destructor and the whole worker aborts ("terminate called without an active exception",
    SIGABRT), failing a job that had finished: 7 of 150 runs of this teardown on 2 cores.
    The atexit handlers (logging's, torch's compile workers') run here while the interpreter is whole;
    `os._exit` then skips only the teardown, where that race is.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    leave()
