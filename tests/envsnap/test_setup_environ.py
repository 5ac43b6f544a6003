"""The setup runs with the running interpreter first on PATH: it must install into the prefix that
the snapshot captures, even when bootseer was started by its full path from an unactivated venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bootseer_cli.envsnap.setup import setup_environ


def test_interpreter_first_on_path(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = setup_environ()
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    out = subprocess.run(
        ["sh", "-c", "python -c 'import sys; print(sys.prefix)'"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(out).resolve() == Path(sys.prefix).resolve()
