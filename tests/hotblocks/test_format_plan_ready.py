"""Pure parts: the record format and its validation, the ready modes, the replay's plan and cap."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.errors import ConfigError, IntegrityError
from bootseer_cli.hotblocks.ready import parse_mode, tree_activity, wait_ready
from bootseer_cli.hotblocks.record import Record, from_parquet, to_parquet
from bootseer_cli.hotblocks.replay import READ_MAX, plan, run


def _record(tmp_path: Path) -> tuple[Record, Path]:
    f = tmp_path / "a.bin"
    f.write_bytes(os.urandom(3 * READ_MAX))
    st = f.stat()
    rec = Record(image_key="k", roots=[str(tmp_path)], files={str(f): (st.st_size, st.st_mtime_ns)})
    rec.extents = [(str(f), 4096, 2 * READ_MAX)]
    return rec, f


def test_parquet_round_trip(tmp_path: Path) -> None:
    rec, _ = _record(tmp_path)
    back = from_parquet(to_parquet(rec))
    assert back.extents == rec.extents and back.files == rec.files and back.roots == rec.roots


@pytest.mark.parametrize(
    "extent",
    [("relative/path", 0, 10), ("/not/listed", 0, 10), ("LISTED", -1, 10), ("LISTED", 0, 0)],
)
def test_untrusted_records_are_rejected(tmp_path: Path, extent: tuple[str, int, int]) -> None:
    rec, f = _record(tmp_path)
    rec.extents = [(str(f) if extent[0] == "LISTED" else extent[0], extent[1], extent[2])]
    with pytest.raises(IntegrityError):
        from_parquet(to_parquet(rec))
    with pytest.raises(IntegrityError):
        from_parquet(b"not parquet at all")


def test_plan_cuts_reads_at_aligned_boundaries_and_drops_stale_files(tmp_path: Path) -> None:
    rec, f = _record(tmp_path)
    work, staleness = plan(rec)
    assert work == [(str(f), 4096, READ_MAX - 4096), (str(f), READ_MAX, READ_MAX), (str(f), 2 * READ_MAX, 4096)]
    assert staleness.stale_files == []
    os.utime(f, ns=(1, 1))
    work, staleness = plan(rec)
    assert work == [] and staleness.stale_files == [str(f)] and staleness.stale_share == 1.0


def test_bandwidth_cap_and_deadline(tmp_path: Path) -> None:
    rec, _ = _record(tmp_path)
    work, _ = plan(rec)
    t0 = time.monotonic()
    res = run(work, threads=4, mbps=10.0)  # ~2 MiB at 10 MB/s: about 0.2 s
    assert res.bytes_read == 2 * READ_MAX and time.monotonic() - t0 >= 0.15
    res = run(work, threads=4, deadline=time.monotonic() - 1)
    assert res.bytes_read == 0 and res.remaining == work


def test_parse_mode() -> None:
    assert parse_mode("call") == "call" and parse_mode("Quiet") == "quiet"
    assert parse_mode(30) == 30.0 and parse_mode("2.5") == 2.5
    with pytest.raises(ConfigError):
        parse_mode("soon")
    with pytest.raises(ConfigError):
        parse_mode(-1)


def test_wait_ready_modes(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    nap = lambda s: bool(time.sleep(min(s, 0.05)))  # noqa: E731
    assert wait_ready(0.1, os.getpid(), ready, lambda: True, nap) == "timer"
    ready.touch()
    assert wait_ready("call", os.getpid(), ready, lambda: True, nap) == "ready"
    assert wait_ready("call", os.getpid(), tmp_path / "never", lambda: False, nap) == "exit"


def test_tree_rss_counts_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "x = bytearray(64 << 20); import time; time.sleep(30)"])
    try:
        time.sleep(1.0)
        assert tree_activity(os.getpid())[0] >= tree_activity(child.pid)[0] >= 64 << 20
    finally:
        child.kill()
        child.wait()
