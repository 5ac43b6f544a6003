"""Helpers for the compile-cache tests: a stage context for one "node", a stand-in for the agent.

Every "node" has its own empty TMPDIR and HOME, as a fresh container has: Inductor keeps its
precompiled headers in `$TMPDIR/torchinductor_<user>/`, so nodes sharing one /tmp would share them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bootseer_cli.compilecache.jobpython import JobTorch, job_torch
from bootseer_cli.compilecache.stage import run_stage
from bootseer_cli.compilecache.tree import CACHE_VARS
from bootseer_cli.events import RunInfo
from bootseer_cli.keys import Keys, make_key
from bootseer_cli.settings import CompileSettings, Settings, StoreSettings
from bootseer_cli.stage import StageContext, StageResult
from bootseer_cli.store.core import Store, open_store

MODEL = Path(__file__).with_name("model.py")
TEST_KEYS = Keys(image=make_key({"kind": "image", "t": 1}), env=make_key({"kind": "env", "t": 1}), image_source="test")


@pytest.fixture(autouse=True)
def no_user_cache_vars(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The stage keeps a cache directory the user set: the tests start without any; and the stage
    writes Inductor's headers under TMPDIR: each test has its own (never the machine's /tmp)."""
    for var in CACHE_VARS.values():
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "tmpdir").mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmpdir"))


def node_env(root: Path, node: str) -> dict[str, str]:
    """The node's own TMPDIR and HOME (created empty on first use)."""
    env = {"TMPDIR": str(root / f"tmp-{node}"), "HOME": str(root / f"home-{node}")}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    return env


def run_stage_on(ctx: StageContext) -> tuple[StageResult, dict[str, str]]:
    """The compile stage as the node of `ctx` runs it (its TMPDIR and HOME); (result, that environment)."""
    env = node_env(ctx.run.run_dir.parent, ctx.run.node)
    with pytest.MonkeyPatch.context() as mp:
        for var in CACHE_VARS.values():
            mp.delenv(var, raising=False)
        for var, value in env.items():
            mp.setenv(var, value)
        return run_stage(ctx), env


def new_run(root: Path, node: str) -> RunInfo:
    run_dir = root / f"run-{node}"
    run_dir.mkdir(parents=True, exist_ok=True)
    run = RunInfo(job="job", node=node, rank=0, run=f"r-{node}", run_dir=run_dir)
    (run_dir / "run.json").write_text(json.dumps(run.as_dict()))
    return run


def node_ctx(
    root: Path,
    node: str,
    store_uri: str,
    *,
    device: str | None = None,
    agent: bool = True,
    command: list[str] | None = None,
) -> StageContext:
    """The context the compile stage of one node sees: own cache directory and run, the shared store.
    The launcher is the test venv's interpreter running the model, unless `command` says another."""
    from bootseer_cli.settings import ExecSettings

    settings = Settings(
        store=StoreSettings(uri=store_uri, cache_dir=root / f"blobs-{node}"),
        exec=ExecSettings(agent=agent),
        compile=CompileSettings(enabled=True, cache_dir=root / f"compile-{node}", device=device),
    )
    ctx = StageContext(
        settings=settings, run=new_run(root, node), command=command or [sys.executable, str(MODEL)], quiet=True
    )
    ctx._keys = TEST_KEYS
    return ctx


@dataclass
class FakeAgent:
    """What a task handler uses of the agent; the launcher has already ended (publish at once)."""

    store: Store
    run: RunInfo
    launcher_pid: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stopping.set()

    @property
    def ready_file(self) -> Path:
        return self.run.run_dir / "ready"

    def launcher_alive(self) -> bool:
        return False

    def wait(self, seconds: float) -> bool:
        return True

    def log(self, msg: str) -> None:
        self.lines.append(msg)


def publish_as_agent(ctx: StageContext) -> FakeAgent:
    """Run the stage's "compile-publish" task the way the agent would."""
    from bootseer_cli.compilecache.tasks import PublishTask, publish_task

    (task,) = [t for t in ctx.agent_tasks if isinstance(t, PublishTask)]
    agent = FakeAgent(store=open_store(ctx.settings.store.uri), run=ctx.run)
    publish_task(task, agent)
    return agent


def run_model(exports: dict[str, str], node: dict[str, str]) -> dict[str, object]:
    """The compiled model in its own process on a node (`node_env`), pointed at the caches the stage exported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_EXT"))}
    env.update(node)
    env.update(exports)
    out = subprocess.run([sys.executable, str(MODEL)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def usual_job() -> JobTorch:
    """What the stage reads for the tests' usual launcher (the test venv's interpreter, which has torch)."""
    return job_torch([sys.executable], os.environ)


# The test venv's torch: what a job venv links and bootseer's own venv leaves out.
TORCH_ENTRIES = ("torch", "torchgen", "functorch", "triton")


def _is_torch(name: str) -> bool:
    return name.split("-")[0].split(".")[0] in TORCH_ENTRIES


def _is_bootseer(name: str) -> bool:
    return "bootseer" in name


def make_venv(path: Path, keep: Callable[[str], bool] = lambda name: False) -> Path:
    """A venv (no pip, no system site-packages) whose site-packages holds links to the test venv's
    entries that `keep` accepts: what `pip install` of those wheels would put there, without copying
    gigabytes. Returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=300)
    python = path / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout.strip()
    )
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(ours.iterdir()):
        if entry.name != "__pycache__" and keep(entry.name):
            (site / entry.name).symlink_to(entry)
    return python


def job_venv(path: Path) -> Path:
    """The job's env: a venv with torch (and its dependencies) and without bootseer; its `torchrun` is
    the console script pip writes (the test venv's, its shebang naming this venv's interpreter)."""
    python = make_venv(path, lambda name: not _is_bootseer(name) and not name.endswith(".pth"))
    script = Path(sys.executable).with_name("torchrun").read_text().split("\n", 1)[1]
    torchrun = path / "bin" / "torchrun"
    torchrun.write_text(f"#!{python}\n{script}")
    torchrun.chmod(0o755)
    return python


def bootseer_venv(path: Path) -> Path:
    """bootseer's own venv, as the README installs it: bootseer and its dependencies, no torch."""
    return make_venv(path, lambda name: not _is_torch(name))


def venv_with_torch_version(path: Path, version: str, *, bootseer: bool = False) -> Path:
    """A venv whose torch distribution says `version`: the test venv's torch linked, its dist-info copied
    with another Version (only the metadata differs, which is all a compile key reads); with `bootseer`,
    bootseer and its dependencies too (bootseer's own venv, holding another torch)."""
    python = make_venv(path, lambda name: (bootseer or _is_torch(name)) and not name.startswith("torch-"))
    (info,) = Path(sysconfig.get_paths()["purelib"]).glob("torch-*.dist-info")
    site = next(p.parent for p in path.glob("lib/python*/site-packages/torch"))
    copy = site / f"torch-{version}.dist-info"
    shutil.copytree(info, copy)
    meta = copy / "METADATA"
    meta.write_text(re.sub(r"^Version: .*$", f"Version: {version}", meta.read_text(), count=1, flags=re.M))
    return python
