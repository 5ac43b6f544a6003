"""Run `bootseer` with the image stage's parts timed: for a benchmark's timeline (`--trace-stage`).

    python tests/benchmarks/stage_trace.py exec -c bootseer.toml -- python -c "import torch"

Each wrapped call prints `stage-trace <monotonic s> <enter|leave> <name>` on stderr, on the system's
monotonic clock, so a benchmark that samples the machine on the same clock can place the stage's parts
on its timeline. Nothing else changes: the command then runs as `bootseer` would run it.
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from typing import Any

PARTS = {
    "bootseer_cli.hotblocks.stage": [
        "run_stage",
        "_start_check",
        "_mostly_stale",
        "_skip_before_load",
        "_from_ref",
        "_replay",
        "_warm_metadata",
        "_judge_later",
        "_hand_on_remaining",
        "probe_roots",  # imported by name at stage.py's import: wrapped where stage.py looks it up
    ],
    "bootseer_cli.hotblocks.record": ["load", "from_deps"],
    "bootseer_cli.hotblocks.loadercache": ["decide", "known_to_keep", "judge", "_read_cached"],
    "bootseer_cli.hotblocks.replay": ["run", "cut", "plan"],
}


def _say(what: str, name: str) -> None:
    print(f"stage-trace {time.monotonic():.4f} {what} {name}", file=sys.stderr, flush=True)


def _wrap(owner: Any, attr: str, name: str) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        _say("enter", name)
        try:
            return fn(*args, **kwargs)
        finally:
            _say("leave", name)

    setattr(owner, attr, timed)


def main() -> None:
    _say("enter", "process")
    for module, names in PARTS.items():
        mod = importlib.import_module(module)
        for attr in names:
            _wrap(mod, attr, f"{module.rsplit('.', 1)[1]}.{attr}")
    # stage.py imports these by name inside its functions: patching the modules they come from (above)
    # is enough. The eager imports here move some import time before the stage: a trace, not a timing.
    freshness = importlib.import_module("bootseer_cli.hotblocks.freshness")
    _wrap(freshness.Check, "wait", "Check.wait")
    _wrap(freshness.Check, "agrees", "Check.agrees")
    _say("leave", "imports")
    from bootseer_cli.entry import main as entry

    sys.argv = ["bootseer", *sys.argv[1:]]
    entry()


if __name__ == "__main__":
    main()
