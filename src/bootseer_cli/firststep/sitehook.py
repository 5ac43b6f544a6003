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
- It costs the job's other processes next to nothing: a meta-path finder looks at each import's
  name until the program imports `torch.optim.optimizer` (any trainer using a torch optimizer does:
  a plain loop, the HF `Trainer` and Lightning all call `optimizer.step()`), then leaves
  `sys.meta_path` and loads the recorder beside this file (`steprecord`), which registers a global
  optimizer step post-hook. No `from __future__` import and no annotation that an older
  interpreter would evaluate and reject: the job's Python may be older than bootseer's.

`[report] first_step = false` leaves it out.
"""

import os
import sys

WATCHED = "torch.optim.optimizer"
RECORDER = "_bootseer_first_step.py"  # `steprecord`, copied beside this file by exec
HOOK_DIR = os.path.dirname(os.path.abspath(__file__))


def chain_sitecustomize() -> None:
    """Execute the sitecustomize that Python would have imported had this directory not come first."""
    try:
        rest = _path_after_hook_dir()
        # The import system's own classes, loaded before site runs: importing importlib.machinery and
        # importlib.util instead would add about half a millisecond to every Python process of the job.
        bootstrap = sys.modules.get("_frozen_importlib") or __import__("importlib.util").util
        path_finder = getattr(sys.modules.get("_frozen_importlib_external"), "PathFinder", None)
        if path_finder is None:
            import importlib.machinery

            path_finder = importlib.machinery.PathFinder
        spec = path_finder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = bootstrap.module_from_spec(spec)
        sys.modules["_bootseer_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as err:  # as site.execsitecustomize reports it: the job still starts
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}\n")


def _path_after_hook_dir() -> "list[str]":
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
        sys.meta_path.remove(finder)


def _spec_from_others(finder: object, name: str, path: object, target: object) -> object:
    for other in list(sys.meta_path):
        find = getattr(other, "find_spec", None)
        if other is finder or find is None:
            continue
        spec = find(name, path, target)
        if spec is not None:
            return spec
    return None


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


def register_step_hook(module: object) -> None:
    """Load the recorder beside this file and register its step hook: only a process that imports
    torch's optimizers compiles that code; every other Python process of the job runs this file alone."""
    try:
        from importlib.util import module_from_spec, spec_from_file_location

        spec = spec_from_file_location("_bootseer_first_step", os.path.join(HOOK_DIR, RECORDER))
        recorder = module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(recorder)  # type: ignore[union-attr]
        recorder.register(module)
    except Exception:
        pass


if __name__ == "sitecustomize":
    install()
