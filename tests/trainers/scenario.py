"""The scenario both trainer tests assert on, run once per module: a cold start, a restart on the same node,
a fresh node, and the trainer alone (no bootseer, uninterrupted) as the reference for the losses.

- cold start on n1: the job's first start (its env built by the setup, or restored when the other
  trainer's job built it first: both share one [env]); trains steps 1-4 and saves step 4 into its
  checkpoint directory, which the agent pushes as the checkpoint's first tag (where it does not, the
  scenario pushes it with `bootseer ckpt push`, as a user would, so that the later starts still test
  the resume, and a test says so);
- restart on n1: the env is present, the checkpoint directory resumes from `latest` (step 4) and saves step 8;
- fresh node n2 (its own cache and TMPDIR, no venv): the env restored from the store, the compile stage in
  the restored env, the checkpoint resumed from `latest` (step 8): steps 9-12;
- the trainer alone on n1, steps 1-12 in a directory of its own: the losses every start must reproduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tests.e2e.harness import Run
from tests.trainers.harness import TrainerNode

SAVE_EVERY = 4  # both programs save every 4 steps by default


@dataclass
class Scenario:
    n1: TrainerNode
    n2: TrainerNode
    cold: Run
    restart: Run
    fresh: Run
    plain: Run
    pushed_by_hand: bool  # the cold start's save was not in the store: pushed with `bootseer ckpt push`

    @property
    def starts(self) -> dict[str, Run]:
        """The starts through bootseer, by name."""
        return {"cold": self.cold, "restart": self.restart, "fresh": self.fresh}


def run_scenario(node: Callable[[str], TrainerNode]) -> Scenario:
    n1 = node("n1")
    cold = n1.train(SAVE_EVERY)
    pushed_by_hand = not n1.tags()
    if pushed_by_hand:  # what a user does once where the first start's save is not pushed for them
        n1.push_by_hand()
    restart = n1.train(2 * SAVE_EVERY)
    n2 = node("n2")
    fresh = n2.train(3 * SAVE_EVERY)
    plain = n1.train(3 * SAVE_EVERY, bootseer=False, out="plain-out")
    return Scenario(n1, n2, cold, restart, fresh, plain, pushed_by_hand)


def losses(run: Run) -> dict[int, float]:
    return {int(d["step"]): float(d["loss"]) for d in run.train("step")}


def begin_step(run: Run) -> int:
    """The global step the trainer began at: 0 on a fresh start, the checkpoint's step on a resume."""
    return int(run.one("begin")["step"])


def tail(run: Run) -> str:
    return run.output[-5000:]
