"""Nodes for the real-trainer tests: the end-to-end suite's `Node`, with the job's env made by its own setup.

The e2e nodes carry a bare venv that sees the test interpreter's torch (`.pth`); here the job's env is a
venv of its own that the setup makes and fills from the package index (torch, transformers, lightning),
as the README tells a user to do, and bootseer runs from the test venv: its own venv, beside the job's.
Each node binds its own directory onto `VENV_AT` in its own mount namespace (the e2e harness's `wrap`),
so a node that has never started has no venv at all. A node also has its own node cache and `TMPDIR`.

pip keeps this machine's configuration here (the e2e harness cuts it off for its loopback index): that is
where `torch==2.13.0` resolves to the CPU build on disk rather than a download of several GB.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e.harness import Node, Run
from tests.support.s3server import free_port

JOB = Path(__file__).resolve().parent / "job"
VENV_AT = Path("/opt/bootseer-trainers/venv")
BOOTSEER = str(Path(sys.executable).parent / "bootseer")  # bootseer's own venv: the one running the tests


def corpus(path: Path) -> Path:
    """The training text: 28 kB of words, the same on every node (a fixed seed)."""
    rnd = random.Random(1)
    words = "the a node store checkpoint env compile train loss step fresh restart cache layer torch model data"
    pick = words.split()
    path.write_text("\n".join(" ".join(rnd.choice(pick) for _ in range(12)) for _ in range(400)))
    return path


class TrainerNode(Node):
    """A node of one of the trainer jobs (`job/bootseer-<trainer>.toml` as its `bootseer.toml`)."""

    trainer: str = "hf"
    program_args: tuple[str, ...] = ()  # appended to the trainer's command line

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def create(self, requirements: str | None = None) -> TrainerNode:
        """A node that has never run the job: the job's files, empty cache and TMPDIR, no venv."""
        for d in (self.venv, self.work, self.cache, self.tmp):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        for f in ("hf_train.py", "lightning_train.py", "requirements.txt"):
            shutil.copy2(JOB / f, self.work / f)
        shutil.copy2(JOB / f"bootseer-{self.trainer}.toml", self.work / "bootseer.toml")
        corpus(self.work / "corpus.txt")
        self.venv_at.mkdir(parents=True, exist_ok=True)
        return self

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = super().env(extra)
        env.pop("PIP_CONFIG_FILE", None)  # the machine's pip configuration: torch from its disk
        env.update({"TMPDIR": str(self.tmp), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        return env

    def program(self, max_steps: int, out: str) -> list[str]:
        """The trainer's own command line, as its docs start it."""
        if self.trainer == "hf":
            torchrun = [str(self.venv_at / "bin" / "torchrun"), "--nproc-per-node", "2", "--master-port"]
            args = ["hf_train.py", "--data", "corpus.txt", "--output-dir", out, "--max-steps", str(max_steps)]
            return [*torchrun, str(free_port()), *args, *self.program_args]
        # Lightning's own launcher: `python lightning_train.py` starts the second rank itself
        args = ["lightning_train.py", "--data", "corpus.txt", "--ckpt-dir", out, "--max-steps", str(max_steps)]
        return [str(self.venv_at / "bin" / "python"), *args, *self.program_args]

    def train(self, max_steps: int, bootseer: bool = True, out: str | None = None, timeout: float = 900.0) -> Run:
        """One start of the job to `max_steps`, through `bootseer exec` or as the trainer alone; `out` is
        the checkpoint directory (default: the one bootseer.toml names)."""
        out = out or self.ckpt_dir
        argv = self.program(max_steps, out)
        command = [BOOTSEER, "exec", "--", *argv] if bootseer else argv
        return self.start(command=command, bootseer=False).wait(timeout)

    @property
    def ckpt_dir(self) -> str:
        return "out" if self.trainer == "hf" else "ckpt"

    def bootseer(self, *args: str) -> str:
        """`bootseer ARGS…` on this node (its store, config and venv); its stdout."""
        r = self.run_raw([BOOTSEER, *args])
        assert r.returncode == 0, f"bootseer {' '.join(args)}: {r.stderr[-2000:]}"
        return r.stdout

    def tags(self) -> list[str]:
        """The tags of this job's checkpoint in the store."""
        name = self.ckpt_name
        return [t["tag"] for t in json.loads(self.bootseer("ckpt", "ls", name, "--json")) if t.get("tag")]

    @property
    def ckpt_name(self) -> str:
        return "hf-tiny-gpt2" if self.trainer == "hf" else "lightning-tiny"

    def mounted_files(self, tag: str, where: Path) -> dict[str, tuple[int, str]]:
        """(mtime in ns, sha256) of every file of this job's checkpoint `tag` as `bootseer ckpt mount` shows
        it (mounted from this process's own mount namespace, so that it sees the mount, then unmounted)."""
        where.mkdir(parents=True)
        env = self.env()
        mount = [BOOTSEER, "ckpt", "mount", f"{self.ckpt_name}:{tag}", str(where)]
        r = subprocess.run(mount, env=env, cwd=self.work, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        try:
            files = [p for p in where.rglob("*") if p.is_file()]
            return {
                str(p.relative_to(where)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
                for p in files
            }
        finally:
            subprocess.run([BOOTSEER, "ckpt", "umount", str(where)], env=env, capture_output=True, timeout=120)

    def push_by_hand(self) -> None:
        self.bootseer("ckpt", "push", self.ckpt_dir, "--name", self.ckpt_name, "--tag", "by-hand")


def first_step_s(run: Run) -> float:
    """Seconds from the start to the end of the first training step (rank 0's `first-step` line)."""
    return float(run.one("first-step")["t"]) - run.started
