"""The page-cache instrument: eviction, mincore runs, coalescing, the file walk."""

from __future__ import annotations

import os
from pathlib import Path

from bootseer_cli.hotblocks.pagecache import PAGE_SIZE, evict, resident_runs, runs_from_vector, walk_files
from bootseer_cli.hotblocks.record import coalesce

from .conftest import MiB, pages, resident_set


def test_runs_from_vector_reads_low_bits_only() -> None:
    assert runs_from_vector(bytes([1, 1, 0, 3, 2, 0, 1])) == [(0, 2), (3, 1), (6, 1)]
    assert runs_from_vector(b"") == []
    assert runs_from_vector(bytes([0, 0])) == []


def test_coalesce_merges_small_gaps_and_clips_to_the_file() -> None:
    page = 4096
    # runs 0-1 and 3 are 4 KiB apart (merged), run 100 is far (kept apart); the last page is partial
    assert coalesce([(0, 2), (3, 1), (100, 1)], page, 100 * page + 10, gap=8192) == [
        (0, 4 * page),
        (100 * page, 10),
    ]
    assert coalesce([(0, 2), (3, 1)], page, 10 * page, gap=0) == [(0, 2 * page), (3 * page, page)]


def test_evict_then_read_shows_exactly_the_read_pages(tree: Path) -> None:
    f = tree / "f2.bin"
    evict([str(f)])
    assert resident_runs(str(f)) == []
    fd = os.open(f, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: only the page we read
        os.pread(fd, 100, MiB + 10)
    finally:
        os.close(fd)
    assert resident_set(f) == pages(MiB, 1)
    evict([str(f)])
    assert resident_set(f) == set()


def test_walk_files_sees_each_file_once_and_skips_symlinks(tree: Path, tmp_path: Path) -> None:
    (tree / "sub").mkdir()
    (tree / "sub" / "g.bin").write_bytes(b"x" * PAGE_SIZE)
    (tree / "link.bin").symlink_to(tree / "f1.bin")
    alias = tmp_path / "alias"
    alias.symlink_to(tree)
    found = sorted(Path(f.path).name for f in walk_files([tree, alias, tree / "f1.bin"]))
    assert found == ["f1.bin", "f2.bin", "f3.bin", "g.bin"]


def test_evict_and_scan_many_files_on_the_thread_pool(tmp_path: Path) -> None:
    from bootseer_cli.hotblocks.record import scan

    root = tmp_path / "many"
    root.mkdir()
    for i in range(300):  # over the threshold where evict and scan use threads
        (root / f"m{i:03}.bin").write_bytes(os.urandom(2 * PAGE_SIZE))
    files = list(walk_files([root]))
    assert evict(files) == 300
    for i in range(0, 300, 7):
        (root / f"m{i:03}.bin").read_bytes()
    rec = scan("k", [str(root)], files)
    assert sorted(Path(p).name for p in rec.files) == [f"m{i:03}.bin" for i in range(0, 300, 7)]
    assert rec.roots_files == 300 and rec.total_bytes == len(rec.files) * 2 * PAGE_SIZE
