"""The image stage of `bootseer exec`: replay the hot-block record, or arrange for the agent to take one.

First it probes each root's filesystem (probe.py): does it keep a file's pages across opens?

With a record for `image_key`: check it against the files (stale ones are skipped; into a loader's own
cache each file is read as soon as its own check says fresh: freshness.py), replay it file by
file for at most `[image] foreground_s`, and hand whatever is left to the agent, which reads it behind
the program. Replay is skipped, with one line saying why, where it cannot pay: `[image] replay =
"auto"` on a tree that drops pages at every open (the replay would be thrown away when the program
opens the file; "always" when the loader keeps a cache of its own), or when the never-slower verdict
(status.py) found that this record's replay made starts slower. A record that is mostly stale is taken
again, never by an eviction walk before exec.

Without one (and `record` is not "never"): watch the opens of the roots' mounts with fanotify
(opens.py) and give the agent a "hot-record" task with the group's fd; it asks `mincore` about the
files the start opened when the start is over, and publishes. Where fanotify is not allowed (not
root), a time-bounded eviction walk (`EVICT_BUDGET_S`) is the fallback. An empty last record is
warned about here (the agent cannot print to the start's output) and not retried on every start.
Everything that goes wrong here is a warning: the job starts anyway, only slower.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BlobMissing, IntegrityError, StoreError
from ..stage import StageContext, StageResult
from ..units import fmt_bytes
from .agent_tasks import DRAINING_FILE, JudgeTask, PrefetchTask, RecordTask
from .pagecache import evict, untrusted_files
from .probe import probe_roots
from .ready import parse_mode
from .roots import refusal, resolve_roots

if TYPE_CHECKING:
    from .freshness import Check
    from .pagecache import FileInfo
    from .probe import Probe
    from .record import Record, Staleness
    from .replay import Extent, ReplayResult

# A record whose fresh part is less than half of its bytes describes another image: take it again.
STALE_RERECORD = 0.5
REMAINING_FILE = "hot-remaining.json"
STATS_FILE = "hot-stats.json"
COVERED_FILE = "hot-covered.json"
# Without fanotify, the eviction walk before exec stops after this long (issue 16: a first start
# must cost little); the record then covers the files the walk reached.
EVICT_BUDGET_S = 3.0
_SAID: set[tuple[str, str]] = set()  # (mount, record) whose loader's own cache this process announced
_WARMING: list[threading.Thread] = []  # the stats `_warm_metadata` started, for `_replay` to wait for
_INTO_LOADER: set[str] = set()  # records this process replays into a loader's own cache (replay.run(into_loader))
_CHECKING: list[Check] = []  # the ref's staleness check, still running beside the load (`_start_check`)


def run_stage(ctx: StageContext) -> StageResult:
    """Replay the record of this image when there is a usable one, else arrange for a new one."""
    from ..gc import touch_used
    from .record import REF_KIND, load

    image = ctx.settings.image
    mode = image.record
    image_key = ctx.keys.image.digest
    roots = resolve_roots(image)
    why_record, stale = "no record", False
    _CHECKING.clear()  # a check is this start's own
    try:
        ref = ctx.store.read_ref(REF_KIND, image_key)
        check = _start_check(ctx, ref, roots) if ref is not None and mode != "always" else None
        if check is not None and mode == "auto" and _mostly_stale(ctx, check):
            return _arrange_recording(ctx, image_key, roots, "record mostly stale", True)
        skipped = _skip_before_load(ctx, image_key, ref, roots)
        if skipped is not None:
            return skipped
        if ref is None or str(ref.get("blob", "")) not in _INTO_LOADER:
            _checked()  # only a replay into a loader's own cache reads beside the check (`_replay`)
        found = _from_ref(ref, image_key, roots)
        if found is None and ref is not None:
            found = load(ctx.settings.p2p, ctx.store, ctx.cache, image_key, roots, doc=ref)
    except IntegrityError as e:  # a corrupt record is replaced by a new one
        ctx.warn(f"image: the hot-block record is unusable ({e}); taking a new one")
        found, why_record = None, "record unusable"
    except BlobMissing as e:  # the store answered without the blob: that lasts, so a new record replaces it
        ctx.warn(f"image: the hot-block record is gone from the store ({e}); taking a new one")
        found, why_record = None, "record gone"
    except (StoreError, OSError) as e:  # unreachable store: start without replay (and without a record to publish)
        ctx.warn(f"image: cannot read the hot-block record ({e}); starting without replay")
        return StageResult(outcome="fallback", summary="no replay (store)", cache="miss", reason=str(e))
    if found is not None and mode != "always":
        rec, doc = found
        touch_used(ctx.store, "hot", image_key, doc)  # at most once a day: `bootseer gc` keeps what jobs use
        result = _replay(ctx, rec, doc)
        if result is not None:
            return result
        why_record, stale = "record mostly stale", True
    elif mode == "always":
        why_record = '[image] record = "always"'
    if mode == "never":
        return StageResult(outcome="skipped", summary="no record", cache="miss", reason="no record; record = never")
    return _arrange_recording(ctx, image_key, roots, why_record, stale)


def _replay(ctx: StageContext, rec: Record, doc: dict[str, Any]) -> StageResult | None:
    """Replay in the foreground up to the deadline; None when the record is too stale to use."""
    from .record import Staleness
    from .replay import cut, plan, run, source_paths, sources_of

    image = ctx.settings.image
    t0 = time.monotonic()
    deadline = t0 + image.foreground_s
    started = time.time()
    warming = _WARMING.pop() if _WARMING else None  # the sources' stats, beside the check's (`_warm_metadata`)
    check = _CHECKING.pop() if _CHECKING else None
    if check is not None and not (str(doc.get("blob", "")) in _INTO_LOADER and check.agrees(rec.files)):
        check.wait()
        check = None
    if check is not None:  # "not mostly stale", or no verdict asked (record = never); its stats go on beside the reads
        work, staleness = cut(rec), Staleness()
    else:
        work, staleness = plan(rec)
    if staleness.stale_share > STALE_RERECORD and image.record != "never":
        _warn_stale(ctx, staleness)
        return None
    skip = _why_not_replay(ctx, rec, str(doc.get("blob", "")))
    if skip is not None:
        ctx.info(f"image: not replaying: {skip[1]}")
        _judge_later(ctx, rec.image_key, str(doc.get("blob", "")), replayed=False, started=started)
        return StageResult(outcome="skipped", summary=f"no replay ({skip[0]})", cache="hit", reason=skip[1])
    into_loader = str(doc.get("blob", "")) in _INTO_LOADER
    if warming is not None:
        sources = None
    else:
        sources = source_paths(list(rec.files), set(rec.files)) if check is not None else sources_of(rec, staleness)
    res = run(
        work,
        threads=image.prefetch_threads,
        mbps=image.prefetch_mbps,
        deadline=deadline,
        stats=sources,
        wide=True,  # the program waits for this replay: every stream at once (replay.run)
        into_loader=into_loader,
        ready=check.answer if check is not None else None,
    )
    if check is not None:  # the complete check: what the stage reports, and no stale file handed on
        staleness, _ = check.wait()
        res.remaining = _not_known_stale(res.remaining, staleness)
    if warming is not None:
        warming.join(max(0.0, deadline - time.monotonic()))
        res.stats_left = warming.is_alive()
    res.staleness = staleness
    summary = _replay_summary(ctx, rec, doc, res, into_loader)
    _judge_later(ctx, rec.image_key, str(doc.get("blob", "")), replayed=True, started=started)
    return _replayed_result(res, doc, summary)


def _replay_summary(ctx: StageContext, rec: Record, doc: dict[str, Any], res: ReplayResult, into_loader: bool) -> str:
    """The summary line's words for a replay, after handing what the deadline cut short to the agent."""
    from .replay import sources_of

    staleness = res.staleness
    parts = [f"replayed {fmt_bytes(res.bytes_read)}"]
    # Into a loader's own cache the sources' stats are requests the program would make one by one
    # (`_warm_metadata`), on a thread that dies with exec: where the deadline cut the replay or them
    # short they go to the agent with the extents (a stat already answered is not asked again).
    stats = sources_of(rec, staleness) if into_loader and (res.remaining or res.stats_left) else []
    if res.remaining or stats:
        parts.append(_hand_on_remaining(ctx, res.remaining, into_loader, stats))
    if staleness.stale_files:
        parts.append(f"{len(staleness.stale_files)} stale file(s) skipped")
    if str(doc.get("coverage", "full")) != "full":  # the opens its recording lost (opens.py)
        parts.append(f"record coverage {doc['coverage']}")
    return ", ".join(parts)


def _start_check(ctx: StageContext, ref: dict[str, Any], roots: list[str]) -> Check | None:
    """Start the check of the ref's own list of sizes and mtimes (`deps`) and keep it (`_CHECKING`);
    None when the ref has no such list.

    The check (`freshness.Check`) stats the files with the most recorded bytes first. A replay into a
    loader's own cache reads each file as soon as its own stat says fresh, beside the rest of the check
    (issue 28: the check of `import torch`'s record was ~1,067 requests on rclone, 0.6-2.0 s before the
    first read); any other start waits for the whole check after the probe (`_checked`), as before. It is
    started whether or not the record may be taken again: with `record = "never"` no verdict is asked
    (`_mostly_stale`), and the replay's reads still go beside the check."""
    from .freshness import Check
    from .record import ref_deps

    deps = ref_deps(ref, roots)
    if deps is None:
        return None
    # a stat can hang on a dead mount: no wait on the check outlasts what a replay may hold the start back
    check = Check(deps, STALE_RERECORD, deadline=time.monotonic() + ctx.settings.image.foreground_s).start()
    _CHECKING[:] = [check]
    return check


def _mostly_stale(ctx: StageContext, check: Check) -> bool:
    """Whether the check shows the record mostly stale, as soon as that is certain: then it is taken
    again without loading it (no Parquet, no pyarrow), and the check is forgotten."""
    if not check.mostly_stale():
        return False
    _CHECKING.clear()
    staleness, _ = check.wait()  # the warning counts every file
    _warn_stale(ctx, staleness)
    return True


def _checked() -> None:
    """Wait for the ref's staleness check to end (`_start_check`), and forget it."""
    while _CHECKING:
        _CHECKING.pop().wait()


def _warn_stale(ctx: StageContext, staleness: Staleness) -> None:
    files = staleness.fresh_files + len(staleness.stale_files)
    ctx.warn(
        f"image: the hot-block record is mostly stale ({len(staleness.stale_files)} of {files} files "
        f"changed, {staleness.stale_share:.0%} of its bytes); taking a new one"
    )


def _skip_before_load(
    ctx: StageContext, image_key: str, doc: dict[str, Any] | None, roots: list[str]
) -> StageResult | None:
    """A record of whole files (its tree dropped pages at open) is not even loaded where replay would be
    skipped anyway: its ref says so, and not importing pyarrow keeps such a start at no-bootseer speed.
    Unless the loader keeps a cache of its own (loadercache.py): the replay then fills that cache."""
    image = ctx.settings.image
    if image.replay != "auto" or image.record == "always":
        return None
    if not doc or doc.get("method") != "opened-files":
        return None
    blob = str(doc.get("blob", ""))
    if _announce_known(ctx, image_key, blob, [str(r) for r in doc.get("roots", [])]):
        _warm_metadata(doc, roots)
        return None
    hint = doc.get("probe")
    hints = [(str(hint[0]), int(hint[1]))] if isinstance(hint, list) and len(hint) == 2 else None
    drops = [p for p in probe_roots([str(r) for r in doc.get("roots", [])], hints) if p.drops]
    if not drops:
        return None
    line = _not_into_loader(ctx, image_key, blob, drops, _ref_samples(doc, roots))
    if line is None:
        _warm_metadata(doc, roots)
        return None
    ctx.info(f"image: not replaying: {line}")
    _judge_later(ctx, image_key, blob, replayed=False, started=time.time())
    return StageResult(outcome="skipped", summary="no replay (pages dropped at open)", cache="hit", reason=line)


def _from_ref(ref: dict[str, Any] | None, image_key: str, roots: list[str]) -> tuple[Record, dict[str, Any]] | None:
    """Where the stage is replaying into a loader's own cache (`_warm_metadata` started) and the record
    is of whole files, the record from its ref alone (`record.from_deps`): no blob, no pyarrow."""
    from .record import from_deps

    if ref is None or not _WARMING:
        return None
    rec = from_deps(ref, image_key, roots)
    return (rec, ref) if rec is not None else None


def _warm_metadata(doc: dict[str, Any], roots: list[str]) -> None:
    """Stat the sources of the record's `.pyc` files, then the files themselves (the ref's `deps`, under
    `roots`), on a thread from now on: while the Parquet blob and pyarrow load, then beside the record
    check (which stats the files: the kernel has one lookup of a name in flight at a time, so the two
    never ask twice) and the reads. The stage is replaying into the loader's own cache, and on such a
    loader a stat is a request (rclone: a HEAD per object, kept in its memory after), one that the check,
    the replay's opens and the program's imports would otherwise pay in turn, after the load. Issue 28:
    402 modules, 804 HEADs that took 0.45 s in the check and 0.7 s beside the reads."""
    from .record import stat_many, within
    from .replay import source_paths

    deps = doc.get("deps")
    if not isinstance(deps, list):
        return
    inside = within(roots)
    paths = [d[0] for d in deps if isinstance(d, list) and d and isinstance(d[0], str) and inside(d[0])]
    if paths:
        # the files' own stats are the staleness check's, running already where the ref has `deps`
        todo = source_paths(paths, set(paths)) + ([] if _CHECKING else paths)
        thread = threading.Thread(target=stat_many, args=(todo,), name="hot-warm-stat", daemon=True)
        thread.start()
        _WARMING.append(thread)


def _ref_samples(doc: dict[str, Any], roots: list[str]) -> list[tuple[str, int, int]]:
    """The extents a ref names for judging a loader's own cache (none in refs published before them),
    under the configured `roots` only (a ref comes from the store: see `record.confine`)."""
    from .record import within

    inside = within(roots)
    out: list[tuple[str, int, int]] = []
    for s in doc.get("samples") or []:
        if isinstance(s, list) and len(s) == 3 and isinstance(s[0], str) and inside(s[0]):
            try:
                out.append((s[0], int(s[1]), int(s[2])))
            except (TypeError, ValueError):
                continue
    return out


def _not_into_loader(
    ctx: StageContext, image_key: str, blob: str, drops: list[Probe], samples: list[tuple[str, int, int]]
) -> str | None:
    """None when every root in `drops` has a loader that keeps a cache of its own (a replay fills it: said
    in one line); else the line that says why a replay would be thrown away."""
    from .loadercache import decide

    found = [decide(ctx.store, image_key, blob, p.root, samples) for p in drops]
    if all(j.own_cache for j in found):
        _INTO_LOADER.add(blob)
        if (found[0].mount, blob) not in _SAID:  # once, though the stage asks before and after loading
            _SAID.add((found[0].mount, blob))
            ctx.info(f"image: {drops[0].line()}, but {found[0].line()}: replaying into it")
        return None
    bad = next(j for j in found if not j.own_cache)
    return (
        f"{drops[0].line()} and {bad.line()}, so a replay would be thrown away when the program opens the file; "
        f'set [image] replay = "always" if the loader keeps a cache of its own'
    )


def _announce_known(ctx: StageContext, image_key: str, blob: str, roots: list[str]) -> bool:
    """Whether every root's loader is known (this process, or the store) to keep a cache of its own for
    this record: a replay then goes ahead without a probe (`loadercache.known_to_keep`); said once."""
    from .loadercache import known_to_keep

    try:
        known = known_to_keep(ctx.store, image_key, blob, roots)
    except OSError:
        return False
    if known is None:
        return False
    _INTO_LOADER.add(blob)
    if (known.mount, blob) not in _SAID:
        _SAID.add((known.mount, blob))
        ctx.info(f"image: {known.mount.split(' ')[0]}: {known.line()}: replaying into it")
    return True


def _why_not_replay(ctx: StageContext, rec: Record, blob: str) -> tuple[str, str] | None:
    """(summary words, one line) when this start should not replay: the setting, the tree, the verdict."""
    from .status import needs_control, read_verdict

    setting = ctx.settings.image.replay
    if setting == "never":
        return "replay = never", '[image] replay = "never"'
    if setting == "auto" and not _announce_known(ctx, rec.image_key, blob, rec.roots):
        hints = [(path, off) for path, off, _ in rec.extents[:: max(1, len(rec.extents) // 64)]]
        drops = [p for p in probe_roots(rec.roots, hints) if p.drops]
        if drops:
            from .loadercache import pick_samples

            line = _not_into_loader(ctx, rec.image_key, blob, drops, pick_samples(rec.extents, None))
            if line is not None:
                return "pages dropped at open", line
    try:
        verdict = read_verdict(ctx.store, rec.image_key, blob)
    except (StoreError, OSError):
        return None
    if verdict.get("off"):
        return "replay did not pay", f"replay is off for this image until the record changes: {verdict['why']}"
    if needs_control(verdict):
        return "control start", (
            "a control start: the replay did not clearly beat the recording start, so this start runs "
            "without it and the never-slower rule compares the two"
        )
    return None


def _not_known_stale(remaining: list[Extent], staleness: Staleness) -> list[Extent]:
    """What the agent may read of what the deadline left: all but the files the check found stale. A
    file whose stat had not answered by the deadline (a short `foreground_s`, a slow loader) is handed
    on too: the agent's read of it is what a replay without the check did, while dropping it left the
    program to fetch it (the check's threads die with exec)."""
    stale = set(staleness.stale_files)
    return [e for e in remaining if e[0] not in stale]


def _judge_later(ctx: StageContext, image_key: str, blob: str, replayed: bool, started: float) -> None:
    """Have the agent time this start to ready, for the never-slower verdict (status.py), and keep what
    this start learned about the loaders' own caches (loadercache.py; here when there is no agent)."""
    from .loadercache import remember, take_pending

    loader = take_pending()
    if ctx.settings.exec.agent and blob:
        ready = ctx.settings.image.ready
        task = JudgeTask(image_key=image_key, record=blob, replayed=replayed, started=started, ready=ready)
        ctx.add_agent_task(replace(task, loader=loader) if loader else task)
    else:
        remember(ctx.store, image_key, blob, loader)


def _hand_on_remaining(
    ctx: StageContext, remaining: list[Extent], into_loader: bool = False, stats: list[str] | None = None
) -> str:
    """Give what the deadline cut short (extents, and `stats` to make beside them) to the agent (a
    "hot-prefetch" task); returns the summary part."""
    left = fmt_bytes(sum(n for _, _, n in remaining))
    said = f"{left} and {len(stats)} stats" if stats else left
    if not ctx.settings.exec.agent:
        return f"{said} left undone (no agent)"
    path = ctx.run.run_dir / REMAINING_FILE
    _write_json(path, remaining)
    image = ctx.settings.image
    task = PrefetchTask(file=str(path), threads=image.prefetch_threads, mbps=image.prefetch_mbps)
    if into_loader:
        task = replace(task, into_loader=True)
    if stats:
        _write_json(ctx.run.run_dir / STATS_FILE, stats)
        task = replace(task, stats=str(ctx.run.run_dir / STATS_FILE))
    ctx.add_agent_task(task)
    return f"{said} to the agent"


def _write_json(path: Path, doc: object) -> None:
    """Temp name + rename: the agent never reads a half-written list."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _replayed_result(res: ReplayResult, doc: dict[str, Any], summary: str) -> StageResult:
    """The stage's result for a replay: bytes read, where the record came from, what was stale or left."""
    return StageResult(
        outcome="hit",
        summary=summary,
        cache="hit",
        bytes=res.bytes_read,
        bytes_from_store=int(doc.get("_bytes_from_store", 0)),
        extra={
            "stale_files": len(res.staleness.stale_files),
            "stale_bytes": res.staleness.stale_bytes,
            "remaining_bytes": sum(n for _, _, n in res.remaining),
            "record": doc.get("blob", ""),
        },
    )


def _skipped(summary: str, reason: str) -> StageResult:
    return StageResult(outcome="skipped", summary=summary, cache="miss", reason=reason)


def _arrange_recording(ctx: StageContext, image_key: str, roots: list[str], why: str, stale: bool) -> StageResult:
    """Watch the start's opens (fanotify) and give the agent a "hot-record" task; or fall back (see module doc).

    With fanotify, the roots are probed by the agent after the start (a probe reads a page, which on
    a lazy tree is a fetch the start need not pay); the eviction fallback must know before.
    """
    from .opens import open_group

    if not ctx.settings.exec.agent:
        ctx.warn("image: recording hot blocks needs the agent ([exec] agent = true); not recording")
        return _skipped("not recorded (no agent)", "no agent")
    held = _empty_backoff(ctx, image_key, roots)
    if held is not None:
        return held
    image = ctx.settings.image
    base = RecordTask(
        image_key=image_key, roots=list(roots), ready=parse_mode(image.ready), max_files=image.record_max_files
    )
    fan_fd, no_fanotify = open_group(roots)
    if fan_fd is not None:
        ctx.agent_fds.append(fan_fd)
        ctx.add_agent_task(replace(base, fan_fd=fan_fd, started=time.time()))
        ctx.after_agent.append(lambda: _wait_for_drain(ctx, image.foreground_s))
        return StageResult(
            outcome="miss", summary=f"recording this start ({why})", cache="miss", reason=why, extra={"roots": roots}
        )
    drops = [p.root for p in probe_roots(roots) if p.drops]
    return _record_by_eviction(ctx, base, drops, why, stale, no_fanotify)


def _wait_for_drain(ctx: StageContext, timeout: float) -> None:
    """Hold the launcher back until the agent reads the opens' queue (it says so with `DRAINING_FILE`),
    at most `timeout` ([image] foreground_s). The agent's own start takes a second or so; a program that
    opens more than the queue holds meanwhile (a dataset, or another process on the mount) would lose
    that window's opens, the imports among them, which are the hottest blocks of the record (issue 44).
    Only a recording start waits, once per image."""
    marker = ctx.run.run_dir / DRAINING_FILE
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if time.monotonic() >= deadline:
            ctx.warn(f"image: the agent did not read the opens within {timeout:g} s; the record may be partial")
            return
        time.sleep(0.005)


def _empty_backoff(ctx: StageContext, image_key: str, roots: list[str]) -> StageResult | None:
    """Warn about an empty last record; a skipped result while `record = "auto"` backs off from it."""
    from .status import empty_backoff, read_empty

    try:
        if ctx.settings.image.record == "always":
            last = read_empty(ctx.store, image_key)
            held = None
        else:
            held = empty_backoff(ctx.store, image_key, roots)
            last = {"why": held[0]} if held else read_empty(ctx.store, image_key)
    except (StoreError, OSError):
        return None
    if last is None:
        return None
    if held is None:
        ctx.warn(f"image: the last hot-block record of this image was empty ({last.get('why')}); trying again")
        return None
    ctx.warn(
        f"image: the last hot-block record of this image was empty ({held[0]}); not recording again for "
        f"{held[1]} more start(s) or until the roots change"
    )
    return _skipped("not recorded (last record empty)", f"last record empty: {held[0]}")


def _record_by_eviction(
    ctx: StageContext, base: RecordTask, drops: list[str], why: str, stale: bool, no_fanotify: str
) -> StageResult:
    """Without fanotify: evict what a time-bounded walk reaches, record those files at the end."""
    if drops:
        line = f"{drops[0]} drops pages at every open and {no_fanotify}: cannot record its hot blocks"
        ctx.warn(f"image: {line}")
        return _skipped("not recorded (pages dropped at open)", line)
    if stale:  # a stale record must not cost a walk before exec (issue 19)
        line = f"the record is mostly stale and {no_fanotify}; not re-recording (run `bootseer hot record`)"
        ctx.warn(f"image: {line}")
        return _skipped("not recorded (stale record)", line)
    ctx.info(f"image: recording by eviction ({no_fanotify})")
    files, complete = _bounded_walk(base.roots, EVICT_BUDGET_S)
    bad = untrusted_files(files)
    if bad:
        refused = refusal(files, bad)
        ctx.warn(f"image: {refused}")
        return _skipped("not recorded (privilege)", refused)
    evict(files)
    covered = ctx.run.run_dir / COVERED_FILE
    _write_json(covered, [f.path for f in files])
    if not complete:
        ctx.info(f"image: eviction walk stopped at {EVICT_BUDGET_S:g} s; the record covers {len(files)} files")
    ctx.add_agent_task(replace(base, covered=str(covered), started=time.time()))
    return StageResult(
        outcome="miss",
        summary=f"recording this start ({why})",
        cache="miss",
        reason=f"{why}; by eviction: {no_fanotify}",
        extra={"files": len(files), "roots": base.roots, "walk_complete": complete},
    )


def _bounded_walk(roots: list[str], budget_s: float) -> tuple[list[FileInfo], bool]:
    """The files under `roots` a walk reaches within `budget_s`; (files, whether the walk finished)."""
    from .pagecache import walk_files

    deadline = time.monotonic() + budget_s
    files: list[FileInfo] = []
    for f in walk_files(roots):
        files.append(f)
        if len(files) % 256 == 0 and time.monotonic() > deadline:
            return files, False
    return files, True
