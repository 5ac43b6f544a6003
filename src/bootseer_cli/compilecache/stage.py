"""The compile stage of `bootseer exec`: point the launcher at node-local compile caches and fill them.

With `[compile] enabled = true`: find the interpreter the launcher runs and its torch (`jobpython`: in
the job's env, which the env stage has made by now; never bootseer's own), compute the compile key
(image, env, device, torch), export TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, TORCH_EXTENSIONS_DIR
and CUDA_CACHE_PATH (each unless the user set it) for the launcher, restore the files the store's
index lists for the key (Inductor's precompiled headers into the launcher's
`$TMPDIR/torchinductor_<user>/`, see `tree`), take the baseline, and give the agent a
"compile-publish" task that publishes what the run adds once the start is over. Without torch in the
job's interpreter there is nothing to carry: the stage says which interpreter it read and why, and
does nothing. Everything else that goes wrong (no store, a corrupt blob, a full disk) is a warning:
the job starts with the cache it could restore, or an empty one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BootseerError
from ..stage import StageContext, StageResult
from ..units import count, fmt_bytes
from .index import Index, read_index, surely_empty
from .jobpython import JobTorch, job_torch
from .key import current_compile_key
from .restore import Restored, restore
from .tree import HEADERS, Baseline, cache_roots, make_dirs, take_baseline

if TYPE_CHECKING:
    from ..keys import Key

BASELINE_FILE = "compile-baseline.json"


def default_base() -> Path:
    from ..paths import cache_root

    return cache_root() / "compile"


def launcher_env(ctx: StageContext) -> dict[str, str]:
    """The launcher's environment as the stages leave it (PATH, TMPDIR, user): what its interpreter sees,
    without the store's credentials that exec withholds from it (the probe runs the job's interpreter)."""
    from ..launcher import launcher_base_environ

    return {**launcher_base_environ(ctx.settings, os.environ), **ctx.exports}


def run_stage(ctx: StageContext) -> StageResult:
    settings = ctx.settings.compile
    env = launcher_env(ctx)  # its TMPDIR and user also place Inductor's precompiled headers
    job = job_torch(ctx.command, env, settings.python)
    try:
        key = current_compile_key(ctx.keys, job, settings.device)
    except (BootseerError, OSError) as e:  # the keys read files and may ask the engine
        ctx.warn(f"compile: cannot compute the compile key ({e}); starting without compile caches")
        return StageResult(outcome="fallback", summary="no key", cache="miss", reason=str(e), extra=job.facts())
    if key is None:
        return _no_torch(ctx, job)
    wanted, exports = cache_roots(settings.cache_dir or default_base(), key.digest, env)
    try:
        roots = make_dirs(wanted)
    except OSError as e:
        ctx.warn(f"compile: cannot create the cache directories ({e.strerror or e}); PyTorch keeps its defaults")
        return StageResult(outcome="fallback", summary="no cache dir", cache="miss", reason=str(e))
    for name in wanted.keys() - roots.keys():
        ctx.warn(f"compile: {wanted[name]} is not a directory of this user; Inductor's {name} are not carried")
    ctx.exports.update(exports)
    index, restored, why = _restore(ctx, key, roots)
    base = take_baseline(roots, restored.digests, restored.bad)
    publishing = _arrange_publish(ctx, key, roots, base)
    result = _result(key, index, restored, why, publishing)
    result.extra.update(job.facts())
    return result


def _no_torch(ctx: StageContext, job: JobTorch) -> StageResult:
    """Nothing to carry: say which interpreter was read and why it gives no key (a warning when no
    interpreter could be read at all, since `[compile] python` is then the way out)."""
    why = job.why_none(hint=True)
    if job.python is None or job.problem:
        ctx.warn(f"compile: {why}; starting without compile caches")
        summary = "no python"
    else:
        ctx.info(f"compile: {why}; nothing to carry")
        summary = "no torch"
    return StageResult(outcome="skipped", summary=summary, reason=why, extra=job.facts())


def _restore(ctx: StageContext, key: Key, roots: dict[str, Path]) -> tuple[Index | None, Restored, str]:
    """Read the index and restore it; (index or None when unreadable, what was restored, why not all)."""
    if surely_empty(ctx.settings.store.uri, ctx.settings.store.trust_domain(), key.digest):
        return Index(entries={}, shards=[]), Restored(), ""
    try:
        index = read_index(ctx.store, key.digest)
    except (BootseerError, OSError) as e:
        ctx.warn(f"compile: cannot read the compile cache index ({e}); starting with the cache this node has")
        return None, Restored(), f"store: {e}"
    # The precompiled headers (~150 MB) are only read by a run that compiles: not fetched when the
    # key's last run compiled nothing (a job started without torch.compile); one that does builds them.
    skip = frozenset({HEADERS}) if index.compiled is False else frozenset()
    restored = restore(ctx.store, index, roots, ctx.settings.compile.max_bytes, skip)
    for err in restored.errors[:3]:
        ctx.warn(f"compile: {err}; dropped, the rest is restored")
    if len(restored.errors) > 3:
        ctx.warn(f"compile: {len(restored.errors) - 3} more blob(s) dropped")
    if restored.stopped:
        ctx.warn(f"compile: restore stopped ({restored.stopped}); starting with what was restored")
    why = restored.stopped or (f"{len(restored.dropped)} dropped" if restored.dropped else "")
    return index, restored, why


def _arrange_publish(ctx: StageContext, key: Key, roots: dict[str, Path], base: Baseline) -> str:
    """Save the baseline and hand the agent its task; returns what the summary says about publishing."""
    if not ctx.settings.compile.publish:
        return "not publishing"
    if not ctx.settings.exec.agent:
        ctx.warn("compile: publishing the compile cache needs the agent ([exec] agent = true); not publishing")
        return "not publishing (no agent)"
    path = ctx.run.run_dir / BASELINE_FILE
    try:
        base.save(path)
    except OSError as e:
        ctx.warn(f"compile: cannot write the baseline ({e.strerror or e}); not publishing")
        return "not publishing"
    from .tasks import PublishTask

    ctx.add_agent_task(
        PublishTask(
            key=key.digest,
            baseline=str(path),
            max_bytes=ctx.settings.compile.max_bytes,
            ready=ctx.settings.image.ready,
            started=time.time(),
        )
    )
    return "publishing after ready"


def _result(key: Key, index: Index | None, r: Restored, why: str, publishing: str) -> StageResult:
    have = r.files + r.kept
    if index is None:
        outcome, summary = "fallback", "no restore (store)"
    elif have:
        outcome = "hit"
        summary = f"restored {count(r.files, 'file')}, {fmt_bytes(r.bytes)}"
        summary += f", {r.kept} already here" if r.kept else ""
        summary += (
            f", headers not fetched ({fmt_bytes(r.skipped_bytes)}: the last run compiled nothing)" if r.skipped else ""
        )
    else:
        outcome, summary = "miss", f"empty cache, {publishing}"
    return StageResult(
        outcome=outcome,
        summary=summary,
        cache="hit" if have else "miss",
        bytes=r.bytes,
        bytes_from_store=r.bytes,
        reason=why,
        extra={
            "compile_key": key.digest,
            "files": r.files,
            "kept": r.kept,
            "dropped": len(r.dropped),
            "over_bound": r.over_bound,
            "not_fetched": r.skipped,  # the headers, when the key's last run compiled nothing
            "not_fetched_bytes": r.skipped_bytes,
            "index_entries": len(index.entries) if index else 0,
            "publish": publishing,
        },
    )
