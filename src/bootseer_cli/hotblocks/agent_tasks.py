"""The hot-block agent tasks: "hot-record" (scan when the start is over, publish) and
"hot-prefetch" (finish a replay that the foreground deadline cut short, behind the program).

The image stage (stage.py) hands these to the agent (agent.py), which runs each in a thread and
names them by "module:function" in its `TASKS` table.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..events import record as record_event
from ..units import fmt_seconds
from .ready import parse_mode, wait_ready

if TYPE_CHECKING:
    from ..agent import Agent


def record_task(task: dict[str, Any], agent: Agent) -> None:
    """Wait until the launcher's start is over (`ready`), then scan the roots and publish the record."""
    from .record import publish, scan

    mode = parse_mode(task.get("ready", "quiet"))
    why = wait_ready(
        mode,
        agent.launcher_pid,
        agent.ready_file,
        alive=agent.launcher_alive,
        sleep=agent.wait,
        started=float(task.get("started") or time.time()),
    )
    t0 = time.time()
    rec = scan(str(task["image_key"]), [str(r) for r in task["roots"]])
    if not rec.extents:
        agent.log(f"hot-record: nothing resident under {rec.roots} ({why}); nothing published")
        return
    doc = publish(agent.store, rec)
    agent.log(
        f"hot-record ({why}): {len(rec.files)} files, {len(rec.extents)} extents, {rec.total_bytes} bytes "
        f"of {rec.roots_bytes} under the roots; published {doc['blob'][:12]}"
    )
    record_event(
        agent.run, "hot-record", t0, time.time(), "built", bytes=rec.total_bytes, reason=why, detail=doc["blob"]
    )


def prefetch_task(task: dict[str, Any], agent: Agent) -> None:
    """Read the extents the stage's deadline left (a JSON file in the run directory) until done or stopped."""
    from .replay import run

    path = Path(task["file"])
    work = [(str(p), int(o), int(n)) for p, o, n in json.loads(path.read_text())]
    t0 = time.time()
    res = run(work, threads=int(task.get("threads", 16)), mbps=float(task.get("mbps", 0.0)), stop=agent.stopping.is_set)
    agent.log(
        f"hot-prefetch: {res.bytes_read} bytes in {fmt_seconds(res.seconds)}, {len(res.remaining)} extents not read"
    )
    record_event(agent.run, "hot-prefetch", t0, time.time(), "done", bytes=res.bytes_read)
    path.unlink(missing_ok=True)
