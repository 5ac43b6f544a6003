"""A tiny GPT-2 trained by the Hugging Face `Trainer`, as a user would write it: the model from a
`GPT2Config` (nothing from a hub), the data a local text file as byte-level token ids (no tokenizer to
download), checkpoints `checkpoint-N/` in `--output-dir`, resumed with `resume_from_checkpoint`.

Run with `torchrun --nproc-per-node 2 hf_train.py --data corpus.txt --output-dir out --max-steps 8`.
Rank 0 prints `train: begin step=N`, `train: first-step t=<unix time>` and `train: step step=N loss=X` lines.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

BLOCK = 32


class ByteBlocks(torch.utils.data.Dataset):
    """The text file's bytes cut into blocks of BLOCK token ids (ids 0-255: the bytes themselves)."""

    def __init__(self, path: Path) -> None:
        ids = torch.tensor(list(path.read_bytes()), dtype=torch.long)
        n = len(ids) // BLOCK
        self.blocks = ids[: n * BLOCK].view(n, BLOCK)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class Lines(TrainerCallback):
    """What the tests read: where training began, when its first step ended, each step's loss."""

    def __init__(self) -> None:
        self.first = True

    def on_train_begin(self, args, state, control, **kw):
        if state.is_world_process_zero:
            print(f"train: begin step={state.global_step}", flush=True)

    def on_step_end(self, args, state, control, **kw):
        if self.first and state.is_world_process_zero:
            print(f"train: first-step t={time.time():.3f} step={state.global_step}", flush=True)
        self.first = False

    def on_log(self, args, state, control, logs=None, **kw):
        if state.is_world_process_zero and logs and "loss" in logs:
            print(f"train: step step={state.global_step} loss={logs['loss']!r}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=a.output_dir,
        max_steps=a.max_steps,
        save_steps=a.save_steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        use_cpu=True,
        report_to=[],
        seed=0,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        dataloader_num_workers=0,
        disable_tqdm=True,
        torch_compile=a.compile,
    )
    trainer = Trainer(model=model, args=args, train_dataset=ByteBlocks(a.data), callbacks=[Lines()])
    resume = any(Path(a.output_dir).glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)


def leave() -> None:
    """End this process after its atexit handlers, without the interpreter's teardown: a gloo worker thread
    still dropping the last collective's tensors when the interpreter finalizes aborts a finished run
    ("terminate called without an active exception", SIGABRT; seen here in a run of this program; torch 2.13,
    examples/torchrun-job/train.py measured it in 7 of 150 runs)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    leave()
