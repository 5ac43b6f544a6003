"""Progress bars for long transfers: tqdm on a terminal, nothing when output is a log file or a pipe."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def byte_bar(total: int | None, desc: str, enabled: bool | None = None) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(n_bytes)` callback; a real bar only when stderr is a terminal.

    Sizes are decimal SI (kB, MB: powers of 1000), as everywhere in bootseer's output (units.py).
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda _n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000, leave=False) as bar:
        yield bar.update
