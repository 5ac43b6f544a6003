"""How bootseer writes sizes and durations for people: one convention everywhere.

Sizes are decimal SI units (kB, MB, GB, TB: powers of 1000), as pip, uv and docker print them, so a
figure in bootseer's output compares directly with theirs. Binary units appear only where a
quantity is binary by nature (cell sizes and read sizes given as MiB in options and docs).
"""

from __future__ import annotations

import time


def fmt_bytes(n: float) -> str:
    """`512 B`, `1.5 kB`, `203.4 MB`, `2.1 GB`."""
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000.0
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def count(n: int, word: str, plural: str = "") -> str:
    """`1 file`, `2 files`, `1,234 files`: a count with its noun in the right number (`1 files`, issue 46)."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def fmt_rate(n_bytes: float, seconds: float) -> str:
    """`300 B/s`, `22.5 MB/s`; `–` when no time was measured. In the units of `fmt_bytes`, so a small
    transfer reads `850 kB/s`, never `0 MB/s`."""
    return f"{fmt_bytes(n_bytes / seconds)}/s" if seconds > 0 else "–"


def fmt_seconds(s: float) -> str:
    """`120 ms`, `1.5 s`, `123 s`: whole milliseconds below 0.1 s, whole seconds from 100 s."""
    if s >= 100:
        return f"{s:.0f} s"
    return f"{s:.1f} s" if s >= 0.1 else f"{s * 1000:.0f} ms"


def fmt_age(ts: float, now: float | None = None) -> str:
    """How long ago `ts` was, in the largest whole unit: `3d`, `5h`, `12m`, `40s`."""
    s = max(0.0, (time.time() if now is None else now) - ts)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit}"
    return f"{s:.0f}s"


def fmt_time(ts: float) -> str:
    """A local wall-clock time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
