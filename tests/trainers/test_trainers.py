"""Two public trainers the project does not write, started as their docs say and through `bootseer exec`:
the Hugging Face `Trainer` (a tiny GPT-2 under `torchrun`, `output_dir` with `checkpoint-N/`,
`resume_from_checkpoint`) and PyTorch Lightning (`Trainer(accelerator="cpu", devices=2, strategy="ddp")`
under its own launcher, `ModelCheckpoint(save_last=True)`, `fit(ckpt_path="last")`). Their env is a venv
the setup makes and fills from the package index; bootseer runs from its own venv (issue 44 item 5).

Each trainer's scenario (scenario.py) runs once: cold start, restart, fresh node, and the trainer alone.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.e2e.harness import env_kind
from tests.trainers.harness import VENV_AT
from tests.trainers.scenario import SAVE_EVERY, Scenario, begin_step, losses, tail

# a scenario runs in its first test's setup: the env's setup (40 s quiet, 240 s seen on a loaded machine), 4 starts
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
SITE = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"


def extra_of(event: dict[str, Any]) -> dict[str, Any]:
    """An event's stage-specific facts (`extra`, a JSON object as events.record writes it)."""
    extra = event.get("extra") or {}
    return json.loads(extra) if isinstance(extra, str) else extra


def test_every_start_trains(scenario: Scenario) -> None:
    for name, run in {**scenario.starts, "plain": scenario.plain}.items():
        assert run.rc == 0, f"{name}:\n{tail(run)}"
        assert not run.leftover, f"{name}: processes left running after the job: {run.leftover}"
    assert sorted(losses(scenario.plain)) == list(range(1, 3 * SAVE_EVERY + 1)), tail(scenario.plain)


def test_cold_start_sets_up_the_env_and_trains_from_scratch(scenario: Scenario) -> None:
    cold = scenario.cold
    # the session's first job builds the env; the other job has the same [env] and restores it
    assert env_kind(cold) in ("built", "restored"), tail(cold)
    assert ("Successfully installed" in cold.output) == (env_kind(cold) == "built")
    assert begin_step(cold) == 0
    assert losses(cold) == {s: losses(scenario.plain)[s] for s in range(1, SAVE_EVERY + 1)}, tail(cold)


def test_restart_finds_the_env_and_resumes(scenario: Scenario) -> None:
    restart = scenario.restart
    assert env_kind(restart) == "hit", tail(restart)
    assert begin_step(restart) == SAVE_EVERY, tail(restart)
    plain = losses(scenario.plain)
    assert losses(restart) == {s: plain[s] for s in range(SAVE_EVERY + 1, 2 * SAVE_EVERY + 1)}, tail(restart)


def test_fresh_node_restores_the_env(scenario: Scenario) -> None:
    fresh = scenario.fresh
    assert env_kind(fresh) == "restored", tail(fresh)
    assert "Successfully installed" not in fresh.output
    # the venv the setup made on n1, on n2 where no setup ran (each node's own directory, bound at VENV_AT)
    for rel in ("bin/python", "pyvenv.cfg", f"{SITE}/torch/version.py", f"{SITE}/transformers/__init__.py"):
        assert (scenario.n2.venv / rel).read_bytes() == (scenario.n1.venv / rel).read_bytes(), rel


def test_compile_stage_reads_the_jobs_env(scenario: Scenario) -> None:
    """The compile stage engages on every start, with the torch of the job's venv (not bootseer's own)."""
    for name, run in scenario.starts.items():
        event = run.stage("compile")
        assert event["outcome"] in ("miss", "hit"), f"{name}: {event}\n{tail(run)}"
        extra = extra_of(event)
        assert str(extra.get("python", "")).startswith(str(VENV_AT)), f"{name}: {extra}"
        assert extra.get("torch") == "2.13.0+cpu", f"{name}: {extra}"


def test_first_training_step_is_detected_without_ready(scenario: Scenario) -> None:
    """Neither program calls bootseer_cli.ready(): the start still ends at the first training step."""
    for name, run in scenario.starts.items():
        assert [e for e in run.events if e.get("stage") == "first_step" and e.get("outcome") == "ok"], (
            f"{name}: {[e.get('stage') for e in run.events]}"
        )


def test_first_start_save_is_pushed(scenario: Scenario) -> None:
    """The job's first start has no tag to mount: what its trainer saves is pushed all the same."""
    assert not scenario.pushed_by_hand, (
        "the cold start's save into its checkpoint directory never reached the store:\n" + tail(scenario.cold)
    )


def test_restart_saves_into_the_mounted_directory_and_it_is_pushed(scenario: Scenario) -> None:
    """The trainer's own checkpoint directory is bootseer's: mounted from `latest`, written by the trainer
    (its next save), and that save is pushed as a new tag that `latest` then names."""
    for name in ("restart", "fresh"):
        run = scenario.starts[name]
        event = run.stage("checkpoint")
        assert event["outcome"] in ("mounted", "pulled"), f"{name}: {event}\n{tail(run)}"
    pushed = scenario.restart.stage("ckpt-writeback")
    assert pushed["outcome"] == "pushed", pushed
    mounted = extra_of(scenario.fresh.stage("checkpoint"))["checkpoint"]
    assert mounted == pushed["detail"], "the fresh node's `latest` is not the restart's save"


def test_mounted_checkpoint_keeps_the_order_of_its_saves(scenario: Scenario) -> None:
    """A trainer may pick its checkpoint by modification time: Lightning's `ckpt_path="last"` takes the newest
    of the `last*.ckpt` files, and a node whose directory is not the saver's writes `last-v1.ckpt` beside the
    `last.ckpt` it resumed from. Where the mount shows one mtime for every file, the next node's ranks each
    pick one of the two (a set's order: the bench saw rank 0 resume from step 4, rank 1 from step 8, and
    gloo fail). In the tag the fresh node's save was pushed as, what it wrote is newer than what it carried
    unchanged from the tag it resumed from, and a carried file keeps its mtime."""
    parent = extra_of(scenario.fresh.stage("checkpoint"))["checkpoint"].split(":", 1)[1]
    pushed = scenario.fresh.stage("ckpt-writeback")["detail"].split(":", 1)[1]
    root = scenario.n2.root / "mtimes"
    old = scenario.n2.mounted_files(parent, root / "parent")
    new = scenario.n2.mounted_files(pushed, root / "pushed")
    carried = {f: new[f][0] for f in new if f in old and old[f][1] == new[f][1]}
    written = {f: new[f][0] for f in new if f not in carried}
    assert written and carried, f"pushed {sorted(new)}, parent {sorted(old)}"
    assert {f: old[f][0] for f in carried} == carried, "a carried file's mtime changed"
    assert min(written.values()) > max(carried.values()), f"saved by the fresh node {written}, carried {carried}"


def test_fresh_node_resumes_from_latest_with_the_same_losses(scenario: Scenario) -> None:
    fresh = scenario.fresh
    assert begin_step(fresh) == 2 * SAVE_EVERY, tail(fresh)
    plain = losses(scenario.plain)
    assert losses(fresh) == {s: plain[s] for s in range(2 * SAVE_EVERY + 1, 3 * SAVE_EVERY + 1)}, tail(fresh)
