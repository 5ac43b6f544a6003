"""The record's staleness check, beside the replay's reads (issue 28, item 5).

On a loader that answers a stat with a request (rclone asks the bucket for each object's mtime, and lists
each directory once) the check of `import torch`'s record made ~1,067 requests in 0.6-2.0 s, and the
replay into the loader's own cache waited for all of them before reading the first byte of torch's two
libraries (62 of its 80 MB). `Check` stats the files on a pool of `STAT_THREADS`, the files with the most
recorded bytes first, and answers two questions as soon as they are known:

- `mostly_stale()`: whether the record's stale share is above the threshold (the stage then records
  again). It is exact, never a guess from a sample: it returns as soon as the files checked so far
  settle the answer whatever the rest turn out to be (fresh bytes at least `1 - threshold` of the
  record's: not mostly stale; stale bytes above `threshold`: mostly stale), else once every file is
  checked. Stat'ing the longest files first makes that early on records whose bytes are in a few large
  files (torch: after its two libraries); on a record of many equal small files it waits for about
  half of them. The replay starts no read before this answer, so a mostly stale record is read nothing.
- `fresh(path)`: whether `path` still has its recorded size and mtime, waiting for its own stat only.
  The replay opens a file after this says yes, and never reads a stale one. `answer(path)` tells "not
  known by the deadline" (None) from stale: such a file is left to the agent with the rest.

`wait()` gives the complete `Staleness` (what the stage reports), once every file is checked.

Every wait ends at `deadline` (the stage gives the start's `[image] foreground_s`): a stat can hang on a
dead mount, and the job must start anyway. Past it, an undecided verdict is "not mostly stale" (nothing
is read unless its own file was found fresh), a file not yet checked is not fresh (never read), and
`wait()` gives what was checked (`complete` says whether that is all).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .record import STAT_THREADS, Staleness, _count

Dep = tuple[str, int, int, int]  # path, size, mtime_ns, recorded bytes


@dataclass
class _State:
    staleness: Staleness = field(default_factory=Staleness)
    fresh: set[str] = field(default_factory=set)
    checked: set[str] = field(default_factory=set)


class Check:
    """Stat `deps` longest first on up to `threads` threads (`start`); answers as in the module doc."""

    def __init__(
        self, deps: list[Dep], threshold: float, threads: int = STAT_THREADS, deadline: float | None = None
    ) -> None:
        self.deps = sorted(deps, key=lambda d: -d[3])  # stable: equal files keep the record's order
        self.paths = {d[0] for d in self.deps}
        self.threshold = threshold
        self.total = sum(d[3] for d in self.deps)
        self.threads = max(1, min(threads, len(self.deps)))
        self.state = _State()
        self.cond = threading.Condition()
        self.next_index = 0
        self.left = len(self.deps)
        self.workers: list[threading.Thread] = []
        self.deadline = deadline  # monotonic: no wait below goes past it

    def start(self) -> Check:
        self.workers = [
            threading.Thread(target=self._work, name=f"hot-check-{i}", daemon=True) for i in range(self.threads)
        ]
        for t in self.workers:
            t.start()
        return self

    def _work(self) -> None:
        while True:
            with self.cond:
                if self.next_index >= len(self.deps):
                    return
                path, size, mtime_ns, n = self.deps[self.next_index]
                self.next_index += 1
            try:
                s: os.stat_result | None = os.stat(path)
            except OSError:
                s = None
            with self.cond:
                st = self.state
                _count(st.staleness, st.fresh, path, s, size, mtime_ns, n)
                st.checked.add(path)
                self.left -= 1
                self.cond.notify_all()

    def _settled(self) -> bool | None:
        """True/False once the mostly-stale answer cannot change; None while it still can."""
        st = self.state.staleness
        if self.left == 0:
            return st.stale_share > self.threshold
        if st.stale_bytes > self.threshold * self.total:
            return True
        if self.total and st.fresh_bytes >= (1 - self.threshold) * self.total:
            return False
        return None

    def _until(self, done: Callable[[], bool]) -> bool:
        """Wait (holding `cond`) until `done()` or the deadline; whether `done()` came first."""
        while not done():
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self.cond.wait(left)
        return True

    def mostly_stale(self) -> bool:
        """Whether the record's stale share is above the threshold, as soon as that is certain (False
        when the deadline comes first)."""
        with self.cond:
            return self._until(lambda: self._settled() is not None) and bool(self._settled())

    def fresh(self, path: str) -> bool:
        """Whether `path` is a file of the record that still has its size and mtime (after its stat; False
        when the deadline comes first)."""
        return bool(self.answer(path))

    def answer(self, path: str) -> bool | None:
        """`fresh(path)`, but None where the deadline came before its stat answered: not known stale, so
        what the stage could not read of it may still go to the agent (`replay.run(ready=)`)."""
        if path not in self.paths:
            return False
        with self.cond:
            if not self._until(lambda: path in self.state.checked):
                return None
            return path in self.state.fresh

    @property
    def complete(self) -> bool:
        """Whether every file has been checked."""
        with self.cond:
            return self.left == 0

    def wait(self) -> tuple[Staleness, set[str]]:
        """The check: (counts, fresh paths), once every file is stat'ed or the deadline passed."""
        with self.cond:
            self._until(lambda: self.left == 0)
            return self.state.staleness, set(self.state.fresh)

    def agrees(self, files: dict[str, tuple[int, int]]) -> bool:
        """Whether this check covers exactly `files` (a record's path -> (size, mtime_ns)), with the same
        sizes and mtimes: only then may the replay take its answers for the record's."""
        return files == {d[0]: (d[1], d[2]) for d in self.deps}
