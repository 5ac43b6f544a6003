"""A plain local user for the privilege tests, and a `bootseer` that user can run.

The Slurm prolog runs as root and must act for the job's user only as that user. Testing that takes
a real second uid (`bsuser`, made with useradd when missing) and files that uid can reach: pytest's
`tmp_path` lies in a 0700 directory, so these tests work in a 0755 directory of their own under
/tmp, removed afterwards. The user's `bootseer` is a two-line launcher of this checkout with an
interpreter the user can execute (the test's own where it can, else the system's of the same
version with the test environment's packages on PYTHONPATH: a pyenv interpreter under /root is out
of reach for anyone else).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import bootseer_cli

USER = "bsuser"
SRC = Path(bootseer_cli.__file__).resolve().parents[1]


@dataclass(frozen=True)
class PlainUser:
    name: str
    uid: int
    gid: int
    home: str

    def run(self, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """`argv` as this user (runuser), its output captured as text."""
        return subprocess.run(["runuser", "-u", self.name, "--", *argv], capture_output=True, text=True, **kw)  # type: ignore[call-overload]

    def can_run(self, path: str) -> bool:
        return self.run("test", "-x", path, timeout=30).returncode == 0


def plain_user() -> PlainUser:
    """`bsuser`, created (with a home) when missing. Needs root, as the prolog does."""
    if os.geteuid() != 0:
        raise RuntimeError("the privilege tests need root (the Slurm prolog runs as root)")
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True, capture_output=True)
        pw = pwd.getpwnam(USER)
    return PlainUser(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)


@contextmanager
def world_dir(prefix: str = "bootseer-priv-") -> Iterator[Path]:
    """A 0755 root-owned directory under /tmp that every user can enter; removed after."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _works(user: PlainUser, python: str, pythonpath: str) -> bool:
    probe = [
        "env", "-i", f"PYTHONPATH={pythonpath}", python, "-c", "import bootseer_cli, torch, pyarrow",
    ]  # fmt: skip
    return user.run(*probe, timeout=120).returncode == 0


def _let_through(user: PlainUser, paths: list[str]) -> None:
    """In CI (a throwaway machine), where the checkout or the test environment lies below a directory
    the user cannot enter (e.g. /root), let every user traverse its ancestors (o+x: no listing)."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    for p in paths:
        for d in reversed(Path(p).resolve().parents):
            if not os.stat(d).st_mode & 0o001:
                os.chmod(d, os.stat(d).st_mode | 0o001)


def _interpreter(user: PlainUser) -> tuple[str, str]:
    """(python, PYTHONPATH) for `user`: this interpreter when the user can run it, else the system's
    of the same version with this environment's packages."""
    purelib = sysconfig.get_paths()["purelib"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    candidates = [(sys.executable, f"{SRC}:{purelib}")]
    if system is not None:
        candidates.append((system, f"{SRC}:{purelib}"))
    for attempt in range(2):
        for python, pythonpath in candidates:
            if _works(user, python, pythonpath):
                return python, pythonpath
        if attempt == 0:
            _let_through(user, [sys.executable, str(SRC), purelib])
    raise RuntimeError(f"{user.name} cannot run bootseer from {SRC} with {sys.executable} or {system}")


def user_bin(user: PlainUser, where: Path) -> Path:
    """A directory with `bootseer` and `torchrun` launchers that `user` can run (for PATH)."""
    python, pythonpath = _interpreter(user)
    bin_dir = where / "bin"
    bin_dir.mkdir(mode=0o755, exist_ok=True)
    for name, module in (("bootseer", "bootseer_cli"), ("torchrun", "torch.distributed.run")):
        (bin_dir / name).write_text(f'#!/bin/sh\nPYTHONPATH="{pythonpath}" exec "{python}" -m {module} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return bin_dir
