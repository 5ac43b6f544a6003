"""Nodes on one machine for the end-to-end tests and benchmark.

A "node" is what a training job's node has of its own: a cache directory (XDG_CACHE_HOME), a working
tree (a copy of examples/torchrun-job) and a virtual environment. Environment snapshots are restored to
the same absolute paths they were captured from, so every node's venv lives at one fixed path,
`VENV_AT`: each node runs its processes in its own mount namespace (`unshare -m`, private
propagation) where its own directory is bind-mounted onto that path. Nodes therefore run at the same
time without seeing each other's venv, as on separate machines.

The venvs are bare (`--without-pip`) plus one `.pth` line that adds a *base* (the site-packages of the
interpreter running the tests, which has bootseer and torch, or a bootseer-only base in the benchmark):
the image of a real job. The job's setup installs only its own requirements into the venv, so the
snapshot holds just what the setup added.

pip is cut off from this machine's configuration (PIP_CONFIG_FILE=/dev/null, no PIP_* variables) and
pointed at a loopback package index (`PackageIndex`) holding the job's wheels and the sdist of its
C extension, built from examples/torchrun-job/fnv.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.s3server import S3_ENV, free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torchrun-job"
VENV_AT = Path("/opt/bootseer-e2e/venv")
# What the job's setup fetches from the loopback index: its requirements (both tabulate versions, for
# the changed-requirements scenario) and setuptools to build the sdist in pip's isolated build env.
INDEX_WHEELS = ["einops==0.8.2", "tabulate==0.10.0", "tabulate==0.8.10", "msgpack==1.2.3", "setuptools", "wheel"]
# A start that checks the env without starting torch: prints the job's `train: deps` line.
DEPS_COMMAND = [
    "python",
    "-c",
    "from importlib.metadata import version as v; import bsexample_fnv, einops, msgpack, tabulate; "
    "print('train: deps', *(f'{d}={v(d)}' for d in ('einops', 'tabulate', 'msgpack')), 'fnv=' + v('bsexample-fnv'))",
]
# The tabulate of the example's requirements, and the one a changed requirements file names.
OLD_TABULATE = "tabulate==0.10.0"
NEW_TABULATE = "tabulate==0.8.10"
TRAIN_LINE = re.compile(r"^train: (\S+)(.*)$")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the machine's pip settings, bytecode switch or BOOTSEER_*."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "BOOTSEER_", "VIRTUAL_ENV", "PYTEST_", "TORCHELASTIC_"))
        and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(S3_ENV)
    env.update(extra or {})
    return env


# ---------------------------------------------------------------- package index


def build_sdist(src: Path, dest_dir: Path, name: str = "bsexample_fnv", version: str = "0.1.0") -> Path:
    """An sdist of the example's C extension, made with tarfile (PKG-INFO + the sources)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / f"{name}-{version}.tar.gz"
    top = f"{name}-{version}"
    pkg_info = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode()
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        info = tarfile.TarInfo(f"{top}/PKG-INFO")
        info.size = len(pkg_info)
        info.mtime = 0
        tar.addfile(info, io.BytesIO(pkg_info))
        for f in sorted(src.iterdir()):
            if f.is_file() and f.suffix in (".c", ".py", ".toml"):
                tar.add(f, arcname=f"{top}/{f.name}")
    os.replace(tmp, out)
    return out


def build_index(dest: Path, wheels: list[str] | None = None) -> Path:
    """A flat directory of the job's wheels and sdist (served by `PackageIndex` as find-links).

    The wheels come through `pip download` with this machine's own configuration (its local wheel
    mirror); only the job's setup is cut off from that configuration.
    """
    marker = dest / ".complete"
    if marker.exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    for spec in wheels or INDEX_WHEELS:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(dest), spec],
            check=True,
            capture_output=True,
        )
    build_sdist(EXAMPLE / "fnv", dest)
    marker.touch()
    return dest


class PackageIndex:
    """`python -m http.server` over the index directory, on loopback: pip's `--find-links` URL."""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        self.host = host
        self.port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def pip_env(self) -> dict[str, str]:
        return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": self.url}

    def start(self) -> PackageIndex:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", self.host, str(self.port), "--directory", str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_port(self.host, self.port, self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


def wait_port(host: str, port: int, proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout} s")


# ---------------------------------------------------------------- nodes


def base_site_dirs() -> list[str]:
    """The site directories of the interpreter running this code (bootseer and torch live there)."""
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]


@dataclass
class Run:
    """One start of a node: its exit status, its combined output and its stage events."""

    rc: int
    output: str
    events: list[dict[str, Any]]
    started: float
    ended: float
    leftover: list[int] = field(default_factory=list)  # node processes still alive after the drain timeout

    def train(self, what: str) -> list[dict[str, str]]:
        """The `train: <what> k=v …` lines (rank 0) as dicts."""
        out = []
        for line in self.output.splitlines():
            m = TRAIN_LINE.match(line.strip())
            if m and m.group(1) == what:
                out.append(dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv))
        return out

    def one(self, what: str) -> dict[str, str]:
        found = self.train(what)
        assert len(found) == 1, f"expected one 'train: {what}' line, got {len(found)}:\n{self.output[-4000:]}"
        return found[0]

    def losses(self) -> dict[int, float]:
        return {int(d["step"]): float(d["loss"]) for d in self.train("step")}

    def versions(self) -> dict[str, str]:
        """`train: deps …` of the job, or the same line printed by `DEPS_COMMAND`."""
        return self.one("deps")

    def stage(self, name: str) -> dict[str, Any]:
        found = [e for e in self.events if e.get("stage") == name]
        assert found, f"no {name!r} event; events: {[e.get('stage') for e in self.events]}\n{self.output[-4000:]}"
        return found[-1]

    @property
    def ready_s(self) -> float:
        """Seconds from the node's start to the first training step (rank 0's `ready` line)."""
        return float(self.one("ready")["t"]) - self.started


@dataclass
class Node:
    """One node: its own directory holding `venv/` (mounted at `venv_at`), `work/` and `cache/`."""

    root: Path
    name: str
    store_uri: str
    job_id: str
    index: PackageIndex | None = None
    venv_at: Path = VENV_AT
    base_sites: list[str] = field(default_factory=base_site_dirs)
    env_extra: dict[str, str] = field(default_factory=dict)
    torchrun_script: bool = True  # the base provides torch: give the venv its `torchrun` entry point
    runs: list[Run] = field(default_factory=list)

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def site_packages(self) -> Path:
        return self.venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

    def create(self, requirements: str | None = None) -> Node:
        """A fresh node: the example's files, an empty cache, a bare venv (the state before any setup)."""
        for d in (self.venv, self.work, self.cache):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        for f in ("train.py", "requirements.txt", "bootseer.toml"):
            shutil.copy2(EXAMPLE / f, self.work / f)
        shutil.copytree(EXAMPLE / "fnv", self.work / "fnv")  # requirements.txt names it: ./fnv
        if requirements is not None:
            (self.work / "requirements.txt").write_text(requirements)
        self.venv_at.mkdir(parents=True, exist_ok=True)
        self.run_raw([sys.executable, "-m", "venv", "--without-pip", str(self.venv_at)], check=True)
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in self.base_sites)
        (self.site_packages / "_bootseer_e2e_base.pth").write_text(lines)
        py = self.venv_at / "bin" / "python"
        scripts = {"bootseer": "from bootseer_cli.cli import main"}
        if self.torchrun_script:
            scripts["torchrun"] = "from torch.distributed.run import main"
        for name, imp in scripts.items():
            path = self.venv / "bin" / name
            path.write_text(f"#!{py}\nimport sys\n{imp}\nsys.exit(main())\n")
            path.chmod(0o755)
        return self

    def use_config(self, name: str) -> Node:
        """Start this node with a config variant of the example (e.g. `bootseer-compile.toml`) in place
        of its `bootseer.toml`: copied over it, so every start finds it as a user's job would."""
        shutil.copy2(EXAMPLE / name, self.work / "bootseer.toml")
        return self

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = clean_env()
        env.update(
            {
                "PATH": f"{self.venv_at / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
                "VIRTUAL_ENV": str(self.venv_at),
                "XDG_CACHE_HOME": str(self.cache),
                "BOOTSEER_NODE": self.name,
                "BOOTSEER_JOB_ID": self.job_id,
                "BOOTSEER_STORE": self.store_uri,
                "E2E_NODE_TOKEN": f"{self.root}",  # lets a test find every process this node started
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1",
            }
        )
        if self.index is not None:
            env.update(self.index.pip_env())
        env.update(self.env_extra)
        env.update(extra or {})
        return env

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run in this node's own mount namespace, with its venv mounted at `venv_at` (as is when
        the venv already lives at `venv_at`: then mounts it makes are visible to the whole machine)."""
        if self.venv_at == self.venv:
            return list(argv)
        script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(self.venv),
            str(self.venv_at),
            *argv,
        ]

    def run_raw(self, argv: list[str], check: bool = False, **kw: Any) -> subprocess.CompletedProcess[str]:
        kw.setdefault("env", self.env())
        kw.setdefault("cwd", self.work)
        return subprocess.run(self.wrap(argv), text=True, capture_output=True, check=check, **kw)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run_raw([str(self.venv_at / "bin" / "python"), "-c", code])

    def job_argv(self, steps: int = 3, bootseer: bool = True, train_args: list[str] | None = None) -> list[str]:
        torchrun = ["torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()), "train.py"]
        argv = [*torchrun, "--steps", str(steps), *(train_args or [])]
        return ["bootseer", "exec", "--", *argv] if bootseer else argv

    def start(
        self,
        steps: int = 3,
        bootseer: bool = True,
        train_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> Started:
        """Start the job on this node (in the background); `.wait()` gives the `Run`. `command`
        replaces the torchrun job (under `bootseer exec` unless bootseer=False), e.g. for a start
        whose point is only the env stage."""
        if command is not None:
            argv = ["bootseer", "exec", "--", *command] if bootseer else list(command)
        else:
            argv = self.job_argv(steps, bootseer, train_args)
        log = self.root / f"run-{len(self.runs) + 1}-{uuid.uuid4().hex[:6]}.log"
        before = set(self.run_dirs())
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self.wrap(argv),
                cwd=self.work,
                env=self.env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return Started(self, proc, log, before, time.time())

    def run_job(self, timeout: float = 600.0, **kw: Any) -> Run:
        return self.start(**kw).wait(timeout)

    def run_dirs(self) -> list[Path]:
        d = self.cache / "bootseer" / "runs"
        return sorted(d.iterdir()) if d.is_dir() else []

    def pip_freeze(self) -> str:
        """What the setup put into this node's venv (the base is not listed: `--path`)."""
        r = self.run_raw(
            [str(self.venv_at / "bin" / "python"), "-m", "pip", "freeze", "--path", str(self.venv_at / self.rel_site)]
        )
        assert r.returncode == 0, r.stderr
        # the example's C extension is installed from its source next to requirements.txt, a path of this
        # node's own (`bsexample-fnv @ file:///…/nodes/n1/work/fnv`): the same env on every node reads alike
        return re.sub(r"@ file://\S*/work/fnv$", "@ file://<work>/fnv", r.stdout, flags=re.M)

    @property
    def rel_site(self) -> Path:
        return self.site_packages.relative_to(self.venv)

    def processes(self) -> list[int]:
        """Pids of every live process started by this node (they carry its token in their environment)."""
        return processes_with(f"E2E_NODE_TOKEN={self.root}")


@dataclass
class Started:
    node: Node
    proc: subprocess.Popen[bytes]
    log: Path
    before: set[Path]
    started: float

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def report(self, tail: int = 4000) -> str:
        """Where this start stands (running, or its exit status), its stages' outcomes and reasons (e.g.
        why the swarm was not used, which its output does not say) and the tail of its output: what a
        failed wait prints, so that a timeout in CI says what each node was doing."""
        rc = self.proc.poll()
        state = "running" if rc is None else f"exited rc={rc}"
        stages = [
            {k: e[k] for k in ("stage", "outcome", "reason", "detail") if e.get(k)}
            for d in self.node.run_dirs()
            if d not in self.before
            for e in read_events(d / "events.jsonl")
        ]
        return (
            f"--- {self.node.name} ({state}, {time.time() - self.started:.1f} s since its start)\n"
            f"stages: {stages}\n{self.output()[-tail:]}"
        )

    def wait(self, timeout: float = 600.0, drain_s: float = 90.0) -> Run:
        """The run once the launcher has exited and everything it left behind (the agent: uploads,
        hot-block record, seeding, unmount) has ended too, or `drain_s` has passed."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            tail = self.output()[-4000:]
            raise AssertionError(f"{self.node.name}: job did not end within {timeout} s:\n{tail}") from None
        ended = time.time()
        deadline = ended + drain_s
        while self.node.processes() and time.time() < deadline:
            time.sleep(0.2)
        return self._finish(rc, ended)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def _finish(self, rc: int, ended: float) -> Run:
        events: list[dict[str, Any]] = []
        for d in self.node.run_dirs():
            if d not in self.before:
                events.extend(read_events(d / "events.jsonl"))
        run = Run(rc, self.output(), events, self.started, ended, leftover=self.node.processes())
        self.node.runs.append(run)
        ready = run.train("ready")
        ready_s = f"{float(ready[0]['t']) - self.started:.1f} s" if ready else "-"
        summary = next((ln for ln in run.output.splitlines() if ln.startswith("bootseer: image")), "")
        print(
            f"e2e: {self.node.name} rc={rc} ready={ready_s} exited={ended - self.started:.1f} s "
            f"drained={time.time() - self.started:.1f} s {summary}",
            flush=True,
        )
        return run


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def processes_with(marker: str) -> list[int]:
    """Live pids whose environment contains `marker` (exactly, as one NAME=value entry)."""
    want = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(entry))
        except OSError:
            continue
    return found


def kill_node_processes(node: Node) -> None:
    for pid in node.processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_all(started: list[Started], timeout: float = 600.0) -> list[Run]:
    deadline = time.time() + timeout
    return [s.wait(max(1.0, deadline - time.time())) for s in started]


# What the env stage's outcome means for a scenario (the stage's own words vary by path).
ENV_KINDS = {
    "built": "built",
    "miss": "built",
    "restored": "restored",
    "present": "hit",  # the stamp: this node already carries the env
    "setup": "fallback",  # the setup ran locally, without the store (it said why)
}


def env_kind(run: Run) -> str:
    outcome = run.stage("env")["outcome"]
    return ENV_KINDS.get(outcome, outcome)


def wait_for(
    predicate: Any, timeout: float, what: str, interval: float = 0.05, show: list[Started] | None = None
) -> Any:
    """`predicate()`'s first truthy value within `timeout` s; else AssertionError, with the state and
    output of the starts in `show` (the nodes whose progress the wait was about)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    detail = "".join(f"\n{s.report()}" for s in show or [])
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")


def mounted(path: Path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)
