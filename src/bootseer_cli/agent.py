"""The agent: a detached sidecar that outlives `exec` and serves the launcher while it runs.

`bootseer exec` writes `agent.json` into the run directory (the launcher's pid, the settings exec ran
with, a list of tasks) and starts `bootseer agent --run-dir D` in its own session. The agent runs each
task in a thread, uploads the run's stage events once the start is over (and again at the end), and
when the launcher's pid ends (normally, by failure or by SIGKILL) tells every task to stop, waits for
them to clean up (unmount, stop seeding) and exits.

A task is `{"kind": K, **fields}`: the capability table (capabilities.py) declares each kind once, with
its spec (a frozen dataclass, which the agent rebuilds from the fields) and its handler,
`handler(spec, agent: Agent) -> None`. A handler must return soon after `agent.stopping` is set,
unless its spec class says `finish = True` (the env upload): the agent then waits for it to end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .capabilities import AgentTask, agent_tasks, resolve
from .errors import BootseerError
from .events import RunInfo, upload

if TYPE_CHECKING:
    from .settings import Settings
    from .store.core import Store

STOP_GRACE_S = 30.0


class Agent:
    """What a task handler is given: the run, the launcher's pid, the store, the settings, a stop flag."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.run = RunInfo.load(run_dir)
        self.spec: dict[str, Any] = json.loads((run_dir / "agent.json").read_text())
        self.launcher_pid = int(self.spec["launcher_pid"])
        self.stopping = threading.Event()
        self._store: Store | None = None
        self._settings: Settings | None = None
        self._lock = threading.Lock()

    def log(self, msg: str) -> None:
        """A line of agent.log; any URI in it (an exception's text, a traceback) loses its credentials."""
        from .redact import redact_text

        print(f"{time.strftime('%H:%M:%S')} {redact_text(msg)}", flush=True)

    @property
    def store_uri(self) -> str | None:
        """The store URI: from the environment `exec` gave the agent (it may carry credentials, which
        never go into agent.json), or from an older spec's `store_uri`; None: the local default."""
        return self.spec.get("store_uri") or os.environ.get("BOOTSEER_STORE") or None

    @property
    def settings(self) -> Settings:
        """The settings `exec` ran with, as agent.json carries them (`settings_doc`), with the store URI
        of `store_uri`; an older spec without them names its config file, read again here.

        Built on first use, so that settings that do not load fail the task that needs them (in its
        thread, logged) and never the agent, which must still stop the tasks when the launcher ends.
        """
        with self._lock:
            if self._settings is None:
                doc = self.spec.get("settings")
                if doc is not None:
                    from .settings import settings_from_doc

                    self._settings = settings_from_doc(doc, self.store_uri)
                else:
                    from .config import load
                    from .settings import Settings

                    cfg_file = self.spec.get("config_file")
                    cfg = load(Path(cfg_file) if cfg_file else None, {("store", "uri"): self.store_uri})
                    self._settings = Settings.from_config(cfg)
            return self._settings

    @property
    def store(self) -> Store:
        """The store `exec` used, seen from exec's trust domain, with its signing key (the agent, never
        the launcher, publishes what the run made). A trust that no longer loads falls back to the
        unsigned view of the user's domain, so that the events still reach the store."""
        settings = self.settings_or_none()
        with self._lock:
            if self._store is None:
                from .store.core import open_store, open_store_for

                try:
                    self._store = open_store_for(settings) if settings else open_store(self.store_uri)
                except BootseerError as e:
                    self.log(f"trust settings unusable ({e}); publishing unsigned")
                    self._store = open_store(self.store_uri)
            return self._store

    def settings_or_none(self) -> Settings | None:
        try:
            return self.settings
        except Exception as e:  # keep-alive: a broken config must not keep the events from the store
            self.log(f"settings unusable: {e}")
            return None

    @property
    def ready_file(self) -> Path:
        return self.run_dir / "ready"

    def launcher_alive(self) -> bool:
        try:
            os.kill(self.launcher_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _is_zombie(self.launcher_pid)

    def wait_launcher(self) -> None:
        """Block until the launcher's pid has ended (pidfd where the kernel has it, else polling)."""
        try:
            fd = os.pidfd_open(self.launcher_pid)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            try:
                while not self.stopping.is_set():
                    ready, _, _ = select.select([fd], [], [], 1.0)
                    if ready:
                        return
            finally:
                os.close(fd)
            return
        while self.launcher_alive() and not self.stopping.is_set():  # pragma: no cover - old kernels
            time.sleep(0.5)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when the agent is stopping (tasks use this to pace themselves)."""
        return self.stopping.wait(seconds)

    def upload_events(self) -> None:
        """Upload the run's events; a failure is logged, never raised (see `main`: the agent must go on)."""
        try:
            rel = upload(self.store, self.run)
            if rel:
                self.log(f"events uploaded to {rel}")
        except Exception as e:  # keep-alive: an agent that died here would never stop its tasks (unmount, seed)
            self.log(f"could not upload events: {e}")


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def task_from_doc(doc: dict[str, Any]) -> tuple[AgentTask, Any] | None:
    """The declaration of a task of agent.json and its spec, rebuilt from the fields its class has (a
    field it does not know is dropped); None for a kind no capability declares."""
    decl = agent_tasks().get(str(doc.get("kind", "")))
    if decl is None:
        return None
    cls = resolve(decl.spec)
    names = {f.name for f in dataclasses.fields(cls)}
    return decl, cls(**{k: v for k, v in doc.items() if k in names})


def _start_task(agent: Agent, doc: dict[str, Any]) -> tuple[threading.Thread, bool] | None:
    """A task of agent.json started in its thread, and whether the agent waits for it to finish; None
    (logged) for an unknown kind or fields its spec refuses."""
    kind = doc.get("kind", "") if isinstance(doc, dict) else ""
    try:
        found = task_from_doc(doc)
    except Exception:  # keep-alive: a spec that does not import or build loses its task, never the agent
        agent.log(f"task {kind} not started:\n{traceback.format_exc()}")
        return None
    if found is None:
        agent.log(f"unknown task kind {kind!r}: ignored")
        return None
    decl, spec = found
    t = threading.Thread(target=_run_task, args=(agent, decl, spec), name=decl.kind, daemon=True)
    t.start()
    return t, bool(getattr(spec, "finish", False))


def _run_task(agent: Agent, decl: AgentTask, spec: object) -> None:
    """One task in its thread: whatever it raises is logged, so the other tasks and the agent go on."""
    try:
        resolve(decl.handler)(spec, agent)
    except Exception:  # keep-alive: a task's failure (any kind) must not end the agent or the other tasks
        agent.log(f"task {decl.kind} failed:\n{traceback.format_exc()}")


def _write_pid(run_dir: Path) -> None:
    """`agent.pid`, whole or not at all: a reader (`gc`, whoever waits for the agent) that opened it
    between the create and the write read "" (a ValueError under load, issue 46; gc took the run's agent
    for gone). Written under a private temporary name and renamed over."""
    tmp = run_dir / f".agent.pid.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    os.replace(tmp, run_dir / "agent.pid")


READY_SETTLE_S = 2.0  # after the first rank's ready, the node's other local ranks record theirs
UNREADY_UPLOAD_S = 60.0  # a start that has not reached its first step by then is shown as it stands


def upload_at_ready(agent: Agent) -> None:
    """Upload the events once the start is over (`ready`: a ready() call or the first optimizer step),
    so that `bootseer report` shows a long job's startup while it trains, not only after it ends.

    Not before: the launcher is importing its framework then, and on a node with few cores the upload
    (pyarrow, the store, Parquet: ~0.15 s of CPU) came out of the restart's time to its first step
    (issue 44). A start still not ready after UNREADY_UPLOAD_S is uploaded as it stands, so that a
    start that hangs shows in the report while it hangs; the final upload follows the launcher's end."""
    waited = 0.0
    uploaded = False
    while not agent.wait(1.0):
        waited += 1.0
        if agent.ready_file.exists():
            if not agent.wait(READY_SETTLE_S):
                agent.upload_events()
            return
        if not uploaded and waited >= UNREADY_UPLOAD_S:
            agent.upload_events()
            uploaded = True


def main(run_dir: Path) -> int:
    """Run the tasks of `run_dir/agent.json` until the launcher ends, then stop them and upload the events."""
    agent = Agent(run_dir)
    agent.log(f"agent for launcher pid {agent.launcher_pid}, run {agent.run.run}")
    _write_pid(run_dir)

    def _on_term(signum: int, _frame: object) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    threads = [started for doc in agent.spec.get("tasks", []) if (started := _start_task(agent, doc))]
    at_ready = threading.Thread(target=upload_at_ready, args=(agent,), name="upload-at-ready", daemon=True)
    at_ready.start()
    threads.append((at_ready, False))  # joined before the final upload, which must be the last one
    agent.wait_launcher()
    agent.log("launcher ended; stopping tasks")
    agent.stopping.set()
    deadline = time.time() + STOP_GRACE_S
    for t, finish in threads:
        # A `finish` task (an upload others wait for under its lease) runs to its end, however long;
        # if the agent is killed instead, the lease it renews expires and another node does the work.
        t.join(None if finish else max(0.0, deadline - time.time()))
    agent.upload_events()
    with contextlib.suppress(FileNotFoundError):
        (run_dir / "agent.pid").unlink()
    agent.log("agent done")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(Path(sys.argv[1])))
