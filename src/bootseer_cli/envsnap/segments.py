"""Writing a snapshot blob on several cores: forked segment writers, and writers of the large files
that start while the scan still runs.

On 2 cores a capture is CPU-bound like `tar -I 'zstd -T0' -cf`, so what decides is how much of the
time both cores work. The small files are cut into contiguous pieces that forked writers take from
a queue, one after the other (Python's per-file work runs in parallel, not only zstd's, and the
writers end together); the large files (more than half a frame) go to two to four more writers
whose zstd uses every core (`big_writers`). Those are started by the scan itself, with the first
large changed files it meets (`BigWriter.offer`), so the heaviest work (a 434 MB `libtorch_cpu.so`)
runs on the core the scan leaves idle while it waits for inodes, instead of after it. The small
files' pieces are appended to the blob in their order; what a large-file writer has written goes in
as it reports it (whole frames, every REPORT_BYTES), before, between or after them (`_Appender`), so
the blob has the one format whichever writer made which part, and what is left to append once the
last writer ends is its last report.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..errors import BootseerError
from .format import CHUNK_BYTES, ArchiveEntry, ArchiveWriter, Written
from .manifest import FILE, Entry, Manifest, hardlink_groups

SEGMENT_MIN_ENTRIES = 2000  # fewer entries per worker than this: forking costs more than it saves
# The small files' writers yield to the large-file writer while both run: it is the longest job and,
# alone at the end, its zstd keeps only ~1.2 of 2 cores busy, where the small writers (independent
# processes) fill both; so it goes first, and they take every cycle it leaves.
SMALL_NICE = 5
# What a small file costs a writer beyond its bytes, counted as bytes: its open, stat, read (cold:
# a disk read each) and header, ~50 µs, against ~6 ms per MiB of zstd and reading. Timed on the
# torch venv's small files, cold: 11,456 files of 79 MiB took 1.08 s, 868 files of 84 MiB 0.55 s.
# At 512 bytes (a header block) the torch venv's two segments were 7,683 and 12,324 files, and the
# second writer ran alone for the last 0.3-0.5 s of a capture, on one core of two.
FILE_COST = 8 << 10
PIECES_PER_WORKER = 4  # the small files' pieces per writer (see `_write_segments`)
CORES_PER_BIG_WRITER = 4  # one large-file writer per this many cores, at least two (see `big_writers`) …
BIG_WRITERS_MAX = 4  # … and no more
# The capture runs before exec: a writer stuck in a read (a hung network filesystem under a root)
# must not hold the job back for ever. Its part grows at every frame it writes (a few MB at most),
# so a capture whose writers neither report nor grow a part for this long is given up (one line; the
# setup's tree is used as it is, not captured).
STALL_S = 120.0


def is_big(e: Entry) -> bool:
    """A file the blob gives frames of its own (more than half a frame), compressed on every core."""
    return e.kind == FILE and e.size > CHUNK_BYTES // 2


def big_writers(cores: int) -> int:
    """How many large-file writers a capture forks on `cores` cores: two, one per CORES_PER_BIG_WRITER
    cores from 12 on, at most BIG_WRITERS_MAX (one on a single core).

    Each large file is its own zstd frame, and a frame ends with every job of it done before the next
    file is read: one writer leaves cores idle at every file's end, and reads the files one after the
    other, the page cache cold. On a 16-core node the capture of the CUDA torch tree (most of its
    4.4 GB in large files) kept 3.3 cores busy against tar's 5.9 (docs/notes/envsnap.md §7, session 14), and
    on 2 cores a tree of large libraries took 1.28x tar's time with one writer, 1.02-1.06x with two,
    at the same CPU (session 15). While one writer waits, another reads and compresses. Each keeps a
    zstd thread per core, so the last one still running at the end has them all. Four on 2 cores
    cost 7 % more CPU and were no faster than two."""
    return 1 if cores < 2 else min(BIG_WRITERS_MAX, max(2, cores // CORES_PER_BIG_WRITER))


class _Kid:
    """One large-file writer: its child, its part, the pipe its paths go into, what it was sent."""

    def __init__(self, part: Path) -> None:
        self.part = part
        self.pid = 0
        self.paths_fd = -1
        self.result_fd = -1
        self.pending = bytearray()
        self.load = 0  # bytes of the files it was sent

    def flush(self) -> None:
        """Write what the pipe takes now. A writer that has stopped (an error it will report, or a
        crash: its result then lacks its last report) takes nothing more; its report says why."""
        try:
            while self.pending:
                n = os.write(self.paths_fd, self.pending)
                del self.pending[:n]
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self.pending.clear()


class BigWriter:
    """The large changed files' writers: forked children that write each into their parts as soon as
    the scan offers it, while the scan goes on (see `big_writers`; each offered file goes to the one
    with the fewest bytes so far).

    Offered are only files that are large, changed against `baseline` (the diff's own rule) and have
    one link (a hardlinked file may have to follow its target in the stream); the rest of the large
    files are sent when the scan is done (`finish_input`). Paths go over pipes, NUL-separated; the
    parent never blocks on one during the scan (what does not fit waits in the writer's `pending`)."""

    def __init__(
        self, part: Path, baseline: Manifest, roots: list[str] | None = None, defer_same_size: bool = False
    ) -> None:
        """`defer_same_size`: a layer's capture; a file that kept its size may hold its parent's bytes
        (rewrites.py) and is left for after the scan, when that is known."""
        self.part = part  # the parts' common name: `<part>0`, `<part>1`, …
        self.baseline = baseline
        self.defer_same_size = defer_same_size
        self.roots = roots  # the files are read through no-follow descriptors from these
        self.writers = big_writers(os.cpu_count() or 1)
        self.kids: list[_Kid] = []
        self.failed = False
        self.sent: set[str] = set()

    @property
    def started(self) -> bool:
        return bool(self.kids)

    def offer(self, path: str, e: Entry) -> None:
        """The scan's callback for every entry it records."""
        if not is_big(e) or e.nlink != 1:
            return
        b = self.baseline.get(path)
        if b is not None and (e.same_content(b) or (self.defer_same_size and b.kind == e.kind and b.size == e.size)):
            return
        if self.failed:
            return
        if len(self.kids) < self.writers:  # the first large files start the writers, one each
            try:
                self._start()
            except OSError:  # no fork now (a process limit): the writers so far take the rest
                if not self.kids:
                    self.failed = True  # none: the large files go the old way, after the scan
                    return
                self.writers = len(self.kids)
        self._send(path, e.size)

    def _start(self) -> None:
        kid = _Kid(self.part.with_name(f"{self.part.name}{len(self.kids)}"))
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
                for other in self.kids:  # a sibling's input must end when the parent closes it
                    os.close(other.paths_fd)
                    os.close(other.result_fd)
                os.close(paths_w)
                os.close(result_r)
                _big_child(kid.part, paths_r, result_w, self.roots)
        finally:
            gc.unfreeze()
        os.close(paths_r)
        os.close(result_w)
        os.set_blocking(paths_w, False)
        kid.pid, kid.paths_fd, kid.result_fd = pid, paths_w, result_r
        self.kids.append(kid)

    def _send(self, path: str, size: int) -> None:
        kid = min(self.kids, key=lambda k: k.load)
        kid.load += size
        self.sent.add(path)
        kid.pending += os.fsencode(path) + b"\0"
        kid.flush()

    def finish_input(self, rest: list[tuple[str, int]]) -> None:
        """Send the large files the scan did not offer (paths and sizes), then end every writer's
        input (each ends its part)."""
        for path, size in rest:
            self._send(path, size)
        for kid in self.kids:
            os.set_blocking(kid.paths_fd, True)
            kid.flush()
            os.close(kid.paths_fd)
            kid.paths_fd = -1

    def hand_over(self) -> list[tuple[int, int, Path]]:
        """The writers' pids, report descriptors and parts, now the caller's to read and reap."""
        out = [(k.pid, k.result_fd, k.part) for k in self.kids]
        for k in self.kids:
            k.pid, k.result_fd = 0, -1
        return out

    def abort(self) -> None:
        """Stop the children (if any), reap them, remove their parts."""
        for kid in self.kids:
            for fd in (kid.paths_fd, kid.result_fd):
                if fd >= 0:
                    os.close(fd)
            kid.paths_fd = kid.result_fd = -1
            _stop(kid.pid)
            kid.pid = 0
            kid.part.unlink(missing_ok=True)


# A large-file writer reports what it has written once this much of its part is new (at a file's end:
# whole frames), and the parent appends each report while the writers go on: what is left once they
# end is the last report, not a whole part (~2 GB for the CUDA torch tree, copied and hashed with the
# other cores idle: ~1 s on 16 cores). 0: one report, at the end (as before session 15).
REPORT_BYTES = 32 << 20


def _big_child(  # pragma: no cover - forked child
    part: Path, paths_fd: int, result_fd: int, roots: list[str] | None
) -> None:
    """Write each path read from `paths_fd` into the segment `part` as it arrives, reporting what it
    wrote every REPORT_BYTES (`_reports`); never returns."""

    import queue
    import threading

    every = REPORT_BYTES
    paths: queue.SimpleQueue[str | BaseException | None] = queue.SimpleQueue()

    def take() -> None:
        """Read the paths as they come, whatever the writer does meanwhile: it blocks on a report
        until the parent reads its reports, which the parent starts once every path is sent, so a
        writer that stopped reading its paths while it waited would stall both for ever."""
        buf = b""
        try:
            while chunk := os.read(paths_fd, 1 << 16):
                *got, buf = (buf + chunk).split(b"\0")
                for p in got:
                    paths.put(os.fsdecode(p))
            paths.put(None)
        except BaseException as e:  # the writer raises it: a part without every path is no part
            paths.put(e)

    threading.Thread(target=take, name="bootseer-paths", daemon=True).start()

    def write(sw: ArchiveWriter, out: TextIO) -> None:
        while (p := paths.get()) is not None:
            if isinstance(p, BaseException):
                raise p
            sw.add_now(p)
            if every and sw.unreported() >= every:
                _write_report(out, *sw.report())

    _reports(part, result_fd, os.cpu_count() or 1, write, roots)


def _reports(  # pragma: no cover - runs in a forked child
    part: Path, wfd: int, threads: int, write: Callable[[ArchiveWriter, TextIO], None], roots: list[str] | None
) -> None:
    """A large-file writer's output on `wfd`: reports as `write` makes them, then the last one
    (marked `last`), or the error; never returns. A writer that dies leaves no `last` report."""
    try:
        with os.fdopen(wfd, "w") as out:
            try:
                sw = ArchiveWriter(part, threads=threads, segment=True, roots=roots)
                write(sw, out)
                doc, rows = sw.end_segment()
                _write_report(out, dict(doc, last=True), rows)
            except BaseException as e:  # reported to the parent, which raises it
                out.write(json.dumps({"error": str(e) or type(e).__name__}) + "\n")
    finally:
        os._exit(0)


def _write_report(out: TextIO, doc: dict[str, Any], rows: str) -> None:  # pragma: no cover - forked child
    """One report: its summary, a newline, its entries' JSON rows (which the parent puts into the
    trailer as they are), a newline. Compact JSON holds no raw newline."""
    out.write(json.dumps(doc) + "\n" + rows + "\n")
    out.flush()


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
            w = ArchiveWriter(tmp, progress=advance, roots=list(meta["roots"]))
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
    """`changed` cut into `n` contiguous runs of about equal work: a file's bytes plus FILE_COST, any
    other entry a header block."""
    weight = [after[p].size + FILE_COST if after[p].kind == FILE else 512 for p in changed]
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
    """Fork the writers, then append their parts to `w` as they come: the small files' pieces in
    their order (a hardlink's target is in its own or an earlier piece, so it stays ahead of the
    link), the large files' part as soon as it is done (`_Appender`)."""
    targets = set(links.values())
    big = [p for p in changed if is_big(after[p]) and p not in links and p not in targets]
    big_set = set(big)
    small = [p for p in changed if p not in big_set] if big else changed
    # The small files in PIECES_PER_WORKER pieces per writer, taken from a queue: a writer that is
    # done early takes the next piece, so the writers end together (with one fixed segment each, the
    # one with more small files ran alone, on one core of two, for the capture's last 0.1-0.4 s).
    pieces = _segments(after, small, min(255, workers * PIECES_PER_WORKER)) if small else []
    early_started = early is not None and early.started
    parts = [tmp.with_name(f"{tmp.name}.part{k}") for k in range(len(pieces))]
    late = tmp.with_name(f"{tmp.name}.partlarge")
    app = _Appender(w, parts, advance)
    try:
        if early is not None and early_started:
            _finish_early(early, big, big_set, after, app)
        queue_r = _piece_queue(len(pieces))
        try:
            gc.freeze()  # the manifest stays shared copy-on-write: no child's collection walks (copies) it
            try:
                jobs: list[tuple[Path | None, int]] = [(None, 1)] * min(workers, len(pieces))
                if big and not early_started:  # whose zstd uses every core (a 434 MB libtorch_cpu.so)
                    jobs.append((late, os.cpu_count() or 1))
                for job_part, threads in jobs:
                    r, wfd = os.pipe()
                    pid = os.fork()
                    if pid == 0:  # pragma: no cover - runs in the child
                        gc.disable()
                        os.close(r)
                        if job_part is None:
                            _segment_child(parts, pieces, queue_r, after, links, wfd, w.roots)
                        else:
                            _large_child(job_part, big, after, links, threads, wfd, w.roots)
                    os.close(wfd)
                    app.watch(pid, r, job_part)
            finally:
                gc.unfreeze()
        finally:
            os.close(queue_r)
        app.run()
    finally:
        app.stop()
        for part in [*parts, late]:
            part.unlink(missing_ok=True)


def _finish_early(early: BigWriter, big: list[str], big_set: set[str], after: Manifest, app: _Appender) -> None:
    """End the input of the large-file writer the scan started, before any other writer is forked (a fork
    would inherit the pipe's write end, and that writer would see no end of its input until the fork
    exited); the appender reaps it and reads its report, like the others'."""
    if not early.sent <= big_set:  # the scan's rule and this one differ: a bug, not the tree
        raise BootseerError("capture: the large-file writer was sent a file the blob does not hold")
    early.finish_input([(p, after[p].size) for p in big if p not in early.sent])
    for pid, fd, part in early.hand_over():
        app.watch(pid, fd, part, eager=True)


def _piece_queue(n: int) -> int:
    """A pipe holding the numbers of `n` pieces (at most 255 bytes: within its buffer), its write end
    closed: the read end, from which each forked writer takes its next piece."""
    r, w = os.pipe()
    try:
        os.write(w, bytes(range(n)))
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


class _Appender:
    """Reads the writers' reports as they come and appends what each reports once it may go: a small
    files' piece when every earlier piece is in, a large-file writer's report at once (each is whole
    frames, so the small pieces may go between two of them). A report is a summary, a newline, its
    entries, a newline; a small writer makes one per piece, a large one every REPORT_BYTES and one
    marked `last` at its end."""

    def __init__(self, w: ArchiveWriter, parts: list[Path], advance: Callable[[int], None]) -> None:
        self.w, self.parts, self.advance = w, parts, advance
        self.kids: dict[int, tuple[int, Path | None, bytearray]] = {}  # fd -> (pid, its part if large, buffer)
        self.done: dict[int, tuple[dict[str, Any], str]] = {}  # small pieces reported, not yet appended
        self.next = 0  # the next piece to append
        self.large: dict[Path, bool] = {}  # large parts still being written: appended as they come?
        self.held: list[tuple[Path, dict[str, Any], str]] = []  # large reports to go after the pieces

    def watch(self, pid: int, fd: int, large: Path | None, eager: bool = False) -> None:
        """Read the writer `pid`'s reports on `fd`; `large`: its one part, whose reports are appended
        as they come where `eager` (the scan's writers), else after the small files' pieces (a
        squash's)."""
        self.kids[fd] = (pid, large, bytearray())
        if large is not None:
            self.large[large] = eager

    def run(self) -> None:
        import select

        stall = _Stall(self)
        while self.kids:
            ready = select.select(list(self.kids), [], [], min(STALL_S, 5.0))[0]
            stall.check(bool(ready))
            for fd in ready:
                pid, large, buf = self.kids[fd]
                data = os.read(fd, 1 << 20)
                if data:
                    buf += data
                    for doc, rows in _reports_in(buf):
                        if large is None:
                            self.done[doc["piece"]] = (doc, rows)
                        elif self.large[large]:
                            self._append(large, doc, rows)
                        else:
                            self.held.append((large, doc, rows))
                        if large is not None and doc.get("last") and self.large.pop(large):
                            large.unlink(missing_ok=True)  # all of it is in (the sink holds it open)
                    continue
                del self.kids[fd]
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.waitpid(pid, 0)
                if buf or large in self.large:  # part of a report, or no last one: it was cut off
                    raise BootseerError("a capture worker died")
            while self.next in self.done:
                doc, rows = self.done.pop(self.next)
                self._append(self.parts[self.next], doc, rows)
                self.parts[self.next].unlink(missing_ok=True)
                self.next += 1
        if self.next < len(self.parts):
            raise BootseerError("a capture worker died")  # it took a piece and never reported it
        for part, doc, rows in self.held:
            self._append(part, doc, rows)
            if doc.get("last"):
                part.unlink(missing_ok=True)

    def _append(self, part: Path, doc: dict[str, Any], rows: str) -> None:
        if doc["frames"] or doc["end"] > doc["start"]:
            self.w.append_segment(part, doc, rows)
        self.advance(doc["raw"])

    def written(self) -> int:
        """The bytes in the parts still being written (what the writers have done so far)."""
        size = 0
        for part in [*self.parts[self.next :], *self.large]:
            with contextlib.suppress(OSError):
                size += part.stat().st_size
        return size

    def stop(self) -> None:
        """A failure part way: no writer goes on in the background (each is stopped and reaped)."""
        for fd, (pid, _, _) in self.kids.items():
            with contextlib.suppress(OSError):
                os.close(fd)
            _stop(pid)
        self.kids.clear()


class _Stall:
    """The appender's deadline: STALL_S without a report and without a part growing."""

    def __init__(self, app: _Appender) -> None:
        self.app, self.clock = app, time.monotonic
        self.since, self.size = self.clock(), -1

    def check(self, reported: bool) -> None:
        now = self.clock()
        if not reported:
            size = self.app.written()
            if size == self.size:
                if now - self.since >= STALL_S:
                    raise BootseerError(f"capture: no writer made progress in {STALL_S:g} s (a read that hangs?)")
                return
            self.size = size
        self.since = now


def _reports_in(buf: bytearray) -> list[tuple[dict[str, Any], str]]:
    """The complete reports in `buf`, taken out of it; a writer's error raises."""
    out: list[tuple[dict[str, Any], str]] = []
    while (i := buf.find(b"\n")) >= 0:
        doc = json.loads(buf[:i])
        if "error" in doc:
            raise BootseerError(str(doc["error"]))
        j = buf.find(b"\n", i + 1)
        if j < 0:
            break  # its entries are still coming
        out.append((doc, buf[i + 1 : j].decode()))
        del buf[: j + 1]
    return out


def _segment_child(  # pragma: no cover - runs in a forked child
    parts: list[Path],
    pieces: list[list[str]],
    queue_fd: int,
    after: Manifest,
    links: dict[str, str],
    wfd: int,
    roots: list[str] | None,
) -> None:
    """A small files' writer: takes piece after piece from the queue (one byte each, its index) and
    reports each as it is written (or the error) on `wfd`; never returns."""
    try:
        os.nice(SMALL_NICE)  # see SMALL_NICE
        with os.fdopen(wfd, "w") as out:
            try:
                while k := os.read(queue_fd, 1):
                    sw = ArchiveWriter(parts[k[0]], threads=1, segment=True, roots=roots)
                    for p in pieces[k[0]]:
                        sw.add(p, after[p], link_to=links.get(p))
                    doc, rows = sw.end_segment()
                    out.write(json.dumps(dict(doc, piece=k[0])) + "\n" + rows + "\n")
                    out.flush()
            except BaseException as e:  # reported to the parent, which raises it
                out.write(json.dumps({"error": str(e) or type(e).__name__}) + "\n")
    finally:
        os._exit(0)


def _large_child(  # pragma: no cover - runs in a forked child
    part: Path,
    paths: list[str],
    after: Manifest,
    links: dict[str, str],
    threads: int,
    wfd: int,
    roots: list[str] | None,
) -> None:
    """The large files' writer when the scan started none: one part, one report; never returns."""

    def write(sw: ArchiveWriter, out: TextIO) -> None:
        for p in paths:
            sw.add(p, after[p], link_to=links.get(p))

    _reports(part, wfd, threads, write, roots)
