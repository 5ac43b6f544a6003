"""The `exec` pipeline, top to bottom: settings → the wanted stages (the capability table's, in run
order) → summary line → agent → os.execvpe(launcher).

Each stage lives in its capability's package and is named in the capability table (`capabilities.py`),
imported only when wanted, so `bootseer exec` with nothing to do imports neither pyarrow nor libtorrent. A stage
that fails for any reason other than a user's own setup failing is recorded, warned about, and
skipped: the job still starts, by the slow path.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .capabilities import Capability, resolve, run_order, stage_names
from .errors import BootseerError, StageFatal
from .events import RunInfo, record
from .launcher import check_command, gpus_hint, launcher_base_environ, node_rank_hint, resolve_command
from .settings import Settings
from .stage import StageContext, StageResult
from .units import fmt_seconds

StageRow = tuple[str, StageResult | None, float]


def execute(settings: Settings, command: list[str], skip: set[str] | None = None) -> None:
    """Run the wanted stages, then replace this process with `command`. Returns only on error.

    The launcher is resolved after the stages, in the environment it will get: the env stage may be
    what creates it (`bootseer exec -- /opt/venv/bin/torchrun …` in a fresh container).
    """
    t0 = time.time()
    check_command(command)
    skip = set(skip or ()) | set(settings.exec.skip)
    check_skip(skip, settings)
    quiet = settings.exec.quiet
    active = [c.name for c in run_order() if c.name not in skip and wanted(c, settings)]
    if not active:
        env = launcher_base_environ(settings, os.environ)
        _exec(command, resolve_command(command, env), env)
        return
    from .trust import starting_a_job

    starting_a_job()
    run = RunInfo.new(command)
    ctx = StageContext(settings=settings, run=run, command=command, quiet=quiet)
    results = run_stages(ctx, skip)
    from .unverified import say

    say()  # the refs the stages refused for want of a signature: one line, before the summary
    if not quiet:
        print(summary_line(results, time.time() - t0), file=sys.stderr, flush=True)
    env = _launcher_environ(ctx)
    from .delivery import handoff

    ctx.agent_tasks.extend(handoff())  # blobs fetched through the swarm: the agent keeps seeding them
    try:
        exe = resolve_command(command, env)
    except BootseerError as e:  # the stages' work is kept (published, seeded); only the launch fails
        record(run, "bootseer", t0, time.time(), "failed", reason=str(e))
        _hand_over(ctx)
        raise
    record(run, "bootseer", t0, time.time(), "done", detail=f"{len(active)} stage(s)", **_launcher_facts(command))
    _hand_over(ctx)
    _exec(command, exe, env)


def _hand_over(ctx: StageContext) -> None:
    """What continues after exec: the agent (seeding, uploads), or the events uploaded here."""
    if ctx.settings.exec.agent and ctx.run.memory is None:  # no run directory anywhere: no agent, events inline
        for hook in ctx.before_agent:  # e.g. the env stage's lease keeper stops: the agent renews it now
            hook()
        _spawn_agent(ctx, os.getpid())
        for hook in ctx.after_agent:  # e.g. the image stage waits until the agent reads the opens' queue
            hook()
    else:
        _upload_quietly(ctx)


def check_skip(skip: set[str], settings: Settings) -> None:
    """Every skipped name must be a stage; the message says where the bad name came from."""
    names = stage_names()
    for name in sorted(skip - set(names)):
        where = "[exec] skip" if name in settings.exec.skip else "--skip"
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise BootseerError(f"{where}: unknown stage {name!r} ({hint}stages: {', '.join(names)})", 2)


def wanted(cap: Capability, settings: Settings) -> bool:
    """Whether a capability's stage has work: its `wanted` predicate on its own settings section."""
    assert cap.stage is not None
    return bool(resolve(cap.stage.wanted)(settings.section(cap.section_name)))


def run_stages(ctx: StageContext, skip: set[str]) -> list[StageRow]:
    """Each wanted stage in run order; the rows come back in display order (None: not run)."""
    display = {name: i for i, name in enumerate(stage_names())}
    results: list[tuple[int, StageRow]] = []
    for cap in run_order():
        assert cap.stage is not None
        if cap.name in skip or not wanted(cap, ctx.settings):
            results.append((display[cap.name], (cap.name, None, 0.0)))
            continue
        start = time.time()
        try:
            result = resolve(cap.stage.run)(ctx)
        except StageFatal:
            record(ctx.run, cap.name, start, time.time(), "failed", reason="fatal")
            raise
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a stage must never stop the job: warn and take the slow path
            reason = str(e) or type(e).__name__
            ctx.warn(f"{cap.name} stage failed, continuing without it: {reason}")
            result = StageResult(outcome="failed", summary="failed", reason=reason)
        end = time.time()
        _record_result(ctx.run, cap.name, start, end, result)
        results.append((display[cap.name], (cap.name, result, end - start)))
    return [row for _, row in sorted(results, key=lambda r: r[0])]


def _record_result(run: RunInfo, name: str, start: float, end: float, result: StageResult) -> None:
    record(
        run,
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


def summary_line(results: list[StageRow], total: float) -> str:
    parts = []
    for name, result, took in results:
        if result is None:
            parts.append(f"{name} –")
        else:
            parts.append(f"{name} {fmt_seconds(took)} {result.summary or result.outcome}")
    return "bootseer: " + " | ".join(parts) + f" | {fmt_seconds(total)} total"


def _launcher_environ(ctx: StageContext) -> dict[str, str]:
    """The launcher's environment: what it would have had, plus the stages' exports and the run's facts."""
    env = launcher_base_environ(ctx.settings, os.environ)
    env.update(ctx.exports)
    env.update(
        {
            "BOOTSEER_RUN_DIR": str(ctx.run.run_dir),
            "BOOTSEER_RUN_ID": ctx.run.run,
            "BOOTSEER_JOB_ID": ctx.run.job,
            "BOOTSEER_EXEC_TIME": f"{time.time():.6f}",
        }
    )
    from .firststep import launcher_pythonpath

    env.update(launcher_pythonpath(ctx.run, ctx.settings, env))  # the report's first step without ready()
    return env


def _launcher_facts(command: list[str]) -> dict[str, Any]:
    """GPUs per node (and the node rank) as the launcher will see them, for `bootseer report` (import-free)."""
    hint = gpus_hint(command, os.environ)
    facts: dict[str, Any] = {"gpus": hint[0], "gpus_from": hint[1]} if hint else {}
    node_rank = node_rank_hint(command)
    if node_rank is not None:
        facts["node_rank"] = node_rank
    return facts


def _spawn_agent(ctx: StageContext, launcher_pid: int) -> None:
    """Start the agent detached (double fork: reparented to init, never a zombie of the launcher).

    agent.json (0600) carries the settings exec ran with (the agent reads no config file) and the
    tasks. The store URI may carry credentials: agent.json names it redacted, for a human, and the
    full URI reaches the agent only through its environment (BOOTSEER_STORE), never a file or argv.
    """
    from .nodedirs import made_scratch
    from .redact import redact
    from .settings import settings_doc
    from .stage import agent_task_doc

    uri = ctx.settings.store.uri
    spec = {
        "store": redact(uri) if uri else None,
        "launcher_pid": launcher_pid,
        "settings": settings_doc(ctx.settings),
        "tasks": [agent_task_doc(t) for t in ctx.agent_tasks],
        "scratch": made_scratch(),  # removed by the agent once the job ended (a read-only or full cache)
    }
    _write_private(ctx.run.run_dir / "agent.json", json.dumps(spec, default=str))
    env = {k: v for k, v in os.environ.items() if k != "BOOTSEER_STORE"}
    if uri:
        env["BOOTSEER_STORE"] = uri
    argv = [sys.executable, "-m", "bootseer_cli", "agent", "--run-dir", str(ctx.run.run_dir)]
    log = ctx.run.run_dir / "agent.log"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            os.setsid()
            if os.fork() == 0:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                start = 3
                for keep in sorted(fd for fd in ctx.agent_fds if fd > 2):  # handed to a task by number
                    os.closerange(start, keep)
                    os.set_inheritable(keep, True)
                    start = keep + 1
                os.closerange(start, 1 << 16)
                os.execve(sys.executable, argv, env)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _write_private(path: Path, text: str) -> None:
    """Write a new file readable by this user only (created 0600, not chmod-ed after the fact)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _upload_quietly(ctx: StageContext) -> None:
    """Without an agent, upload the events here, and never let that keep the launcher from starting."""
    try:
        from .events import upload

        upload(ctx.store, ctx.run)
    except Exception as e:  # keep the job starting: the launcher starts whatever the store (or pyarrow) says
        ctx.warn(f"could not upload the stage events to {ctx.settings.store.uri or 'the local store'}: {e}")


def _exec(command: list[str], exe: str, env: Mapping[str, str]) -> None:
    """Replace this process with the launcher at `exe` (already resolved), argv as the user wrote it."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(exe, command, env)
    except FileNotFoundError:
        raise BootseerError(f"{command[0]}: No such file or directory", 127) from None
    except PermissionError:
        raise BootseerError(f"{command[0]}: Permission denied", 126) from None
    except OSError as e:
        raise BootseerError(f"{command[0]}: {e.strerror}", 126) from None
