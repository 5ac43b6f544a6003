"""The first optimizer step's recorder, loaded by the launcher's sitecustomize (`sitehook`) only in a
process that imports torch's optimizers; `bootseer exec` copies it beside it as `_bootseer_first_step.py`.

Standard library only and never raising, for the reasons in `sitehook`. It registers a global
optimizer step post-hook (torch >= 2.0; an older torch gets nothing). The hook's first call appends a
`first_step` event to the run's `events.jsonl` (one O_APPEND write, as `bootseer_cli.events.append`
does) and touches `ready` in the run dir, which the agent's tasks wait for, unless the program imported
`bootseer_cli` (it then says `ready()` itself, the explicit signal). The hook cannot unregister
itself: torch calls it while iterating its OrderedDict of hooks, and removing an entry there raises
"mutated during iteration" into the training step; after the first step it returns at once.

The run directory is this file's grandparent (never a path from the environment), so a nested
`bootseer exec` records into its own run.
"""

import os
import sys
import time

RUN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE = "first_step"
_state = {"seen": False}


def register(module: object) -> None:
    """Register the hook on `torch.optim.optimizer`, just executed."""
    add = getattr(module, "register_optimizer_step_post_hook", None)
    if add is not None:
        add(after_step)


def after_step(optimizer: object, args: object, kwargs: object) -> None:
    """The global post-hook: the first call records the first step, every later one returns at once."""
    if _state["seen"]:
        return
    _state["seen"] = True
    try:
        record_first_step(time.time())
    except Exception:  # a full disk, a removed run dir: the training step goes on unrecorded
        return


def record_first_step(at: float) -> None:
    """Append this process's `first_step` event to the run's events and, unless the program signals
    `ready()` itself, touch the run's `ready` file (the agent's tasks end their wait on it)."""
    import json

    with open(os.path.join(RUN_DIR, "run.json"), encoding="utf-8") as f:
        run = json.load(f)
    start = at
    if os.environ.get("BOOTSEER_RUN_DIR") == RUN_DIR:  # exec's hand-over time, as ready() takes it
        start = min(at, _number(os.environ.get("BOOTSEER_EXEC_TIME"), at))
    local_rank = os.environ.get("LOCAL_RANK", "0")
    extra = {"local_rank": local_rank, "pid": os.getpid(), "signal": "optimizer step"}
    if os.environ.get("RANK"):
        extra["global_rank"] = os.environ["RANK"]
    event = {
        **{k: run[k] for k in ("job", "node", "rank", "run")},
        **{"stage": STAGE, "start": start, "end": at, "duration_s": max(0.0, at - start), "outcome": "ok"},
        **{"cache": "", "bytes": 0, "bytes_from_store": 0, "bytes_from_peers": 0, "reason": ""},
        "detail": "first optimizer step, local rank " + local_rank,
        "extra": json.dumps(extra, sort_keys=True),
    }
    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    fd = os.open(os.path.join(RUN_DIR, "events.jsonl"), flags, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    if "bootseer_cli" not in sys.modules:
        _touch(os.path.join(RUN_DIR, "ready"))


def _number(text: object, default: float) -> float:
    try:
        return float(text or default)  # type: ignore[arg-type]
    except ValueError:
        return default


def _touch(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.utime(fd)
    finally:
        os.close(fd)
