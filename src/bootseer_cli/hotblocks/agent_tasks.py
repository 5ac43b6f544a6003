"""The hot-block agent tasks: "hot-record" (watch the start, scan when it is over, publish),
"hot-prefetch" (finish a replay that the foreground deadline cut short, behind the program) and
"hot-judge" (time this start to ready, for the never-slower verdict).

The image stage (stage.py) hands these to the agent (agent.py) as the frozen dataclasses below (the
capability table, capabilities.py, names each kind's spec and handler); the agent runs each in a
thread. What the next start must know (an empty record, a replay that did not pay) goes to the store
(status.py): the agent cannot print to the start's output.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..events import record as record_event
from ..units import fmt_seconds
from .ready import parse_mode, wait_ready_at

if TYPE_CHECKING:
    from ..agent import Agent
    from .mapped import Sampler
    from .opens import OpenLog
    from .pagecache import FileInfo


DRAINING_FILE = "hot-draining"  # in the run directory: the agent reads the opens' queue from now on


@dataclass(frozen=True)
class RecordTask:
    """The "hot-record" task: the start's opens come from the fanotify group `fan_fd` (inherited by the agent),
    else from the files an eviction walk covered (`covered`: a JSON list in the run directory)."""

    image_key: str
    roots: list[str]
    ready: str | float = "quiet"  # the `[image] ready` mode: when the start is over
    started: float = 0.0  # when the stage started timing (0: when the task starts)
    fan_fd: int | None = None
    covered: str | None = None
    max_files: int = 1_000_000  # `[image] record_max_files`: unique paths kept at most (opens.py)


@dataclass(frozen=True)
class PrefetchTask:
    """The "hot-prefetch" task: the extents the foreground deadline left, a JSON list at `file`."""

    file: str
    threads: int = 16
    mbps: float = 0.0
    into_loader: bool = False  # the extents fill a loader's own cache (replay.run: no readahead)
    stats: str | None = None  # a JSON list of paths to stat beside the reads (the sources the stage left)


@dataclass(frozen=True)
class JudgeTask:
    """The "hot-judge" task: time this start (of `record`, replayed or not) to ready, for the never-slower verdict."""

    image_key: str
    record: str
    replayed: bool
    started: float = 0.0
    ready: str | float = "quiet"
    loader: list[dict[str, object]] | None = None  # loader-cache judgements to keep (loadercache.remember)


def _wait(task: RecordTask | JudgeTask, agent: Agent, sleep: Callable[[float], bool]) -> tuple[str, float, float]:
    """Wait until the launcher's start is over; (why, when, when the stage started timing)."""
    started = float(task.started or time.time())
    why, at = wait_ready_at(
        parse_mode(task.ready),
        agent.launcher_pid,
        agent.ready_file,
        alive=agent.launcher_alive,
        sleep=sleep,
        started=started,
    )
    return why, at, started


def record_task(task: RecordTask, agent: Agent) -> None:
    """Wait until the start is over (draining the fanotify group meanwhile), scan what it opened, publish."""
    from .opens import OpenLog

    roots = [str(r) for r in task.roots]
    fan_fd = task.fan_fd
    try:
        log = (
            OpenLog(
                int(fan_fd), roots, ignore_pids=(os.getpid(),), launcher=agent.launcher_pid, max_paths=task.max_files
            )
            if fan_fd is not None
            else None
        )
    except OSError as e:  # the group was not handed over (an exec that closed it): nothing to record from
        agent.log(f"hot-record: {e.strerror or e}; not recording")
        (agent.run_dir / DRAINING_FILE).touch()  # nothing to wait for
        return
    # The queue is drained while the program starts only when it fills (opens.py): each event read is an
    # open the loader serves, so a small start's events are read after it, and a start that reads a dataset
    # (or a busy node) does not overflow it and lose the record (issue 44).
    try:
        if log is not None:
            log.start(before_launch=True)
    finally:
        (agent.run_dir / DRAINING_FILE).touch()  # the launcher waits for this (stage._wait_for_drain)
    sampler, mapped = None, None
    try:
        sampler = _sampler(agent, roots) if log is not None else None
        why, at, started = _wait(task, agent, agent.wait)
    finally:
        # The page tables first: each fd the queue's events carry is an open, and on a tree that drops
        # pages at open that unmaps the file's pages from the program too.
        if sampler is not None:
            mapped = sampler.finish()
            pm = sampler.pages
            agent.log(
                f"hot-record: page tables sampled {pm.samples}x in {fmt_seconds(pm.seconds)}: {len(mapped or {})} files"
            )
        if log is not None:
            log.close()  # marks removed, the rest of the queue read, the group closed: nothing queues behind us
    if log is not None and log.coverage() != "full":
        agent.log(
            f"hot-record ({why}): coverage {log.coverage()}: {log.events} events, {log.others} of other processes; "
            "publishing what was kept"
        )
    _scan_and_publish(task, agent, roots, log, (why, at - started), mapped)


def _sampler(agent: Agent, roots: list[str]) -> Sampler | None:
    """Where a root is on FUSE (a tree that may drop pages at open, where mincore will see nothing), sample
    the page tables of the launcher's tree while it starts (mapped.py): the pages its mapped libraries
    touched, instead of those files whole. Elsewhere mincore sees the pages and nothing is sampled."""
    from .mapped import MappedPages, Sampler, on_fuse

    if not on_fuse(roots):
        return None
    return Sampler(MappedPages(agent.launcher_pid, roots)).start()


def _files_seen(task: RecordTask, log: OpenLog | None) -> list[FileInfo] | None:
    """The files to scan: those the start opened (fanotify), those the eviction walk covered, or all."""
    from .record import file_infos

    if log is not None:
        return file_infos(log.paths)
    if task.covered:
        return file_infos(json.loads(Path(task.covered).read_text()))
    return None


def _scan_and_publish(
    task: RecordTask,
    agent: Agent,
    roots: list[str],
    log: OpenLog | None,
    ready: tuple[str, float],
    mapped: dict[str, list[tuple[int, int]]] | None = None,
) -> None:
    """Scan, publish (or note why the record is empty, for the next start), and give the verdict its baseline."""
    from .record import publish, scan_seen
    from .status import add_sample, clear_empty, note_empty

    why, seconds = ready
    t0 = time.time()
    image_key = task.image_key
    files = _files_seen(task, log)
    rec = scan_seen(image_key, roots, files, mapped)
    if log is not None:
        rec.coverage = log.coverage()
    if not rec.extents:
        if log is not None and not log.paths:
            empty = f"the start opened no file under {', '.join(roots)} before it was over ({why})"
        else:
            n = len(files or [])
            empty = f"none of the {n} files under the roots had pages resident when the start was over ({why})"
        note_empty(agent.store, image_key, roots, empty)
        agent.log(f"hot-record: {empty}; nothing published")
        record_event(agent.run, "hot-record", t0, time.time(), "empty", reason=empty)
        return
    doc = publish(agent.store, rec)
    clear_empty(agent.store, image_key)
    add_sample(agent.store, image_key, doc["blob"], "recording", seconds)
    agent.log(
        f"hot-record ({why}, {rec.method}): {len(rec.files)} files, {len(rec.extents)} extents, {rec.total_bytes} "
        f"bytes, coverage {rec.coverage}; published {doc['blob'][:12]}; ready after {fmt_seconds(seconds)}"
    )
    reason = why if rec.coverage == "full" else f"{why}; coverage {rec.coverage}"
    record_event(
        agent.run, "hot-record", t0, time.time(), "built", bytes=rec.total_bytes, reason=reason, detail=doc["blob"]
    )


def judge_task(task: JudgeTask, agent: Agent) -> None:
    """Time this start to ready and add it to the record's verdict (with or without replay)."""
    from .status import add_sample

    why, at, started = _wait(task, agent, agent.wait)
    seconds = at - started
    replayed = task.replayed
    if task.loader:
        from .loadercache import remember

        remember(agent.store, task.image_key, task.record, task.loader)
    side = "with" if replayed else "without"
    verdict = add_sample(agent.store, task.image_key, task.record, side, seconds)
    state = f"replay off: {verdict['why']}" if verdict["off"] else "replay on"
    agent.log(f"hot-judge ({why}): ready after {fmt_seconds(seconds)} {side} replay; {state}")
    record_event(
        agent.run,
        "hot-judge",
        started,
        at,
        "with-replay" if replayed else "without-replay",
        reason=why,
        detail=task.image_key,
        record=task.record,
        off=verdict["off"],
    )


def prefetch_task(task: PrefetchTask, agent: Agent) -> None:
    """Read the extents the stage's deadline left (a JSON file in the run directory) until done or stopped."""
    from .replay import run

    path = Path(task.file)
    work = [(str(p), int(o), int(n)) for p, o, n in json.loads(path.read_text())]
    stats = [str(p) for p in json.loads(Path(task.stats).read_text())] if task.stats else None
    t0 = time.time()
    stop = agent.stopping.is_set
    res = run(work, threads=task.threads, mbps=task.mbps, stop=stop, stats=stats, into_loader=task.into_loader)
    agent.log(
        f"hot-prefetch: {res.bytes_read} bytes in {fmt_seconds(res.seconds)}, {len(res.remaining)} extents not read"
    )
    record_event(agent.run, "hot-prefetch", t0, time.time(), "done", bytes=res.bytes_read)
    path.unlink(missing_ok=True)
    if task.stats:
        Path(task.stats).unlink(missing_ok=True)
