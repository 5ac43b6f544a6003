"""The "compile-publish" agent task: publish the run's compile caches once the start is over, and
again when the launcher ends (what later steps compiled: a first eval, a new shape).

Task parameters (set by the stage): key, roots (cache name -> directory), baseline (a file in the
run directory), max_bytes, ready (the `[image] ready` mode: when the start is over), started.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from ..events import record as record_event
from ..hotblocks.ready import parse_mode, wait_ready
from ..units import fmt_bytes
from .publish import publish
from .tree import Baseline

if TYPE_CHECKING:
    from ..agent import Agent


def _publish_once(task: dict[str, Any], agent: Agent, base: Baseline, why: str) -> None:
    t0 = time.time()
    roots = {k: Path(v) for k, v in base.roots.items()}
    try:
        res = publish(agent.store, str(task["key"]), agent.run.node, roots, base, int(task["max_bytes"]))
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


def publish_task(task: dict[str, Any], agent: Agent) -> None:
    base = Baseline.load(Path(task["baseline"]))
    why = wait_ready(
        parse_mode(task.get("ready", "quiet")),
        agent.launcher_pid,
        agent.ready_file,
        alive=agent.launcher_alive,
        sleep=agent.wait,
        started=float(task.get("started") or time.time()),
    )
    _publish_once(task, agent, base, why)
    if why != "exit":
        agent.stopping.wait()  # set when the launcher ends (or the agent is told to stop)
        _publish_once(task, agent, base, "exit")
    Path(task["baseline"]).unlink(missing_ok=True)
