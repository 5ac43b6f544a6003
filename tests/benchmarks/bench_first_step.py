"""What the launcher's first-step hook (`bootseer_cli.firststep`) costs a Python process of the job.

    python tests/benchmarks/bench_first_step.py [--runs 9]

Side by side in one run, alternating, for `python -c pass` and `python -c "import torch"`: the
interpreter with and without the hook directory first on `PYTHONPATH`. Wall time is what a job
sees but is noisy on a shared machine; `-X importtime`'s cumulative time of `sitecustomize` (the
hook's own start-up, or Python's failed lookup without it) is the steady figure. Both with bytecode
cached (the usual case) and with `PYTHONDONTWRITEBYTECODE=1` (many container images). The recorder,
loaded only where torch's optimizers are imported, is timed on its own. Medians of `--runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bootseer_cli.events import RunInfo
from bootseer_cli.firststep import HOOK_DIR, launcher_pythonpath
from bootseer_cli.settings import Settings


def _hook_env(tmp: Path, name: str) -> dict[str, str]:
    """A fresh run directory and its hook (each mode its own: a cached pyc would be read by the other)."""
    run_dir = tmp / name
    run_dir.mkdir(mode=0o700)
    run = RunInfo(job="bench", node="n", rank=0, run="r", run_dir=run_dir)
    (run_dir / "run.json").write_text(json.dumps(run.as_dict()))
    return launcher_pythonpath(run, Settings(), {})


def _site_ms(env: dict[str, str], code: str) -> float:
    """The cumulative import time of `sitecustomize` in a fresh interpreter (ms)."""
    cmd = [sys.executable, "-X", "importtime", "-c", code]
    err = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    found = re.findall(r"import time:\s+\d+ \|\s+(\d+) \|\s+sitecustomize$", err, re.M)
    return sum(int(us) for us in found) / 1000


def _wall_ms(env: dict[str, str], code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return (time.perf_counter() - start) * 1000


def _recorder_ms(hook_dir: Path, runs: int) -> float:
    """Loading the recorder as the hook does (spec from its file, then exec), in this process, compiled
    each time (no bytecode written): the worst case, paid once per process that imports torch.optim."""
    from importlib.util import module_from_spec, spec_from_file_location

    sys.dont_write_bytecode = True
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        spec = spec_from_file_location("_bootseer_first_step", hook_dir / "_bootseer_first_step.py")
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(module_from_spec(spec))
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        plain = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "PYTHON"))}
        print(f"load average {os.getloadavg()[0]:.1f}; {sys.executable}; medians of {runs}")
        for bytecode in (True, False):
            hook = _hook_env(Path(tmp), "cached" if bytecode else "uncached")
            base = dict(plain) if bytecode else {**plain, "PYTHONDONTWRITEBYTECODE": "1"}
            sides = {"without": base, "with": {**base, **hook}}
            for code in ("pass", "import torch"):
                for env in sides.values():
                    _site_ms(env, code)  # writes the bytecode where allowed
                got: dict[str, list[float]] = {f"{k} {n}": [] for k in ("site", "wall") for n in sides}
                for _ in range(runs):
                    for name, env in sides.items():
                        got[f"site {name}"].append(_site_ms(env, code))
                        got[f"wall {name}"].append(_wall_ms(env, code))
                m = {k: statistics.median(v) for k, v in got.items()}
                print(
                    f"{code!r:15} {'pyc cached' if bytecode else 'no bytecode':12} sitecustomize "
                    f"{m['site without']:.2f} → {m['site with']:.2f} ms; wall {m['wall without']:.0f} → "
                    f"{m['wall with']:.0f} ms"
                )
        _hook_env(Path(tmp), "recorder")
        print(f"recorder load, compiled: {_recorder_ms(Path(tmp) / 'recorder' / HOOK_DIR, runs):.2f} ms")


if __name__ == "__main__":
    main()
