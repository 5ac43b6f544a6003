"""When is a start over? `[image] ready`: "call", "quiet", or a number of seconds.

- "call": the training script calls `bootseer_cli.ready()`, which touches `ready` in the run dir.
- "quiet": the resident set of the launcher's process tree has stopped growing for `QUIET_S`
  (imports and library loads grow it; a training loop does not), and none of its processes was
  seen waiting for a filesystem meanwhile (state D, or asleep on a FUSE request: a lazy loader).
- a number: that many seconds after the launcher started.

Every mode also ends when the launcher exits (a short program's whole run is its start) and after
`MAX_WAIT_S` at most, so a record is never waited for forever.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError

QUIET_S = 3.0
QUIET_GROWTH = 1 << 20  # growth under 1 MiB per QUIET_S window counts as quiet
POLL_S = 0.25
MAX_WAIT_S = 1800.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


def parse_mode(value: object) -> str | float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"[image] ready: {value} is negative")
        return float(value)
    text = str(value).strip().lower()
    if text in ("call", "quiet"):
        return text
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(f'[image] ready: {value!r} is not "call", "quiet" or a number of seconds') from None
    if seconds < 0:
        raise ConfigError(f"[image] ready: {value} is negative")
    return seconds


def tree_activity(pid: int) -> tuple[int, bool]:
    """(resident bytes of `pid` and its descendants, whether one of them is waiting for a filesystem).

    A start blocked on a lazy loader (a read or page fault: state D; a FUSE lookup or open: asleep in
    `request_wait_answer`) does not grow its resident set for seconds, but it is not quiet.
    """
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ppid = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
        states[int(entry)] = fields[0]
    total, blocked = 0, False
    stack = [pid]
    seen: set[int] = set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        blocked = blocked or _waiting_for_fs(p, states.get(p, ""))
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
        stack.extend(children.get(p, ()))
    return total, blocked


def _waiting_for_fs(pid: int, state: str) -> bool:
    if state == "D":
        return True
    if state != "S":
        return False
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
    except OSError:
        return False
    return "fuse" in wchan or wchan == "request_wait_answer"


def wait_ready(
    mode: str | float,
    pid: int,
    ready_file: Path,
    alive: Callable[[], bool],
    sleep: Callable[[float], bool],
    started: float | None = None,
) -> str:
    """Block until the start is over; returns why: "ready", "quiet", "timer", "exit" or "timeout".

    `sleep(s)` returns True when the caller is being stopped (then this returns "exit").
    """
    return wait_ready_at(mode, pid, ready_file, alive, sleep, started)[0]


def wait_ready_at(
    mode: str | float,
    pid: int,
    ready_file: Path,
    alive: Callable[[], bool],
    sleep: Callable[[float], bool],
    started: float | None = None,
) -> tuple[str, float]:
    """`wait_ready`, and when the start was over (wall clock): the moment to compare starts by.

    For "quiet" that is the last growth of the resident set, not the end of the quiet window, so a
    start's time-to-ready does not include the `QUIET_S` that proved it.
    """
    started = time.time() if started is None else started
    last_rss, last_change = -1, time.monotonic()
    while True:
        if mode == "call" and ready_file.exists():
            try:
                return "ready", ready_file.stat().st_mtime
            except OSError:
                return "ready", time.time()
        if isinstance(mode, float) and time.time() - started >= mode:
            return "timer", started + mode
        if mode == "quiet":
            rss, blocked = tree_activity(pid)
            now = time.monotonic()
            if last_rss < 0 or rss - last_rss >= QUIET_GROWTH or blocked:
                last_rss, last_change = rss, now
            elif now - last_change >= QUIET_S:
                return "quiet", time.time() - (now - last_change)
        if time.time() - started >= MAX_WAIT_S:
            return "timeout", time.time()
        if not alive() or sleep(POLL_S):
            return "exit", time.time()
