"""The launcher's `sitecustomize`: detects the first optimizer step of a training program that never
calls `bootseer_cli.ready()`, so that `bootseer report` counts compile, data loading and the first step.

Why a sitecustomize: a real program (a nanoGPT-style script, the Hugging Face `Trainer`, Lightning) is
code nobody here wrote and nobody edits, and the report stopped at exec's hand-over without a signal
from it. `bootseer exec` copies this file to `<run dir>/pyhook/sitecustomize.py` and puts that private,
per-run directory first on the launcher's `PYTHONPATH`, so every Python process the launcher starts
(torchrun's workers, a `python train.py`) runs it at interpreter start-up.

Rules this file keeps, because it runs inside the job, in the job's own interpreter:

- Standard library only, nothing heavy at start-up: the job's interpreter is another venv, which has
  neither bootseer nor (yet) torch imported. It never imports torch or bootseer_cli itself.
- It never raises into the job: every step is guarded; at worst nothing is recorded.
- It hides nothing: the sitecustomize the interpreter would otherwise have imported (Debian's, the
  env's, the user's on `PYTHONPATH`) is the next one on `sys.path` after this directory; it is found
  there and executed, with the same warning `site` prints when one fails.
- A meta-path finder waits for the program to import `torch.optim.optimizer` (any trainer using a
  torch optimizer does), then registers a global optimizer step post-hook. Its first call (after
  the first `optimizer.step()` of any optimizer in the process: the HF `Trainer` and Lightning both
  call it) appends a `first_step` event to the run's `events.jsonl` (one O_APPEND write, as
  `bootseer_cli.events.append` does), and touches `ready` in the run dir, which the agent's tasks
  wait for, unless the program imported `bootseer_cli` (it then says `ready()` itself, the explicit
  signal). The finder leaves `sys.meta_path` once it has seen the module.
- The hook cannot unregister itself: torch calls it while iterating its OrderedDict of hooks, and
  removing an entry there raises "mutated during iteration" into the training step. After the first
  step it is a call that returns at once.

The run directory is this file's grandparent directory (never a path from the environment), so a
nested `bootseer exec` records into its own run. `[report] first_step = false` leaves it out.
"""

from __future__ import annotations

import os
import sys

WATCHED = "torch.optim.optimizer"
HOOK_DIR = os.path.dirname(os.path.abspath(__file__))
RUN_DIR = os.path.dirname(HOOK_DIR)
_state = {"seen": False}


def chain_sitecustomize() -> None:
    """Execute the sitecustomize that Python would have imported had this directory not come first."""
    try:
        rest = _path_after_hook_dir()
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        sys.modules["_bootseer_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as err:  # as site.execsitecustomize reports it: the job still starts
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}\n")


def _path_after_hook_dir() -> list[str]:
    """The `sys.path` entries after this directory: the ones before it held no sitecustomize (else
    Python would have imported that one), and searching only after it can never find this file again."""
    for i, entry in enumerate(sys.path):
        if os.path.abspath(entry or os.curdir) == HOOK_DIR:
            return sys.path[i + 1 :]
    return [p for p in sys.path if os.path.abspath(p or os.curdir) != HOOK_DIR]


class FirstStepFinder:
    """Sees the import of `torch.optim.optimizer` and registers the step hook once it has executed.

    A finder that returns None for every other name costs one call per import; it leaves
    `sys.meta_path` as soon as it has seen the module (or failed to).
    """

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name != WATCHED:
            return None
        _leave_meta_path(self)
        try:
            spec = _spec_from_others(self, name, path, target)
            loader = getattr(spec, "loader", None)
            exec_module = getattr(loader, "exec_module", None)
            if exec_module is None:
                return spec

            def exec_then_hook(module: object) -> None:
                exec_module(module)
                register_step_hook(module)

            loader.exec_module = exec_then_hook  # type: ignore[union-attr]
            return spec
        except Exception:  # the import goes on through the other finders, unhooked
            return None


def _leave_meta_path(finder: object) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]


def _spec_from_others(finder: object, name: str, path: object, target: object) -> object:
    for other in list(sys.meta_path):
        find = getattr(other, "find_spec", None)
        if other is finder or find is None:
            continue
        spec = find(name, path, target)
        if spec is not None:
            return spec
    return None


def register_step_hook(module: object) -> None:
    """Register the global optimizer step post-hook (torch ≥ 2.0 has it; an older torch: nothing)."""
    try:
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is not None:
            register(_after_step)
    except Exception:
        pass


def _after_step(optimizer: object, args: object, kwargs: object) -> None:
    """The global post-hook: the first call records the first step, every later one returns at once."""
    if _state["seen"]:
        return
    _state["seen"] = True
    try:
        record_first_step(__import__("time").time())
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
        **{"stage": "first_step", "start": start, "end": at, "duration_s": max(0.0, at - start), "outcome": "ok"},
        **{"cache": "", "bytes": 0, "bytes_from_store": 0, "bytes_from_peers": 0, "reason": ""},
        "detail": f"first optimizer step, local rank {local_rank}",
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


def _number(text: str | None, default: float) -> float:
    try:
        return float(text or default)
    except ValueError:
        return default


def _touch(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def install() -> None:
    """What the launcher's interpreter runs at start-up: the hidden sitecustomize, then the finder."""
    chain_sitecustomize()
    try:
        if WATCHED in sys.modules:  # never at start-up; kept for a program that execs this file late
            register_step_hook(sys.modules[WATCHED])
        else:
            sys.meta_path.insert(0, FirstStepFinder())  # type: ignore[arg-type]
    except Exception:
        pass


if __name__ == "sitecustomize":
    install()
