"""Pausing Python's cyclic garbage collector around a bounded burst of allocation.

A restore or a capture builds tens of thousands of small objects (a 21k-entry plan, its rows, the
stamp's) that live until the work ends and form no cycles. Each 700 allocations the collector walks
the young objects, and ever more often the older ones: 188 collections took ~50 ms of a torch venv's
restore, all of it on the serial path before and after the parallel workers. Paused for the work,
the few cycles it makes are collected when the collector runs again."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside; the collector's previous state afterwards (nesting is fine)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
