"""The "compile-publish" agent task: publish the run's compile caches once the start is over, and
again when the launcher ends (what later steps compiled: a first eval, a new shape).

Its spec, `PublishTask` (made by the stage): the compile key, the baseline (a file in the run
directory, which also names the cache roots), max_bytes, ready (the `[image] ready` mode: when the
start is over), started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BootseerError
from ..events import record as record_event
from ..hotblocks.ready import parse_mode, wait_ready
from ..units import fmt_bytes
from .publish import publish
from .tree import Baseline

if TYPE_CHECKING:
    from ..agent import Agent


@dataclass(frozen=True)
class PublishTask:
    key: str  # the compile key's digest
    baseline: str
    max_bytes: int
    ready: str | float = "quiet"
    started: float = 0.0  # when the stage started timing (0: when the task starts)


def _publish_once(task: PublishTask, agent: Agent, base: Baseline, why: str) -> None:
    t0 = time.time()
    roots = {k: Path(v) for k, v in base.roots.items()}
    try:
        res = publish(agent.store, task.key, agent.run.node, roots, base, task.max_bytes)
    except (BootseerError, OSError) as e:  # the next start compiles again; the job is not affected
        agent.log(f"compile-publish ({why}): failed: {e}")
        record_event(agent.run, "compile-publish", t0, time.time(), "failed", reason=str(e))
        return
    if not res.shard:
        agent.log(f"compile-publish ({why}): nothing new to publish")
        return
    agent.log(
        f"compile-publish ({why}): {res.files} file(s), {fmt_bytes(res.bytes)} published, {res.refreshed} refreshed; "
        f"index {res.entries} entries, {fmt_bytes(res.total_bytes)}, {res.pruned} pruned"
    )
    record_event(
        agent.run,
        "compile-publish",
        t0,
        time.time(),
        "built",
        bytes=res.bytes,
        reason=why,
        detail=res.shard,
        files=res.files,
        refreshed=res.refreshed,
        pruned=res.pruned,
    )


def publish_task(task: PublishTask, agent: Agent) -> None:
    base = Baseline.load(Path(task.baseline))
    why = wait_ready(
        parse_mode(task.ready),
        agent.launcher_pid,
        agent.ready_file,
        alive=agent.launcher_alive,
        sleep=agent.wait,
        started=float(task.started or time.time()),
    )
    _publish_once(task, agent, base, why)
    if why != "exit":
        agent.stopping.wait()  # set when the launcher ends (or the agent is told to stop)
        _publish_once(task, agent, base, "exit")
    Path(task.baseline).unlink(missing_ok=True)
