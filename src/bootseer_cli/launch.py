"""The `exec` pipeline: config → keys → image → env → checkpoint → agent → os.execvp(launcher).

Each stage lives in its capability's package and is called through `STAGES` below, imported only
when the stage is configured, so `bootseer exec` with nothing to do imports neither pyarrow nor
libtorrent. A stage that fails for any reason other than a user's own setup failing is recorded,
warned about, and skipped: the job still starts, by the slow path.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import Config
from .errors import BootseerError
from .events import RunInfo, record

STAGE_NAMES = ("image", "env", "checkpoint")  # as shown in the summary line and the report
# The env stage runs first: a hot-block record taken on a warm node (or by `prewarm`) includes the
# files the env snapshot restores, so the image stage must look at them after they are restored, or
# a fresh node would find the record mostly stale and re-record instead of replaying.
RUN_ORDER = ("env", "image", "checkpoint")


@dataclass
class StageResult:
    """What a stage did. `summary` is the few words shown in the summary line."""

    outcome: str
    summary: str = ""
    cache: str = ""
    bytes: int = 0
    bytes_from_store: int = 0
    bytes_from_peers: int = 0
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class StageFatal(BootseerError):
    """A stage failure that must stop the start (e.g. the user's own setup command failed)."""


@dataclass
class LaunchContext:
    """What stages share: the config, this run, lazily the keys and the store, and what to hand on."""

    cfg: Config
    run: RunInfo
    command: list[str]
    quiet: bool = False
    exports: dict[str, str] = field(default_factory=dict)  # environment added for the launcher
    agent_tasks: list[dict[str, Any]] = field(default_factory=list)
    _keys: Any = None
    _store: Any = None
    _store_error: Exception | None = None

    @property
    def keys(self) -> Any:
        if self._keys is None:
            from .keys import compute

            self._keys = compute(self.cfg)
        return self._keys

    @property
    def store(self) -> Any:
        """The store; raises StoreError (remembered) when it cannot be opened."""
        if self._store_error is not None:
            raise self._store_error
        if self._store is None:
            from .store import store_from_config

            try:
                self._store = store_from_config(self.cfg)
            except Exception as e:
                self._store_error = e
                raise
        return self._store

    @property
    def cache(self) -> Any:
        from .cache import cache_from_config

        return cache_from_config(self.cfg)

    def warn(self, msg: str) -> None:
        """Warnings are loud even under --quiet: a fallback is something a user must see."""
        print(f"bootseer: warning: {msg}", file=sys.stderr, flush=True)

    def info(self, msg: str) -> None:
        if not self.quiet:
            print(f"bootseer: {msg}", file=sys.stderr, flush=True)

    def add_agent_task(self, kind: str, **params: Any) -> None:
        self.agent_tasks.append({"kind": kind, **params})


def _stage_wanted(cfg: Config, name: str) -> bool:
    """Cheap, import-free test of whether a stage has anything to do."""
    if name == "image":
        # Any explicit [image] setting turns the stage on (replay always; record unless "never").
        return any(s.source != "default" for s in cfg.settings["image"].values())
    if name == "env":
        return bool(cfg.get("env", "setup"))
    if name == "checkpoint":
        return bool(cfg.get("checkpoint", "name"))
    return False


# stage name -> "module:function"; the function takes a LaunchContext and returns a StageResult.
STAGES: dict[str, str] = {
    "image": "bootseer_cli.hotblocks.stage:run_stage",
    "env": "bootseer_cli.envsnap.stage:run_stage",
    "checkpoint": "bootseer_cli.stripe.stage:run_stage",
}


def _load(target: str) -> Callable[[LaunchContext], StageResult]:
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def _fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s >= 0.05 else f"{s * 1000:.0f} ms"


def run_stages(ctx: LaunchContext, skip: set[str]) -> list[tuple[str, StageResult | None, float]]:
    results: list[tuple[str, StageResult | None, float]] = []
    for name in RUN_ORDER:
        if name in skip or not _stage_wanted(ctx.cfg, name):
            results.append((name, None, 0.0))
            continue
        start = time.time()
        try:
            result = _load(STAGES[name])(ctx)
        except StageFatal:
            record(ctx.run, name, start, time.time(), "failed", reason="fatal")
            raise
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a stage must never stop the job: warn and take the slow path
            reason = str(e) or type(e).__name__
            ctx.warn(f"{name} stage failed, continuing without it: {reason}")
            result = StageResult(outcome="failed", summary="failed", reason=reason)
        end = time.time()
        record(
            ctx.run,
            name,
            start,
            end,
            result.outcome,
            cache=result.cache,
            bytes=result.bytes,
            bytes_from_store=result.bytes_from_store,
            bytes_from_peers=result.bytes_from_peers,
            reason=result.reason,
            detail=result.summary,
            **result.extra,
        )
        results.append((name, result, end - start))
    return sorted(results, key=lambda r: STAGE_NAMES.index(r[0]))


def summary_line(results: list[tuple[str, StageResult | None, float]], total: float) -> str:
    parts = []
    for name, result, took in results:
        if result is None:
            parts.append(f"{name} –")
        else:
            parts.append(f"{name} {_fmt_seconds(took)} {result.summary or result.outcome}")
    return "bootseer: " + " | ".join(parts) + f" | {_fmt_seconds(total)} total"


def _spawn_agent(ctx: LaunchContext, launcher_pid: int) -> None:
    """Start the agent detached (double fork: reparented to init, never a zombie of the launcher)."""
    spec = {
        "store_uri": ctx.cfg.get("store", "uri"),
        "launcher_pid": launcher_pid,
        "tasks": ctx.agent_tasks,
        "config_file": str(ctx.cfg.path) if ctx.cfg.path else None,
    }
    (ctx.run.run_dir / "agent.json").write_text(json.dumps(spec, default=str))
    argv = [sys.executable, "-m", "bootseer_cli", "agent", "--run-dir", str(ctx.run.run_dir)]
    log = ctx.run.run_dir / "agent.log"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            os.setsid()
            if os.fork() == 0:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.closerange(3, 1 << 16)
                os.execv(sys.executable, argv)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def resolve_command(command: list[str]) -> str:
    """The executable the launcher resolves to, or a shell-like error (127 not found, 126 not runnable)."""
    if not command:
        raise BootseerError("no command given: bootseer exec [OPTIONS] -- COMMAND [ARGS]…", 2)
    exe = command[0]
    if os.sep in exe:
        if not os.path.exists(exe):
            raise BootseerError(f"{exe}: No such file or directory", 127)
        if not os.access(exe, os.X_OK) or os.path.isdir(exe):
            raise BootseerError(f"{exe}: Permission denied", 126)
        return exe
    found = shutil.which(exe)
    if found is None:
        raise BootseerError(f"{exe}: command not found", 127)
    return found


def execute(cfg: Config, command: list[str], skip: set[str] | None = None) -> None:
    """Run the configured stages, then replace this process with `command`. Returns only on error."""
    t0 = time.time()
    resolve_command(command)
    skip = set(skip or ()) | set(cfg.get("exec", "skip"))
    unknown = skip - set(STAGE_NAMES)
    if unknown:
        raise BootseerError(f"--skip: unknown stage {sorted(unknown)[0]!r} (stages: image, env, checkpoint)", 2)
    quiet = bool(cfg.get("exec", "quiet"))
    active = [n for n in STAGE_NAMES if n not in skip and _stage_wanted(cfg, n)]
    env = os.environ
    if active:
        run = RunInfo.new()
        ctx = LaunchContext(cfg=cfg, run=run, command=command, quiet=quiet)
        results = run_stages(ctx, skip)
        total = time.time() - t0
        if not quiet:
            print(summary_line(results, total), file=sys.stderr, flush=True)
        env = dict(os.environ)
        env.update(ctx.exports)
        env.update(
            {
                "BOOTSEER_RUN_DIR": str(run.run_dir),
                "BOOTSEER_RUN_ID": run.run,
                "BOOTSEER_JOB_ID": run.job,
                "BOOTSEER_EXEC_TIME": f"{time.time():.6f}",
            }
        )
        from .delivery import handoff

        ctx.agent_tasks.extend(handoff())  # blobs fetched through the swarm: the agent keeps seeding them
        record(run, "bootseer", t0, time.time(), "done", detail=f"{len(active)} stage(s)", **_launcher_facts(command))
        if cfg.get("exec", "agent"):
            _spawn_agent(ctx, os.getpid())
        else:
            _upload_quietly(ctx)
    _exec(command, env)


def _launcher_facts(command: list[str]) -> dict[str, Any]:
    """GPUs per node (and the node rank) as the launcher will see them, for `bootseer report` (import-free)."""
    from .report.gpus import gpus_hint, node_rank_hint

    hint = gpus_hint(command, os.environ)
    facts: dict[str, Any] = {"gpus": hint[0], "gpus_from": hint[1]} if hint else {}
    node_rank = node_rank_hint(command)
    if node_rank is not None:
        facts["node_rank"] = node_rank
    return facts


def _upload_quietly(ctx: LaunchContext) -> None:
    try:
        from .events import upload

        upload(ctx.store, ctx.run)
    except Exception as e:
        ctx.warn(f"could not upload the stage events to {ctx.cfg.get('store', 'uri') or 'the local store'}: {e}")


def _exec(command: list[str], env: Any) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        raise BootseerError(f"{command[0]}: command not found", 127) from None
    except PermissionError:
        raise BootseerError(f"{command[0]}: Permission denied", 126) from None
    except OSError as e:
        raise BootseerError(f"{command[0]}: {e.strerror}", 126) from None
