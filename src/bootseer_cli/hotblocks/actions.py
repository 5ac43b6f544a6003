"""What the `bootseer hot` verbs do by hand (e.g. in CI): record a command's start, replay now, describe.

The stage (stage.py) and the agent tasks (agent_tasks.py) do the same work inside `bootseer exec`;
these are the one-shot forms, which take their settings and the image key from the command layer
(commands/hot.py) and return facts for it to print.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from .ready import parse_mode, wait_ready
from .roots import resolve_roots

if TYPE_CHECKING:
    from ..events import RunInfo
    from ..settings import Settings
    from ..store.core import Store
    from .mapped import Sampler
    from .opens import OpenLog
    from .record import Record
    from .replay import ReplayResult


@dataclass
class RecordOutcome:
    exit_code: int
    why: str
    doc: dict[str, Any] | None


def record_command(
    settings: Settings,
    image_key: Callable[[], str],
    command: list[str],
    roots: list[str] | None = None,
    ready: str | None = None,
) -> RecordOutcome:
    """Evict the roots, run `command` watching its opens (fanotify, as root), scan when its start is
    over (the files it opened, or all under the roots without fanotify), publish; returns its exit code.

    Refuses (BootseerError) before running anything when this process cannot see the truth with
    mincore. `image_key` is called only once the record can go ahead (it may fingerprint the root
    filesystem). The command keeps running after the scan; its exit code is returned.
    """
    from ..events import RunInfo
    from ..launcher import resolve_command
    from ..store.core import open_store_for

    resolve_command(command)
    mode = parse_mode(ready if ready is not None else settings.image.ready)
    roots = resolve_roots(settings.image, roots)
    _evict_or_refuse(roots)  # the explicit verb may walk: a cold tree makes the most precise record
    store = open_store_for(settings)
    key = image_key()
    run = RunInfo.new()
    # Watched from here on, not before the walk: evicting opens every file under the roots, more events
    # than the queue holds (issue 44: `hot record` of a three-module import recorded nothing)
    proc, started, log = _start_watched(command, run, roots, settings.image.record_max_files)
    sampler = _sampler(proc.pid, roots) if log is not None else None
    try:
        why = wait_ready(
            mode,
            proc.pid,
            run.run_dir / "ready",
            alive=lambda: proc.poll() is None,
            sleep=_sleep,
            started=started,
        )
        mapped = sampler.finish() if sampler is not None else None  # before the queue's opens (agent_tasks)
        if log is not None:
            log.close()
        opened = list(log.paths) if log is not None else None
        coverage = log.coverage() if log is not None else "full"
        doc = _scan_and_publish(store, key, roots, opened, mapped, coverage)
        code = proc.wait()
    except BaseException:  # not swallowed: the command must not outlive a failed or interrupted record
        proc.kill()
        proc.wait()
        if sampler is not None:
            sampler.finish()
        raise
    finally:
        if log is not None:
            log.close()
    return RecordOutcome(code, why, doc)


def _evict_or_refuse(roots: list[str]) -> None:
    """Check that mincore tells the truth here, then evict the roots."""
    from .pagecache import evict
    from .roots import prepare_recording

    files, refused = prepare_recording(roots)
    if refused:
        raise BootseerError(refused)
    evict(files)


def _start_watched(
    command: list[str], run: RunInfo, roots: list[str], max_paths: int
) -> tuple[subprocess.Popen[bytes], float, OpenLog | None]:
    """Watch the roots' opens (fanotify, as root), start `command`, and drain the opens of its process tree
    while it starts (opens.py); without fanotify, no log (the whole roots are scanned)."""
    from .opens import OpenLog, open_group

    fan_fd, _ = open_group(roots)
    try:
        proc, started = _start(command, run)
    except BaseException:
        if fan_fd is not None:
            os.close(fan_fd)
        raise
    if fan_fd is None:
        return proc, started, None
    return proc, started, OpenLog(fan_fd, roots, launcher=proc.pid, max_paths=max_paths).start()


def _start(command: list[str], run: RunInfo) -> tuple[subprocess.Popen[bytes], float]:
    """Start `command` with the run's environment (so `bootseer_cli.ready()` finds the run directory)."""
    started = time.time()
    env = dict(
        os.environ, BOOTSEER_RUN_DIR=str(run.run_dir), BOOTSEER_RUN_ID=run.run, BOOTSEER_EXEC_TIME=f"{started:.6f}"
    )
    return subprocess.Popen(command, env=env), started


def _sampler(pid: int, roots: list[str]) -> Sampler | None:
    """The command's page tables, sampled while it starts where a root is on FUSE (see agent_tasks._sampler)."""
    from .mapped import MappedPages, Sampler, on_fuse

    return Sampler(MappedPages(pid, roots)).start() if on_fuse(roots) else None


def _scan_and_publish(
    store: Store,
    image_key: str,
    roots: list[str],
    opened: list[str] | None,
    mapped: dict[str, list[tuple[int, int]]] | None = None,
    coverage: str = "full",
) -> dict[str, Any] | None:
    """Scan the files opened (or all under the roots) now and publish the record; None when it is empty.
    `mapped`: the pages of mapped files from the command's page tables (mapped.py); `coverage`: what the
    opens may have missed (a partial record is published, and says so)."""
    from .record import file_infos, publish, scan_seen

    rec = scan_seen(image_key, roots, file_infos(opened) if opened is not None else None, mapped)
    rec.coverage = coverage
    return publish(store, rec) if rec.extents else None


def _load(settings: Settings, image_key: str) -> tuple[Record, dict[str, Any]] | None:
    """The published record of `image_key` from the configured store, through the node cache. A ref whose
    blob the store no longer holds says so, and what replaces it (`bootseer exec` takes a new record)."""
    from ..errors import BlobMissing
    from ..store.cache import cache_for
    from ..store.core import open_store_for
    from .record import load

    try:
        return load(
            settings.p2p, open_store_for(settings), cache_for(settings.store), image_key, resolve_roots(settings.image)
        )
    except BlobMissing as e:
        raise BlobMissing(
            f"the hot-block record of image {image_key[:16]} is gone from the store ({e}); the next "
            '`bootseer exec` with [image] record = "auto" takes a new one, or `bootseer hot record -- CMD`'
        ) from None


def replay_now(
    settings: Settings, image_key: str, threads: int | None = None, mbps: float | None = None
) -> tuple[ReplayResult, dict[str, Any]]:
    """Replay the record of this image to the end; returns (ReplayResult, ref doc)."""
    from .replay import replay

    found = _load(settings, image_key)
    if found is None:
        raise BootseerError(f"no hot-block record for image {image_key[:16]} (record one: bootseer hot record -- CMD)")
    rec, doc = found
    res = replay(
        rec,
        threads=threads or settings.image.prefetch_threads,
        mbps=settings.image.prefetch_mbps if mbps is None else mbps,
    )
    return res, doc


def describe(settings: Settings, image_key: str) -> dict[str, Any]:
    """The record of this image: files, bytes, share of the roots, and how much of it is stale now."""
    from .record import check

    found = _load(settings, image_key)
    empty = _read_status(settings, "empty", image_key, "")
    if found is None:
        return {"image_key": image_key, "record": None, "last_empty": empty}
    rec, doc = found
    staleness, _ = check(rec)
    verdict = _read_status(settings, "verdict", image_key, str(doc.get("blob", "")))
    by_file = sorted(rec.bytes_by_file().items(), key=lambda kv: -kv[1])
    return {
        "image_key": image_key,
        "record": doc.get("blob"),
        "created": rec.created,
        "creator": rec.creator,
        "roots": rec.roots,
        "files": len(rec.files),
        "extents": len(rec.extents),
        "bytes": rec.total_bytes,
        "roots_bytes": rec.roots_bytes,
        "roots_files": rec.roots_files,
        "share_of_roots": rec.total_bytes / rec.roots_bytes if rec.roots_bytes else 0.0,
        "stale_files": len(staleness.stale_files),
        "stale_bytes": staleness.stale_bytes,
        "stale_share": staleness.stale_share,
        "top_files": [{"path": p, "bytes": n} for p, n in by_file[:10]],
        "method": rec.method,
        "coverage": rec.coverage,
        "replay": {
            "off": bool(verdict and verdict.get("off")),
            "why": (verdict or {}).get("why", ""),
            "with_s": (verdict or {}).get("with", []),
            "without_s": (verdict or {}).get("without", []),
            "recording_s": (verdict or {}).get("recording", []),
        },
        "last_empty": empty,
    }


def _read_status(settings: Settings, which: str, image_key: str, record: str) -> dict[str, Any] | None:
    """The agent's notes for this image (status.py): the last empty record, or the replay verdict."""
    from ..store.core import open_store_for
    from .status import read_empty, read_verdict

    store = open_store_for(settings)
    return read_empty(store, image_key) if which == "empty" else read_verdict(store, image_key, record)


def _sleep(seconds: float) -> bool:
    """`wait_ready`'s sleep: False, never stopped early."""
    time.sleep(seconds)
    return False
