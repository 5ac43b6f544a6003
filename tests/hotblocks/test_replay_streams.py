"""The replay's streams: a large file is read as several forward streams, and how many streams run at
once follows what the backend delivers (grows on a latency-bound loader, settles on a capped one)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bootseer_cli.hotblocks import replay
from tests.support.lazyfs import LazyMount

from .conftest import MiB

needs_fuse = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for FUSE")


def _whole(paths: list[Path]) -> list[replay.Extent]:
    return [(str(p), 0, p.stat().st_size) for p in paths]


def _plan(work: list[replay.Extent]) -> list[replay.Extent]:
    """Aligned pieces, as `replay.plan` cuts a record."""
    out: list[replay.Extent] = []
    for path, off, n in work:
        while n > 0:
            step = min(n, replay.READ_MAX - off % replay.READ_MAX)
            out.append((path, off, step))
            off, n = off + step, n - step
    return out


def test_segments_cut_a_large_file_into_contiguous_runs_and_keep_a_short_tail_with_the_run_before() -> None:
    pieces = [("f", i * MiB, MiB) for i in range(21)]  # 21 MiB: runs of 8, 8 and a 5 MiB tail
    segs = replay._segments(pieces)
    assert [len(s) for s in segs] == [8, 8, 5]
    assert [e for s in segs for e in s] == pieces  # nothing lost, nothing reordered
    assert [len(s) for s in replay._segments(pieces[:19])] == [8, 11]  # a 3 MiB tail joins the run before
    assert [len(s) for s in replay._segments(pieces[:7])] == [7]  # a small file: one stream


@needs_fuse
def test_a_large_file_is_fetched_as_several_forward_streams_at_once(tmp_path: Path) -> None:
    """40 chunks of one file at 40 ms each: one stream would take 1.6 s; five segments read at once each
    fetch their own chunks front to back, and the segments' fetches interleave."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.so").write_bytes(os.urandom(40 * MiB))
    with LazyMount(src, tmp_path / "lazy", delay_ms=40) as lazy:
        res = replay.run(_plan(_whole([lazy.mountpoint / "lib.so"])), threads=16)
        fetched = [chunk for path, chunk in lazy.fetches() if path == "/lib.so"]
    assert res.bytes_read == 40 * MiB and res.files == 1 and res.errors == 0
    assert sorted(fetched) == list(range(40))  # every chunk once
    by_segment: dict[int, list[int]] = {}
    for chunk in fetched:
        by_segment.setdefault(chunk // 8, []).append(chunk)
    assert len(by_segment) == 5
    for seg, order in by_segment.items():
        assert order == sorted(order), f"segment {seg} was not read front to back: {order}"
    assert len({chunk // 8 for chunk in fetched[:10]}) >= 3, f"the segments did not run at once: {fetched}"


@needs_fuse
def test_on_a_latency_bound_loader_the_streams_grow_to_every_thread(tmp_path: Path) -> None:
    """Each file costs a 30 ms round trip whatever its size: doubling the streams doubles the rate, so
    the gate keeps doubling (to every thread it was given, unless the loader itself runs out of CPU)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(1500):
        (src / f"m{i:04d}.pyc").write_bytes(os.urandom(6000))
    with LazyMount(src, tmp_path / "lazy", delay_ms=30) as lazy:
        files = sorted(lazy.mountpoint.iterdir())
        res = replay.run(_whole(files), threads=64)
    assert res.files == 1500 and res.errors == 0
    start = replay.START_STREAMS
    assert res.streams[:2] == [start, 2 * start] and max(res.streams) >= 32, res.streams


@needs_fuse
def test_a_replay_that_holds_the_program_back_runs_every_stream_at_once(tmp_path: Path) -> None:
    """The stage's replay runs before exec: nothing else wants the link, and every window the gate spends
    finding its width is the start's. Issue 28: beside the stage's own stats (a HEAD per file on rclone)
    the gate judged a latency-bound rclone "full" by their load, settled at 16 of 64 streams, and 402
    small files took 0.9 s. Before the fix `run` had no such mode (the stage started at 16)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(400):
        (src / f"m{i:03d}.pyc").write_bytes(os.urandom(6000))
    with LazyMount(src, tmp_path / "lazy", delay_ms=30) as lazy:
        files = sorted(lazy.mountpoint.iterdir())
        res = replay.run(_whole(files), threads=64, wide=True)
    assert res.files == 400 and res.errors == 0 and res.bytes_read == 400 * 6000
    assert res.streams == [64], res.streams


def test_on_a_bandwidth_bound_backend_the_streams_settle_where_a_doubling_stops_paying(tmp_path: Path) -> None:
    """The replay's own cap (a shared 40 MB/s) is the backend's link here: twice the streams bring no
    more bytes per second, so the gate undoes its first doubling and stays at the start."""
    files = []
    for i in range(80):
        p = tmp_path / f"f{i:02d}.bin"
        p.write_bytes(os.urandom(512 * 1024))
        files.append(p)
    t0 = time.monotonic()
    res = replay.run(_plan(_whole(files)), threads=64, mbps=40.0)
    assert res.bytes_read == 80 * 512 * 1024
    assert time.monotonic() - t0 >= 0.9  # the cap held: 42 MB at 40 MB/s
    assert res.streams == [replay.START_STREAMS, 2 * replay.START_STREAMS, replay.START_STREAMS], res.streams


def _first_read(work: list[replay.Extent], **kw: bool) -> str:
    """The one file a single-stream replay starts on before it is stopped: `stop()` says stop from its
    second call on (the first is the pool's first `take`; the rest of a long file is left unread)."""
    calls: list[int] = []
    res = replay.run(work, threads=1, stop=lambda: bool(calls.append(1)) or len(calls) > 1, **kw)
    assert res.files == 1 and res.errors == 0
    (read,) = {e[0] for e in work if e[1] == 0} - {e[0] for e in res.remaining if e[1] == 0}
    return read


def test_a_replay_into_a_loaders_cache_that_holds_the_program_back_reads_the_longest_streams_first(
    tmp_path: Path,
) -> None:
    """What counts before exec is when the last stream ends. Issue 28: in record order `import torch`'s two
    libraries (62 MB in 7 streams) started after its 754 small files, 1.3-3.0 s into the replay. Behind
    the program, or into the page cache, the record's order stays (the order the program asks)."""
    files = []
    for i, size in enumerate([4000, 9000, 3 * MiB, 5000]):
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(size))
        files.append(path)
    work = _plan(_whole(files))
    assert _first_read(work, wide=True, into_loader=True) == str(files[2])
    assert _first_read(work, wide=True) == str(files[0])
    assert _first_read(work, into_loader=True) == str(files[0])
