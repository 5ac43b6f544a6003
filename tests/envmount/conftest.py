"""Fixtures for the env mount-mode tests: a builder publishing an env with its squashfs image, fresh nodes.

A node is its own node cache (XDG_CACHE_HOME) and runtime directory; the store is a local directory
shared by the nodes; the env root is one absolute path, removed between the builder and a fresh node
(the tree absent, as on a node that never had it). Everything mounted under the test's directory is
taken down at teardown, so a failing test leaves no mount behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import pkgindex
from tests.support.mounts import mounted_under as all_mounted_under

SHARED = "/env-images/"  # a node's image lowers (envmount/lowers.py): they outlive the runs by design


def mounted_under(prefix: str) -> list[str]:
    """The mounts below `prefix` a run should have taken down: all of them but the nodes' shared image
    lowers (lowers.py keeps those for the next start; `shared_lowers_under` lists them)."""
    return [mp for mp in all_mounted_under(prefix) if SHARED not in mp + "/"]


def shared_lowers_under(prefix: str) -> list[str]:
    return [mp for mp in all_mounted_under(prefix) if SHARED in mp + "/"]


WHEELS = ["six==1.17.0", "idna==3.20"]


def unmount_all(prefix: str) -> None:
    for mp in reversed(all_mounted_under(prefix)):
        for argv in (["fusermount3", "-uz", mp], ["umount", "-l", mp]):
            if mp in all_mounted_under(prefix):
                subprocess.run(argv, capture_output=True)


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """The test's directory; no run's mount stays under it afterwards (the shared image lowers go too)."""
    yield tmp_path
    left = mounted_under(str(tmp_path))
    unmount_all(str(tmp_path))
    assert not left, f"mounts left behind: {left}"


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    pkgindex.wheelhouse(d, WHEELS)
    return d


def node(base: Path, name: str) -> dict[str, str]:
    home = base / name
    (home / "cache").mkdir(parents=True, exist_ok=True)
    (home / "rt").mkdir(mode=0o700, exist_ok=True)
    return {"XDG_CACHE_HOME": str(home / "cache"), "XDG_RUNTIME_DIR": str(home / "rt")}


def config(base: Path, root: Path, wheels: Path, mode: str = "mount") -> Path:
    """A config whose setup pip-installs two small wheels into `root/site` (`--target`)."""
    setup = f"{sys.executable} -m pip install -q --no-index --find-links {wheels} --target {root}/site six idna"
    cfg = base / f"bootseer-{mode}.toml"
    cfg.write_text(
        f'[store]\nuri = "{(base / "store").as_uri()}"\n\n[env]\nroots = ["{root}"]\nmode = "{mode}"\n'
        f'setup = ["{setup}"]\n'
    )
    (base / "store").mkdir(exist_ok=True)
    return cfg


def bootseer(
    args: list[str], nd: dict[str, str], agent: bool = True, path: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = pkgindex.clean_env()
    for k in [k for k in env if k.startswith("BOOTSEER_")]:
        del env[k]
    env.update(nd)
    env["BOOTSEER_EXEC_AGENT"] = "1" if agent else "0"
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def agents_done(nd: dict[str, str], timeout: float = 120) -> None:
    """Every run's agent has ended (its log's last line; its pid file may not be written yet when exec is
    already over: the agent is started detached just before the launcher)."""
    runs = Path(nd["XDG_CACHE_HOME"]) / "bootseer" / "runs"

    def done(run: Path) -> bool:
        try:
            if "agent done" in (run / "agent.log").read_text():
                return True
            os.kill(int((run / "agent.pid").read_text()), 0)  # a killed agent: its pid file stays
        except (OSError, ValueError):
            return (run / "agent.pid").exists()
        return False

    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(done(r) for r in runs.iterdir() if (r / "agent.json").exists()):
            return
        time.sleep(0.1)
    raise AssertionError("the agent did not finish")
