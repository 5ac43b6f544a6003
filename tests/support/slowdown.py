"""The suite's one knob for deadlines that are the behaviour under test.

A test that checks that bootseer gives up at a deadline (a stalled writer, a lease's TTL, a store that
stops answering) sets that deadline short, so the suite stays fast; on a loaded machine the same short
deadline fires where nothing is wrong (issue 46: `no writer made progress in 0.5 s` under load 4-6).
Such tests take their deadlines through `scaled()`: `BOOTSEER_TEST_SLOWDOWN` (a factor, default 1;
`bash .ci/run --under-load` sets it with the background load it starts) stretches every one of them
alike, so the ratios a test relies on (a writer's pace against its stall deadline) hold at any factor.
Read once at import, before the per-test fixture clears `BOOTSEER_*` from the environment.
"""

from __future__ import annotations

import os


def _factor() -> float:
    raw = os.environ.get("BOOTSEER_TEST_SLOWDOWN", "").strip()
    try:
        value = float(raw) if raw else 1.0
    except ValueError:
        raise SystemExit(f"BOOTSEER_TEST_SLOWDOWN must be a number >= 1, not {raw!r}") from None
    if value < 1:
        raise SystemExit(f"BOOTSEER_TEST_SLOWDOWN must be a number >= 1, not {raw!r}")
    return value


SLOWDOWN = _factor()


def scaled(seconds: float) -> float:
    """`seconds` stretched by the suite's slowdown factor."""
    return seconds * SLOWDOWN
