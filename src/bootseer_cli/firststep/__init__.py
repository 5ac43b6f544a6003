"""The first training step without `ready()`: what `bootseer exec` adds to the launcher's environment.

A training program rarely calls `bootseer_cli.ready()`, and then the report's startup ended at exec's
hand-over, leaving out the compile phase, data loading and the first step (the largest costs of a
real start). exec therefore writes `sitehook.py` as `sitecustomize.py`, and `steprecord.py` beside it,
into `<run dir>/pyhook` (the run directory is private, 0700, and new for each run: no shared or
predictable path is put on the path) and puts that directory first on the launcher's `PYTHONPATH`.
What the hook does, and why it is standalone code, is in `sitehook` and `steprecord`.
`[report] first_step = false` leaves the launcher's environment as it was.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..events import RunInfo
    from ..settings import Settings

HOOK_DIR = "pyhook"
# What exec writes into the hook directory: the start-up stub, and the recorder it loads only in a
# process that imports torch's optimizers (the name `sitehook.RECORDER` looks for).
HOOK_FILES = {"sitecustomize.py": "sitehook.py", "_bootseer_first_step.py": "steprecord.py"}


def launcher_pythonpath(run: RunInfo, settings: Settings, env: Mapping[str, str]) -> dict[str, str]:
    """`{"PYTHONPATH": <hook dir>[:<the launcher's own PYTHONPATH>]}`, or `{}` when the detection is
    off or the hook cannot be written (the job then starts as it would have, only measured to exec).

    No empty entry is added: an empty `PYTHONPATH` element means the working directory.
    """
    if not settings.report.first_step or run.memory is not None:
        return {}
    hook_dir = run.run_dir / HOOK_DIR
    try:
        hook_dir.mkdir(mode=0o700)
        for name, source in HOOK_FILES.items():
            fd = os.open(hook_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(Path(__file__).with_name(source).read_bytes())
    except OSError:
        return {}
    before = env.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(hook_dir) + (os.pathsep + before if before else "")}
