"""The pages of files that the job's processes have mapped, read from their page tables.

On a tree that drops a file's pages at every open (a FUSE loader without keep-cache: rclone, s3fs),
`mincore` at ready sees nothing (the agent's own open drops the pages), so the record lists the files
the start opened, whole. For Python modules that is what the import reads; for the shared libraries
it maps it is not: `import torch` maps 483 MB of libraries and touches about a fifth of them, so a
whole-file replay would move 5x what the cold start fetches, and lose behind a capped link.

The page tables know better, and reading them opens no file: `/proc/<pid>/maps` names each file-backed
mapping (start, end, file offset, path) and `/proc/<pid>/pagemap` has one 64-bit entry per virtual
page whose bit 63 says "present": a page the process faulted in (or that fault-around mapped from the
page cache, so a page the loader fetched anyway). Present pages of a mapping at file offset `o` are
file pages `o / PAGE + i`. The present bit needs no privilege beyond reading the process's pagemap
(the page frame numbers do, and are not used).

Whose page tables: only the launcher's and its descendants' (the processes `bootseer exec` started),
found by parent pid, each opened once as a `/proc/<pid>` directory fd whose parent is checked through
that same fd, so a pid reused by another process in between is never read. Nothing under the roots is
opened or followed: paths are only compared with the roots and, later, the files the start opened.

A short program's page tables are gone when it exits (its whole run is its start, so "ready" is its
exit), hence `Sampler`: a thread that samples every `PERIOD_S` while the start runs and once more at
ready, and keeps the union. Pages faulted in during the last period before an exit are missed; the
replay is a prefetch, so a missed page is fetched by the program on demand, as without bootseer.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import threading
import time
from collections.abc import Iterable

from .pagecache import PAGE_SIZE, runs_from_vector

PERIOD_S = 0.25
WINDOW_PAGES = 1 << 16  # pagemap entries read at a time (512 KiB): 256 MiB of a mapping
MAX_FILE_PAGES = 1 << 24  # pages of one file recorded at most (64 GiB): one byte each while sampling
# bit 63 of a pagemap entry is "present"; little-endian, so it is the top bit of the entry's last byte
_PRESENT_RUN = re.compile(rb"[\x80-\xff]+")
_DELETED = " (deleted)"


def descendants(launcher: int, ignore: Iterable[int] = ()) -> dict[int, int]:
    """{pid: parent} for `launcher` (parent 0) and every process below it, by one scan of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        ppid = _parent(f"/proc/{entry}/stat")
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry))
    skip = set(ignore)
    out: dict[int, int] = {launcher: 0}
    stack = [launcher]
    while stack:
        p = stack.pop()
        for c in children.get(p, ()):
            if c not in out and c not in skip:
                out[c] = p
                stack.append(c)
    return out


def _parent(path: str, dir_fd: int | None = None) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        return int(data.rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def _read_all(name: str, dir_fd: int) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        parts = []
        while chunk := os.read(fd, 1 << 16):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


class MappedPages:
    """The union, over samples, of the present pages of files under `roots` mapped by the job's processes."""

    def __init__(self, launcher: int, roots: list[str], ignore_pids: Iterable[int] = ()) -> None:
        self.launcher = launcher
        self.prefixes = tuple(os.fsencode(os.path.realpath(r).rstrip("/") + "/") for r in roots)
        self.ignore = {os.getpid(), *ignore_pids}
        self.pages: dict[str, bytearray] = {}  # path -> one byte per file page, 1 where seen present
        self.samples = 0
        self.seconds = 0.0  # spent sampling
        try:  # the launcher itself, pinned: once it has exited its pid may be another process's
            self._pidfd: int | None = os.pidfd_open(launcher)
        except (AttributeError, OSError):
            self._pidfd = None

    def _launcher_gone(self) -> bool:
        if self._pidfd is None:
            return False
        return bool(select.select([self._pidfd], [], [], 0)[0])

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def sample(self) -> None:
        """Add the pages present now in every process of the launcher's tree (never raises for a process
        that is gone or not readable: it is skipped)."""
        t0 = time.perf_counter()
        if self._launcher_gone():  # its tree is no longer the job's to read (nor, once reaped, its pid)
            return
        for pid, parent in descendants(self.launcher, self.ignore).items():
            with contextlib.suppress(OSError):
                self._sample_pid(pid, parent)
        self.samples += 1
        self.seconds += time.perf_counter() - t0

    def _sample_pid(self, pid: int, parent: int) -> None:
        dfd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # the fd pins this process: if the pid was reused since the scan, its parent is not ours (and
            # the launcher, opened here, is ours if it has not exited by now)
            if (_parent("stat", dfd) != parent) if parent else self._launcher_gone():
                return
            mine = [m for m in _parse_maps(_read_all("maps", dfd)) if m[3].startswith(self.prefixes)]
            if not mine:
                return
            pm = os.open("pagemap", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
            try:
                for start, end, offset, raw in mine:
                    self._add(pm, start, end, offset, raw)
            finally:
                os.close(pm)
        finally:
            os.close(dfd)

    def _add(self, pm: int, start: int, end: int, offset: int, raw: bytes) -> None:
        """The present pages of one mapping, read in windows: a job that maps a huge (sparse) file under
        the roots costs this reader (root's agent) bounded memory, and pages past MAX_FILE_PAGES of a
        file are not recorded (a prefetch skips them; the program reads them on demand)."""
        first = offset // PAGE_SIZE
        n = min((end - start) // PAGE_SIZE, max(0, MAX_FILE_PAGES - first))
        path = os.fsdecode(raw)
        for w in range(0, n, WINDOW_PAGES):
            k = min(WINDOW_PAGES, n - w)
            present = os.pread(pm, k * 8, (start // PAGE_SIZE + w) * 8)[7::8]
            runs = [(m.start() + w, m.end() + w) for m in _PRESENT_RUN.finditer(present)]
            if not runs:
                continue
            seen = self.pages.setdefault(path, bytearray())
            need = first + runs[-1][1]
            if len(seen) < need:
                seen.extend(bytes(need - len(seen)))
            for a, b in runs:
                seen[first + a : first + b] = b"\x01" * (b - a)

    def runs(self) -> dict[str, list[tuple[int, int]]]:
        """{path: [(first page, count), ...]} of every file seen mapped with a page present."""
        return {p: runs_from_vector(bytes(v)) for p, v in self.pages.items() if any(v)}


def _parse_maps(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(start, end, file offset, path) of each file-backed mapping in a maps listing. A path the kernel
    escaped (a newline in it) or marks deleted is left out: it names no file the record could use."""
    out = []
    for line in data.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith(b"/") or b"\\" in parts[5]:
            continue
        path = parts[5]
        if path.endswith(_DELETED.encode()):
            continue
        try:
            lo, hi = (int(x, 16) for x in parts[0].split(b"-"))
            out.append((lo, hi, int(parts[2], 16), path))
        except ValueError:
            continue
    return out


class Sampler:
    """`MappedPages` sampled every `period` seconds on a thread of its own (a read of a process's maps
    can wait behind a page fault on a slow loader: it must not hold up the wait for ready), and once
    more at `finish` (the processes are alive at ready unless the start was their whole run)."""

    def __init__(self, pages: MappedPages, period: float = PERIOD_S) -> None:
        self.pages, self.period = pages, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hot-mapped", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self.pages.sample()
            if self._stop.wait(self.period):
                self.pages.sample()  # the last one, at ready
                return

    def finish(self, timeout: float = 5.0) -> dict[str, list[tuple[int, int]]] | None:
        """Stop after a last sample and return the runs; None when the thread did not end within `timeout`
        (a read stuck behind a page fault: it is left to end on its own, and the record does without)."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            return None
        self.pages.close()
        return self.pages.runs()


def on_fuse(roots: list[str]) -> bool:
    """Whether a root is on a FUSE mount: the trees that may drop pages at open, where the record needs
    the page tables (elsewhere mincore sees the pages, and sampling would only cost CPU)."""
    from .probe import fstype_of

    return any(fstype_of(r).startswith("fuse") for r in roots)
