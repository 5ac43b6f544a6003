"""Startup of two public trainers to their first training step, with and without bootseer, side by side.

    python tests/benchmarks/bench_trainers.py [--reps N] [--only hf,lightning] [--json out.json]

The programs and their job are tests/trainers' (the Hugging Face `Trainer` on a tiny GPT-2 under
`torchrun --nproc-per-node 2`; PyTorch Lightning, `devices=2, strategy="ddp"`, under its own launcher),
their env a venv the setup makes (`python3 -m venv` + `pip install -r requirements.txt`: torch 2.13.0 CPU
from this machine's disk, transformers, accelerate, lightning from the index; 1.2 GB, 32,753 files).
Each node has its own node cache, `TMPDIR` and venv directory (bound at one path in its own mount namespace).

- warm store: one cold start through bootseer publishes the env snapshot and, through the agent's
  write-back, its save as the first checkpoint tag (`bootseer ckpt push` by hand only where no tag is
  there by the time the start has ended);
- fresh node, without bootseer: an empty venv: the setup runs, then the trainer (from scratch: fetching
  the checkpoint by hand is left out, in the baseline's favour);
- fresh node, with bootseer: `bootseer exec -- <trainer>`: env restored, checkpoint mounted from
  `latest`, compile stage on;
- restart on the same node, without bootseer: the trainer resumes from its local checkpoint directory;
  with bootseer: `bootseer exec -- <trainer>` (env present, checkpoint mounted, compile stage).

Lightning runs with `--one-last` (ModelCheckpoint(enable_version_counter=False)), as the figures in
BENCHMARKS.md were measured. It was needed while the checkpoint mount showed every file with one mtime:
a resumed run saves `last-v1.ckpt` beside `last.ckpt`, `ckpt_path="last"` takes the newest by mtime, and
the ranks picked different files. The manifest now records each file's mtime, and Lightning's default is
tested (tests/trainers: test_mounted_checkpoint_keeps_the_order_of_its_saves); the flag only keeps the
figures comparable.

`--env-mode mount` runs every node with `[env] mode = "mount"` (issue 48): the warm start publishes the
squashfs image too, a fresh node mounts it over its (empty) venv directory instead of extracting. No
restart is timed then: the env goes with each run's mounts, so no venv stays for the trainer alone.

`--compile` runs the HF model under `torch.compile` (`TrainingArguments(torch_compile=True)`): the compile
stage publishes the warm start's Inductor cache, a fresh node restores it.

Time = from the node's first command to rank 0's first finished training step (the program's
`train: first-step` line). Goals (issue 44): fresh node <= 0.2x; restart <= 1.02x. Medians of --reps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.trainers.conftest import TrainerStore, make_nodes
from tests.trainers.harness import BOOTSEER, TrainerNode, first_step_s

SETUP = 'python3 -m venv {v} && {v}/bin/python -m pip install -q -r requirements.txt && exec "$@"'
KINDS = ("fresh_plain", "fresh_bootseer", "restart_plain", "restart_bootseer")


def timed(node: TrainerNode, max_steps: int, bootseer: bool, setup: bool = False, out: str | None = None) -> float:
    """Seconds to the first training step of one start of `node` (setup: the env made first, by hand)."""
    argv = node.program(max_steps, out or node.ckpt_dir)
    if setup:
        argv = ["sh", "-c", SETUP.format(v=node.venv_at), "sh", *argv]
    elif bootseer:
        argv = [BOOTSEER, "exec", "--", *argv]
    run = node.start(command=argv, bootseer=False).wait(1800)
    assert run.rc == 0, run.output[-4000:]
    return first_step_s(run)


def bench(
    trainer: str, store: TrainerStore, reps: int, compiled: bool = False, env_mode: str = ""
) -> dict[str, list[float]]:
    """Each start trains 4 steps past the checkpoint it resumes from (`latest` in the store with bootseer;
    its own directory without), so that every start resumes and reaches a training step."""
    cluster, make = make_nodes(store, trainer)

    def node(name: str) -> TrainerNode:
        n = make(name)
        if trainer == "lightning":  # one last.ckpt, as the published figures were measured (see above)
            n.program_args = ("--one-last",)
        elif compiled:
            n.program_args = ("--compile",)
        if env_mode:  # every node, the warm one too: in mount mode it publishes the squashfs image
            n.env_extra["BOOTSEER_ENV_MODE"] = env_mode
        return n

    out: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        warm = node("warm")
        timed(warm, 4, bootseer=True)  # the env snapshot (built here or by the other trainer's job)
        if not warm.tags():
            warm.push_by_hand()
        latest = 4
        for i in range(reps):
            out["fresh_plain"].append(timed(node(f"plain-{i}"), 4, bootseer=False, setup=True))
            latest += 4
            out["fresh_bootseer"].append(timed(node(f"fresh-{i}"), latest, bootseer=True))
            print(f"{trainer} fresh {i + 1}: {out['fresh_plain'][-1]:.1f} s vs {out['fresh_bootseer'][-1]:.1f} s")
        if env_mode == "mount":  # the mounts go with each run: no venv stays for the restart without bootseer
            print(f"{trainer}: no restart in mount mode (nothing is extracted for the trainer to run alone)")
            return out
        n = node("restart")
        latest += 4
        timed(n, latest, bootseer=True)  # this node's first start: the env restored, its caches filled
        own = 4
        timed(n, own, bootseer=False, out="plain-out")  # the trainer's own checkpoint to resume from
        for i in range(reps):  # alternating
            own += 4
            out["restart_plain"].append(timed(n, own, bootseer=False, out="plain-out"))
            latest += 4
            out["restart_bootseer"].append(timed(n, latest, bootseer=True))
            print(f"{trainer} restart {i + 1}: {out['restart_plain'][-1]:.1f} s vs {out['restart_bootseer'][-1]:.1f} s")
    finally:
        cluster.close()
    return out


def table(results: dict[str, dict[str, list[float]]]) -> str:
    rows = [
        "| program | fresh: without | with bootseer | ratio (<= 0.2) | restart: without | with | ratio (<= 1.02) |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, r in results.items():
        m = {k: statistics.median(v) if v else float("nan") for k, v in r.items()}
        fresh, restart = m["fresh_bootseer"] / m["fresh_plain"], m["restart_bootseer"] / m["restart_plain"]
        rows.append(
            f"| {t} | {m['fresh_plain']:.1f} s | {m['fresh_bootseer']:.1f} s | {fresh:.2f}x "
            f"| {m['restart_plain']:.1f} s | {m['restart_bootseer']:.1f} s | {restart:.2f}x |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="hf,lightning")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compile", action="store_true", help="the HF model under torch.compile (TrainingArguments)")
    ap.add_argument("--env-mode", choices=("extract", "mount"), default="", help="[env] mode for every node")
    a = ap.parse_args()
    os.environ.pop("BOOTSEER_STORE", None)
    store = TrainerStore(Path(tempfile.mkdtemp(prefix="bench-trainers-")))
    print(f"load average at start: {os.getloadavg()}", flush=True)
    results = {t: bench(t, store, a.reps, a.compile, a.env_mode) for t in a.only.split(",")}
    print(f"load average at end: {os.getloadavg()}\n")
    print(table(results))
    if a.json:
        a.json.write_text(json.dumps({"reps": a.reps, "results": results, "time": time.time()}, indent=1))


if __name__ == "__main__":
    main()
