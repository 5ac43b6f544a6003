"""What the `bootseer hot` verbs do: record a command's start, replay now, describe the record."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from ..errors import BootseerError
from .ready import parse_mode, wait_ready
from .roots import resolve_roots


@dataclass
class RecordOutcome:
    exit_code: int
    why: str
    doc: dict[str, Any] | None


def record_command(
    cfg: Any, command: list[str], roots: list[str] | None = None, ready: str | None = None
) -> RecordOutcome:
    """Evict the roots, run `command`, scan when its start is over, publish; returns its exit code.

    Refuses (BootseerError) before running anything when this process cannot see the truth with
    mincore. The command keeps running after the scan; its exit code is returned.
    """
    from ..events import RunInfo
    from ..keys import compute
    from ..launch import resolve_command
    from ..store import store_from_config
    from .pagecache import evict
    from .record import publish, scan
    from .stage import prepare_recording

    resolve_command(command)
    mode = parse_mode(ready if ready is not None else cfg.get("image", "ready"))
    roots = resolve_roots(cfg, roots)
    files, refused = prepare_recording(roots)
    if refused:
        raise BootseerError(refused)
    store = store_from_config(cfg)
    image_key = compute(cfg).image.digest
    run = RunInfo.new()
    evict(files)
    started = time.time()
    env = dict(
        os.environ, BOOTSEER_RUN_DIR=str(run.run_dir), BOOTSEER_RUN_ID=run.run, BOOTSEER_EXEC_TIME=f"{started:.6f}"
    )
    proc = subprocess.Popen(command, env=env)
    try:
        why = wait_ready(
            mode,
            proc.pid,
            run.run_dir / "ready",
            alive=lambda: proc.poll() is None,
            sleep=lambda s: bool(time.sleep(s)),
            started=started,
        )
        rec = scan(image_key, roots, None)
        doc = publish(store, rec) if rec.extents else None
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return RecordOutcome(code, why, doc)


def replay_now(cfg: Any, threads: int | None = None, mbps: float | None = None) -> tuple[Any, dict[str, Any]]:
    """Replay the record of this image to the end; returns (ReplayResult, ref doc)."""
    from ..keys import compute
    from ..store import store_from_config
    from .record import load
    from .replay import replay

    image_key = compute(cfg).image.digest
    found = load(cfg, store_from_config(cfg), image_key)
    if found is None:
        raise BootseerError(f"no hot-block record for image {image_key[:16]} (record one: bootseer hot record -- CMD)")
    rec, doc = found
    res = replay(
        rec,
        threads=threads or int(cfg.get("image", "prefetch_threads")),
        mbps=float(cfg.get("image", "prefetch_mbps")) if mbps is None else mbps,
    )
    return res, doc


def describe(cfg: Any) -> dict[str, Any]:
    """The record of this image: files, bytes, share of the roots, and how much of it is stale now."""
    from ..keys import compute
    from ..store import store_from_config
    from .record import check, load

    image_key = compute(cfg).image.digest
    found = load(cfg, store_from_config(cfg), image_key)
    if found is None:
        return {"image_key": image_key, "record": None}
    rec, doc = found
    staleness, _ = check(rec)
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
    }
