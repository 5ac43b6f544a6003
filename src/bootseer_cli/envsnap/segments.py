"""Writing a snapshot blob on several cores: forked segment writers, and a writer of the large files
that starts while the scan still runs.

On 2 cores a capture is CPU-bound like `tar -I 'zstd -T0' -cf`, so what decides is how much of the
time both cores work. The small files are cut into contiguous segments, one forked writer each
(Python's per-file work runs in parallel, not only zstd's); the large files (more than half a frame)
go to one more writer whose zstd uses every core. That writer is started by the scan itself, at the
first large changed file it meets (`BigWriter.offer`), so the heaviest work (a 434 MB
`libtorch_cpu.so`) runs on the core the scan leaves idle while it waits for inodes, instead of after
it. The small files' parts are appended to the blob in their order; the large files' part goes in as
soon as it is done, before or after them (`_append_order`), so the blob has the one format whichever
writer made which part.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import BootseerError
from .format import CHUNK_BYTES, ArchiveEntry, ArchiveWriter, Written
from .manifest import FILE, Entry, Manifest, hardlink_groups

SEGMENT_MIN_ENTRIES = 2000  # fewer entries per worker than this: forking costs more than it saves
# The small files' writers yield to the large-file writer while both run: it is the longest job and,
# alone at the end, its zstd keeps only ~1.2 of 2 cores busy, where the small writers (independent
# processes) fill both; so it goes first, and they take every cycle it leaves.
SMALL_NICE = 5


def is_big(e: Entry) -> bool:
    """A file the blob gives frames of its own (more than half a frame), compressed on every core."""
    return e.kind == FILE and e.size > CHUNK_BYTES // 2


class BigWriter:
    """The large changed files' writer: a forked child that writes each into its part as soon as the
    scan offers it, while the scan goes on.

    Offered are only files that are large, changed against `baseline` (the diff's own rule) and have
    one link (a hardlinked file may have to follow its target in the stream); the rest of the large
    files are sent when the scan is done (`finish_input`). Paths go over a pipe, NUL-separated; the
    parent never blocks on it during the scan (what does not fit waits in `_pending`)."""

    def __init__(self, part: Path, baseline: Manifest) -> None:
        self.part = part
        self.baseline = baseline
        self.pid = 0
        self.failed = False
        self.sent: set[str] = set()
        self.result_fd = -1
        self._paths_fd = -1
        self._pending = bytearray()

    @property
    def started(self) -> bool:
        return self.pid != 0

    def offer(self, path: str, e: Entry) -> None:
        """The scan's callback for every entry it records."""
        if not is_big(e) or e.nlink != 1:
            return
        b = self.baseline.get(path)
        if b is not None and e.same_content(b):
            return
        if self.failed:
            return
        if not self.pid:
            try:
                self._start()
            except OSError:  # no fork now (a process limit): the large files go the old way, after the scan
                self.failed = True
                return
        self._send([path])

    def _start(self) -> None:
        paths_r, paths_w = os.pipe()
        result_r, result_w = os.pipe()
        gc.freeze()  # the manifests stay shared copy-on-write: no collection in the child walks them
        try:
            try:
                pid = os.fork()
            except OSError:
                for fd in (paths_r, paths_w, result_r, result_w):
                    os.close(fd)
                raise
            if pid == 0:  # pragma: no cover - runs in the child
                gc.disable()
                os.close(paths_w)
                os.close(result_r)
                _big_child(self.part, paths_r, result_w)
        finally:
            gc.unfreeze()
        os.close(paths_r)
        os.close(result_w)
        os.set_blocking(paths_w, False)
        self.pid, self._paths_fd, self.result_fd = pid, paths_w, result_r

    def _send(self, paths: list[str]) -> None:
        for p in paths:
            self.sent.add(p)
            self._pending += os.fsencode(p) + b"\0"
        self._flush()

    def _flush(self) -> None:
        """Write what the pipe takes now. A writer that has stopped (an error it will report, or a
        crash: its result is then empty) takes nothing more; its report says why, at the end."""
        try:
            while self._pending:
                n = os.write(self._paths_fd, self._pending)
                del self._pending[:n]
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self._pending.clear()

    def finish_input(self, rest: list[str]) -> None:
        """Send the large files the scan did not offer, then end the child's input (it ends its part)."""
        for p in rest:
            self.sent.add(p)
            self._pending += os.fsencode(p) + b"\0"
        os.set_blocking(self._paths_fd, True)
        self._flush()
        os.close(self._paths_fd)
        self._paths_fd = -1

    def abort(self) -> None:
        """Stop the child (if any), reap it, remove its part."""
        for fd in (self._paths_fd, self.result_fd):
            if fd >= 0:
                os.close(fd)
        self._paths_fd = self.result_fd = -1
        _stop(self.pid)
        self.pid = 0
        self.part.unlink(missing_ok=True)


def _big_child(part: Path, paths_fd: int, result_fd: int) -> None:  # pragma: no cover - forked child
    """Write each path read from `paths_fd` into the segment `part` as it arrives; report like
    `_segment_child`; never returns."""
    try:
        sw = ArchiveWriter(part, threads=os.cpu_count() or 1, segment=True)
        buf = b""
        while chunk := os.read(paths_fd, 1 << 16):
            *paths, buf = (buf + chunk).split(b"\0")
            for p in paths:
                sw.add_now(os.fsdecode(p))
        payload = _payload(*sw.end_segment())
    except BaseException as e:  # reported to the parent, which raises it
        payload = json.dumps({"error": str(e) or type(e).__name__})
    _report(result_fd, payload)


def _payload(doc: dict[str, Any], rows_json: str) -> str:
    """A writer's report: its summary, a newline, its entries' JSON rows (which the parent puts into
    the trailer as they are). Compact JSON holds no raw newline: the first one is the boundary."""
    return json.dumps(doc) + "\n" + rows_json


def _report(fd: int, payload: str) -> None:  # pragma: no cover - forked child
    try:
        with os.fdopen(fd, "w") as out:
            out.write(payload)
    finally:
        os._exit(0)


def _stop(pid: int) -> None:
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)


def write_blob(
    tmp: Path,
    after: Manifest,
    changed: list[str],
    meta: dict[str, Any],
    progress: bool | None,
    big: BigWriter | None = None,
) -> tuple[Written, list[ArchiveEntry]]:
    """The blob of `changed` at `tmp` (removed again on any failure); its summary and entries.

    With several cores (and fork), or a `big` writer the scan already started, contiguous segments
    of `changed` are written by forked workers and appended in order; else one writer does it all."""
    from ..progress import byte_bar

    links = hardlink_groups(after, changed)
    total = sum(after[p].size for p in changed if after[p].kind == FILE)
    workers = min(os.cpu_count() or 1, max(1, len(changed) // SEGMENT_MIN_ENTRIES))
    w: ArchiveWriter | None = None
    try:
        with byte_bar(total, "capture", enabled=progress) as advance:
            w = ArchiveWriter(tmp, progress=advance)
            if (big is not None and big.started) or (workers > 1 and hasattr(os, "fork")):
                _write_segments(w, tmp, after, changed, links, workers, advance, big)
            else:
                for p in changed:
                    w.add(p, after[p], link_to=links.get(p))
            return w.finish(meta), w.entries
    except BaseException:
        if w is not None:
            w.abort()
        raise
    finally:
        if big is not None:
            big.abort()  # reaped already on success; on a failure: stopped, its part removed


def _segments(after: Manifest, changed: list[str], n: int) -> list[list[str]]:
    """`changed` cut into `n` contiguous runs of about equal bytes (each entry counts a header block)."""
    weight = [(after[p].size if after[p].kind == FILE else 0) + 512 for p in changed]
    share = sum(weight) / n
    out: list[list[str]] = [[]]
    acc = 0.0
    for p, wgt in zip(changed, weight, strict=True):
        if acc >= share * len(out) and len(out) < n:
            out.append([])
        out[-1].append(p)
        acc += wgt
    return [seg for seg in out if seg]


def _write_segments(
    w: ArchiveWriter,
    tmp: Path,
    after: Manifest,
    changed: list[str],
    links: dict[str, str],
    workers: int,
    advance: Callable[[int], None],
    early: BigWriter | None,
) -> None:
    """Fork one writer per segment, then append their outputs to `w` in order as each finishes.

    A hardlink's target is in its own or an earlier segment, so it stays ahead of the link."""
    targets = set(links.values())
    big = [p for p in changed if is_big(after[p]) and p not in links and p not in targets]
    big_set = set(big)
    small = [p for p in changed if p not in big_set] if big else changed
    # the small files in `workers` segments, one thread each; the large ones last, in one more worker
    # whose zstd uses every core (a 434 MB libtorch_cpu.so on one thread would outlast all the rest)
    plan = [(seg, 1) for seg in _segments(after, small, workers)] if small else []
    early_started = early is not None and early.started
    if big and not early_started:
        plan.append((big, os.cpu_count() or 1))
    kids: list[tuple[int, int, Path]] = []
    last: list[tuple[int, int, Path]] = []  # the large files' writer: appended after the small ones
    try:
        if early is not None and early_started:
            # its input ends before any other writer is forked: a fork would inherit the pipe's write
            # end, and the large-file writer would see no end of its input until that writer exited
            if not early.sent <= big_set:  # the scan's rule and this one differ: a bug, not the tree
                raise BootseerError("capture: the large-file writer was sent a file the blob does not hold")
            early.finish_input([p for p in big if p not in early.sent])
            last.append((early.pid, early.result_fd, early.part))
            early.pid, early.result_fd = 0, -1  # reaped below, like the others
        gc.freeze()  # the manifest stays shared copy-on-write: no child's collection walks (copies) it
        try:
            for k, (seg, threads) in enumerate(plan):
                part = tmp.with_name(f"{tmp.name}.part{k}")
                r, wfd = os.pipe()
                pid = os.fork()
                if pid == 0:  # pragma: no cover - runs in the child
                    gc.disable()
                    os.close(r)
                    _segment_child(part, seg, after, links, threads, wfd)
                os.close(wfd)
                kids.append((pid, r, part))
        finally:
            gc.unfreeze()
        kids += last
        last.clear()
        for i in _append_order(kids, big_at=len(plan) if early_started else -1):
            pid, r, part = kids[i]
            kids[i] = (pid, -1, part)  # the reader below owns `r` and closes it
            with os.fdopen(r, "rb") as f:
                head, _, rows = f.read().partition(b"\n")
            doc = json.loads(head or b'{"error": "a capture worker died"}')
            os.waitpid(pid, 0)
            kids[i] = (0, -1, part)
            if "error" in doc:
                raise BootseerError(str(doc["error"]))
            w.append_segment(part, doc, rows.decode())
            advance(doc["raw"])
            part.unlink(missing_ok=True)
    finally:
        for pid, r, part in kids + last:
            if r >= 0:
                with contextlib.suppress(OSError):
                    os.close(r)
            _stop(pid)  # a failure part way: no writer goes on in the background
            part.unlink(missing_ok=True)


def _append_order(kids: list[tuple[int, int, Path]], big_at: int) -> Iterator[int]:
    """The order the writers' parts go into the blob: the small files' parts in their order (a
    hardlink's target before the link), and the large files' part (at `big_at`; -1: none of its own)
    as soon as it is done, wherever that falls between them. Whatever is appended after the last
    writer ends is the capture's serial tail; the large files' part is the biggest, and no restore
    depends on where it lies (directories are made on demand and get their modes at the end; GNU tar
    makes a missing parent too)."""
    import select

    small = deque(i for i in range(len(kids)) if i != big_at)
    big = big_at >= 0
    while small or big:
        if small and big:
            ready = select.select([kids[small[0]][1], kids[big_at][1]], [], [])[0]
            if kids[big_at][1] in ready:
                big = False
                yield big_at
                continue
        if small:
            yield small.popleft()
        else:
            big = False
            yield big_at


def _segment_child(  # pragma: no cover - runs in a forked child
    part: Path, seg: list[str], after: Manifest, links: dict[str, str], threads: int, wfd: int
) -> None:
    """Write one segment and report it (or the error) as JSON on `wfd`; never returns."""
    try:
        if threads == 1:
            os.nice(SMALL_NICE)  # a small files' writer (see SMALL_NICE)
        sw = ArchiveWriter(part, threads=threads, segment=True)
        for p in seg:
            sw.add(p, after[p], link_to=links.get(p))
        payload = _payload(*sw.end_segment())
    except BaseException as e:  # reported to the parent, which raises it
        payload = json.dumps({"error": str(e) or type(e).__name__})
    _report(wfd, payload)
