"""bootseer: cut the startup time of distributed training jobs.

The public API for training code is small: `ready()` marks the end of startup (first step done), and
`bootseer_cli.ckpt.push(dir, name, tag)` stores a checkpoint in the striped layout.
"""

from __future__ import annotations

import os
import time

__version__ = "0.1.0"
__all__ = ["__version__", "ready"]

_ready_sent = False


def ready() -> None:
    """Tell bootseer that startup is over (call it after the first training step).

    It closes the launcher's startup window in `bootseer report` and tells the agent when to take
    the hot-block record. Outside `bootseer exec` it does nothing; it never raises.
    """
    global _ready_sent
    run_dir = os.environ.get("BOOTSEER_RUN_DIR")
    if _ready_sent or not run_dir:
        return
    _ready_sent = True
    try:
        from pathlib import Path

        from .events import RunInfo, record

        run = RunInfo.load(Path(run_dir))
        start = float(os.environ.get("BOOTSEER_EXEC_TIME") or time.time())
        local_rank = os.environ.get("LOCAL_RANK", "0")
        record(run, "ready", start, time.time(), "ok", detail=f"local rank {local_rank}", local_rank=local_rank)
        (Path(run_dir) / "ready").touch()
    except Exception:  # never break a training script over bookkeeping
        pass
