"""Which Python the launcher runs, and which torch (and Triton) it imports: read in the job's env.

bootseer lives in a venv of its own; the job's env is another one (often made by the env stage just
before the compile stage). A compile key read from bootseer's own interpreter names no torch, or
another torch than the job's (issue 44): a cache keyed for the wrong version. So the interpreter is
the launcher's, found as `exec` will run it:

- `[compile] python` when set (the escape hatch for a launcher that is not a Python program);
- else the launcher, resolved on the launcher's PATH (`launcher.resolve_command`), looking through
  `env [NAME=VALUE…]`: a `python…` executable is the interpreter; a script names it in its shebang
  (`#!/opt/venv/bin/python`, `#!/usr/bin/env python3` looked up on that PATH, and pip's
  `#!/bin/sh` + `'''exec' "…/python" "$0" "$@"` form that it writes for long paths).

A shell (`sh -c …`, `bash run.sh`) or a binary is not a Python program: which Python it runs is not
known, and the answer says so. There is never a fallback to bootseer's own interpreter.

The versions come from running that interpreter once, with the launcher's environment (its
PYTHONPATH, user site and `.pth` files count, as for the job), on a few lines that list the
distributions on its `sys.path` in order and read the first `torch` and Triton `METADATA`. torch is
never imported (seconds); the run costs one interpreter start (~15-30 ms), paid only when the
compile stage is wanted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..settings import Settings

PROBE_TIMEOUT_S = 30.0  # an interpreter start that takes longer is broken (a hanging sitecustomize)
HINT = "set [compile] python (BOOTSEER_COMPILE_PYTHON) to the job's interpreter"
_PYTHON = re.compile(r"^(?:python|pypy)[0-9.]*(?:t|d|-dbg)?$")
_SHELL = re.compile(r"^(?:sh|bash|dash|zsh|ksh|ash|busybox)$")
# pip (and uv) write this two-line launcher when the interpreter's path is too long for a shebang
_PIP_SH = re.compile(r"^'''exec' (?:\"([^\"]+)\"|(\S+)) ")
_MARK = "BOOTSEER-PROBE "
# Runs in the job's interpreter (any Python 3): the first torch and Triton distributions on sys.path,
# as importlib.metadata finds them, without importing it (nor torch).
_PROBE = r"""
import json, os, sys
want = {"torch": "torch", "triton": "triton", "pytorch_triton": "triton", "pytorch_triton_rocm": "triton",
        "pytorch_triton_xpu": "triton"}
found = {}
for d in sys.path:
    if not d or not os.path.isdir(d):
        continue
    for n in sorted(os.listdir(d)):
        stem, ext = os.path.splitext(n)
        name = stem.split("-")[0].lower().replace(".", "_")
        if ext not in (".dist-info", ".egg-info") or name not in want or want[name] in found:
            continue
        meta = os.path.join(d, n, "METADATA" if ext == ".dist-info" else "PKG-INFO")
        try:
            with open(meta, encoding="utf-8", errors="replace") as f:
                head = f.read(4096)
        except OSError:
            continue
        for line in head.splitlines():
            if line.startswith("Version:"):
                found[want[name]] = line.split(":", 1)[1].strip()
                break
print("BOOTSEER-PROBE " + json.dumps({"python": sys.executable, "torch": found.get("torch"),
                                      "triton": found.get("triton")}))
"""


@dataclass(frozen=True)
class JobTorch:
    """What the job's interpreter holds. `python` is None when no interpreter was found (`how` says why);
    `problem` says why its distributions could not be read."""

    python: str | None
    how: str  # "resolved from torchrun's shebang", "[compile] python", …; or why none was found
    torch: str | None = None
    triton: str | None = None
    problem: str = ""

    def where(self) -> str:
        """`/opt/job/venv/bin/python, resolved from torchrun's shebang` (for keys, doctor, the stage)."""
        return f"{self.python}, {self.how}"

    def why_none(self, hint: bool = False) -> str:
        """Why there is no compile key (torch is None); with `hint`, the way out when no interpreter was read."""
        if self.python is None:
            return f"no Python interpreter found: {self.how}" + (f"; {HINT}" if hint else "")
        if self.problem:
            return f"cannot read the distributions of {self.where()}: {self.problem}"
        return f"torch is not installed in {self.where()}"

    def facts(self) -> dict[str, str | None]:
        """What the stage's event records of it (the report, `bootseer keys --json`)."""
        return {"python": self.python, "python_from": self.how, "torch": self.torch, "triton": self.triton}


def find_interpreter(
    command: Sequence[str], environ: Mapping[str, str], configured: Path | None = None
) -> tuple[str | None, str]:
    """(the interpreter the launcher runs, how it was found), or (None, why not)."""
    if configured is not None:
        return str(configured), "set by [compile] python"
    if not command:
        found = _on_path("python3", environ)
        if found is None:
            return None, "no launcher given, and no python3 on PATH"
        return found, "the python3 on PATH (no launcher given: pass it after --)"
    return _from_command(list(command), environ)


def _on_path(name: str, environ: Mapping[str, str]) -> str | None:
    from ..launcher import resolve_command

    try:
        return resolve_command([name], environ)
    except BootseerError:
        return None


def _skip_env(argv: list[str]) -> list[str]:
    """`env [-i] [-u NAME] [NAME=VALUE…] cmd …` -> `cmd …` (what env runs)."""
    if not argv or os.path.basename(argv[0]) != "env":
        return argv
    rest = argv[1:]
    while rest and (rest[0].startswith("-") or "=" in rest[0]):
        rest = rest[2:] if rest[0] in ("-u", "--unset", "-C", "--chdir") else rest[1:]
    return rest


def _from_command(argv: list[str], environ: Mapping[str, str]) -> tuple[str | None, str]:
    from ..launcher import resolve_command

    argv = _skip_env(argv)
    if not argv:
        return None, "the launcher is `env` with no command"
    name = argv[0]
    try:
        exe = resolve_command(argv, environ)
    except BootseerError as e:
        return None, f"the launcher was not found ({e})"
    base = os.path.basename(exe)
    if _PYTHON.match(base):
        return exe, f"the launcher {name}" if name == exe else f"the launcher {name}, at {exe}"
    if _SHELL.match(base):
        return None, f"the launcher {name} is a shell, not a Python program"
    return _from_shebang(name, exe, environ)


def _from_shebang(name: str, exe: str, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The interpreter a script's first line (or pip's two-line shell launcher) names."""
    try:
        with open(exe, "rb") as f:
            head = f.read(1024)
    except OSError as e:
        return None, f"cannot read the launcher {exe} ({e.strerror or e})"
    if not head.startswith(b"#!"):
        kind = "a binary" if head.startswith(b"\x7fELF") else "not a script"
        return None, f"the launcher {exe} is {kind}, not a Python program"
    lines = head.decode("utf-8", "replace").splitlines()
    words = lines[0][2:].split()
    if not words:
        return None, f"the launcher {exe} has an empty shebang"
    interp, args = words[0], words[1:]
    why = f"resolved from {os.path.basename(name)}'s shebang"
    if os.path.basename(interp) == "env":
        args = [a for a in args if not a.startswith("-") and "=" not in a]
        if not args:
            return None, f"the launcher {exe}'s shebang runs env without a command"
        interp = _on_path(args[0], environ) or args[0]
        if os.sep not in interp:
            return None, f"{why} ({lines[0]}): {args[0]} is not on the launcher's PATH"
        why += f" ({args[0]} on PATH)"
    if _PYTHON.match(os.path.basename(interp)):
        return interp, why
    if _SHELL.match(os.path.basename(interp)) and len(lines) > 1 and (m := _PIP_SH.match(lines[1])):
        return (m.group(1) or m.group(2)), f"resolved from {os.path.basename(name)}'s launcher line"
    return None, f"the launcher {exe} runs {interp} ({lines[0][:80]}), not a Python program"


def probe(python: str, environ: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str | None]:
    """Run `python` once on `_PROBE`; raises OSError (not runnable) or ValueError (no answer), with why."""
    try:
        out = subprocess.run(
            [python, "-c", _PROBE],
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"no answer within {timeout_s:g} s") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(_MARK)]
    if out.returncode != 0 or not lines:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise ValueError(f"it exited {out.returncode}: {last[:200]}")
    doc = json.loads(lines[-1][len(_MARK) :])
    return {k: (str(v) if v is not None else None) for k, v in doc.items()}


def job_torch(command: Sequence[str], environ: Mapping[str, str], configured: Path | None = None) -> JobTorch:
    """The torch (and Triton) of the interpreter the launcher runs; never bootseer's own."""
    python, how = find_interpreter(command, environ, configured)
    if python is None:
        return JobTorch(None, how)
    try:
        doc = probe(python, environ)
    except OSError as e:
        return JobTorch(python, how, problem=f"cannot run it ({e.strerror or e})")
    except ValueError as e:
        return JobTorch(python, how, problem=str(e))
    return JobTorch(python, how, torch=doc.get("torch"), triton=doc.get("triton"))


def for_command(settings: Settings, command: Sequence[str]) -> JobTorch:
    """For `bootseer keys` and `doctor`, which run no stage: the launcher's environment is this one, less
    what exec withholds from the launcher (the store's credentials: the probe runs the job's interpreter)."""
    from ..launcher import launcher_base_environ

    return job_torch(command, launcher_base_environ(settings, os.environ), settings.compile.python)
