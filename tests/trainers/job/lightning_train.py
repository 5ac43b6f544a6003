"""A tiny character model trained by PyTorch Lightning, as a user would write it: `Trainer(accelerator="cpu",
devices=2, strategy="ddp")` started by Lightning's own launcher (`python lightning_train.py`: it starts the
second process itself), `ModelCheckpoint(dirpath=…, save_last=True)`, resumed with `fit(ckpt_path="last")`.

The data is a local text file as byte-level token ids, an epoch of `--save-steps` steps in the same order
every epoch, and the checkpoint is saved every `--save-steps` steps: a resumed run sees the batches an
uninterrupted one sees (Lightning 2.6 restarts a partly trained epoch from its first batch, and a run
resumed twice shuffles its epoch as the epoch before: both would change the losses, not bootseer).
Rank 0 prints `train: begin step=N`, `train: first-step t=<unix time>` and `train: step step=N loss=X` lines.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BLOCK = 32
BATCH = 4


class CharModel(L.LightningModule):
    """Embedding, one transformer layer, a head over the 256 byte values."""

    def __init__(self, blocks: torch.Tensor) -> None:
        super().__init__()
        self.blocks = blocks
        self.embed = nn.Embedding(256, 32)
        self.layer = nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 256)
        self.first = True

    def training_step(self, batch: list[torch.Tensor], idx: int) -> torch.Tensor:
        (x,) = batch
        logits = self.head(self.layer(self.embed(x[:, :-1])))
        return nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))

    def on_train_start(self) -> None:
        if self.global_rank == 0:
            print(f"train: begin step={self.global_step}", flush=True)

    def on_train_batch_end(self, outputs, batch, idx) -> None:
        if self.global_rank != 0:
            return
        if self.first:
            print(f"train: first-step t={time.time():.3f} step={self.global_step}", flush=True)
            self.first = False
        print(f"train: step step={self.global_step} loss={outputs['loss'].item()!r}", flush=True)

    def train_dataloader(self) -> DataLoader:
        """This rank's share of the blocks, in order: every epoch sees the same batches."""
        share = self.blocks[self.global_rank :: self.trainer.world_size]
        return DataLoader(TensorDataset(share), batch_size=BATCH, shuffle=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--root-dir", default="lightning-root")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--one-last", action="store_true", help="overwrite last.ckpt instead of adding last-vN.ckpt")
    a = p.parse_args()
    L.seed_everything(0, workers=True)
    ids = torch.tensor(list(a.data.read_bytes()), dtype=torch.long)
    n = min(len(ids) // BLOCK, 2 * BATCH * a.save_steps)  # two ranks: an epoch ends at each save
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=a.max_steps,
        default_root_dir=a.root_dir,
        callbacks=[
            ModelCheckpoint(
                dirpath=a.ckpt_dir,
                save_last=True,
                every_n_train_steps=a.save_steps,
                save_top_k=1,
                enable_version_counter=not a.one_last,
            )
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        use_distributed_sampler=False,  # the model shards its data itself (train_dataloader)
    )
    trainer.fit(CharModel(ids[: n * BLOCK].view(n, BLOCK)), ckpt_path="last")


def leave() -> None:
    """End this process after its atexit handlers, without the interpreter's teardown: a gloo worker thread
    still dropping the last collective's tensors when the interpreter finalizes aborts a finished run
    ("terminate called without an active exception", SIGABRT; seen in a run of hf_train.py beside this; torch 2.13,
    examples/torchrun-job/train.py measured it in 7 of 150 runs)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    leave()
