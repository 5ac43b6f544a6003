"""The collector pause around a restore's burst of allocation (`gcpause.collector_paused`): no automatic
collection inside, and the collector as it was afterwards, whatever happens inside."""

from __future__ import annotations

import gc

import pytest

from bootseer_cli.gcpause import collector_paused


def test_nothing_is_collected_inside_and_the_collector_runs_again_after() -> None:
    runs: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(count)
    try:
        assert gc.isenabled()
        with collector_paused():
            runs.clear()  # (one may have run on the way in)
            kept = [[i] for i in range(50_000)]  # ~70 automatic collections, were the collector on
            assert not gc.isenabled()
            assert runs == []
        assert gc.isenabled()
        more = [[i] for i in range(5_000)]
        assert runs  # back on: collections happen again
        del kept, more
    finally:
        gc.callbacks.remove(count)


def test_a_failure_inside_or_a_paused_caller_leave_the_collector_as_it_was() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a restore that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()
