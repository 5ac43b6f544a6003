"""The pages of mapped files, from the job's page tables (mapped.py), on a tree that drops pages at open.

Through `rclone mount --vfs-cache-mode off` the kernel drops a file's pages at every open, so mincore
at ready sees nothing and the record held every opened file whole: a library the program maps and
touches a little of (`import torch`: 483 MB recorded whole for 91 MB read) was recorded, and replayed,
whole. The record now takes a mapped file's pages from the page tables of the processes bootseer
started, and only theirs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.hotblocks import probe
from bootseer_cli.hotblocks.mapped import MappedPages, Sampler
from bootseer_cli.hotblocks.pagecache import PAGE_SIZE, FileInfo
from bootseer_cli.hotblocks.record import from_deps, ref_extras, scan
from tests.support.delayproxy import DelayProxy
from tests.support.rclonemount import RcloneMount, upload
from tests.support.s3server import delayed

from .conftest import bootseer, wait_for, write_config

MiB = 1 << 20
LIB_MB = 8
TOUCH_AT, TOUCH_LEN = 4 * MiB, 64 << 10  # what the program reads of the library, through its mapping

# Reads three small files, maps the library and touches 64 KiB of it at 4 MiB (as a loader's page
# faults would), calls ready and goes on running (a training loop), the mapping still there.
PROG = f"""
import mmap, os, sys, time, bootseer_cli
root = sys.argv[1]
for i in range(3):
    with open(os.path.join(root, "pkg", f"m{{i}}.py"), "rb") as f:
        f.read()
with open(os.path.join(root, "lib.so"), "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
total = sum(m[o] for o in range({TOUCH_AT}, {TOUCH_AT + TOUCH_LEN}, 4096))
bootseer_cli.ready()
time.sleep(1.5)
"""


def _tree(base: Path) -> Path:
    tree = base / "tree"
    (tree / "pkg").mkdir(parents=True)
    for i in range(3):
        (tree / "pkg" / f"m{i}.py").write_bytes(os.urandom(10_000))
    (tree / "lib.so").write_bytes(os.urandom(LIB_MB * MiB))
    return tree


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, DelayProxy]]:
    base = tmp_path_factory.mktemp("mapped")
    tree = _tree(base)
    with delayed(base / "s3") as (_, proxy):
        upload(tree, proxy.endpoint, "bootseer/tree")
        yield "bootseer/tree", proxy


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("rclone") is None, reason="needs root, FUSE and rclone")
@pytest.mark.parametrize("verb", ["exec", "hot record"])
def test_a_mapped_library_on_a_tree_that_drops_pages_is_recorded_by_the_pages_its_program_touched(
    bucket: tuple[str, DelayProxy], tmp_path: Path, verb: str
) -> None:
    remote, proxy = bucket
    probe.forget()
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    with RcloneMount(proxy.endpoint, remote, tmp_path / "mnt", "off", tmp_path) as m:
        assert probe.probe_root(str(m.mountpoint)).drops
        cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint], ready="call")
        r = bootseer(*verb.split(), "-c", str(cfg), "--", sys.executable, str(prog), str(m.mountpoint), cwd=tmp_path)
        assert r.returncode == 0 and ("recording this start" in r.stderr or "recorded 4 files" in r.stderr), r.stderr
        wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
        shown = _show(cfg, tmp_path)
    assert shown["method"] == "opened-files" and shown["files"] == 4
    by_name = {Path(f["path"]).name: f["bytes"] for f in shown["top_files"]}
    assert by_name["m0.py"] == 10_000  # read with read(): whole, as before
    lib = by_name["lib.so"]
    # the touched 64 KiB, the header page, the kernel's readahead and fault-around: not the 8 MiB file
    assert TOUCH_LEN <= lib <= 2 * MiB, f"lib.so recorded with {lib} bytes of {LIB_MB * MiB}"


def _show(cfg: Path, cwd: Path) -> dict:
    return json.loads(bootseer("hot", "show", "--json", "-c", str(cfg), cwd=cwd).stdout)


MAPPER = """
import mmap, sys, time
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
for o in range(int(sys.argv[2]), int(sys.argv[3]), 4096):
    m[o]
print("ready", flush=True)
time.sleep(30)
"""


def _mapper(path: Path, start: int, end: int) -> subprocess.Popen[str]:
    """A process mapping `path` with the pages of [start, end) touched, once it has said "ready"."""
    p = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(path), str(start), str(end)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_only_the_launchers_tree_is_read_and_only_files_under_the_roots(tmp_path: Path) -> None:
    root, other = tmp_path / "root", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    lib, theirs, outside = root / "lib.so", root / "theirs.so", other / "x.so"
    for f in (lib, theirs, outside):
        f.write_bytes(os.urandom(2 * MiB))
    # the job: a shell (the launcher) whose children map the library and a file outside the roots
    job = subprocess.Popen(
        [
            "sh",
            "-c",
            f'{sys.executable} -c "$0" {lib} 1048576 1114112 & {sys.executable} -c "$0" {outside} 0 8192 & wait',
            MAPPER,
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stranger = _mapper(theirs, 0, MiB)  # a file under the roots too, mapped by a process bootseer did not start
    try:
        assert job.stdout is not None
        said = ""
        while said.count("ready") < 2 and (c := job.stdout.read(1)):  # both of the job's mappers
            said += c
        pages = MappedPages(job.pid, [str(root)])
        pages.sample()
        pages.close()
        runs = pages.runs()
        assert set(runs) == {str(lib)}  # neither the stranger's file nor the one outside the roots
        seen = {p for first, n in runs[str(lib)] for p in range(first, first + n)}
        assert set(range(MiB // PAGE_SIZE, (MiB + (64 << 10)) // PAGE_SIZE)) <= seen  # the pages it touched
        job.kill()  # the launcher has exited: its pid may be another process's from now on, so nothing is read
        os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOWAIT)
        gone = MappedPages(job.pid, [str(root)])
        gone.sample()
        gone.close()
        assert gone.runs() == {} and gone.samples == 0
    finally:
        stranger.kill()
        stranger.wait()
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def test_a_short_program_is_sampled_while_it_runs_and_the_record_keeps_its_pages(tmp_path: Path) -> None:
    """A program whose whole run is its start has no page tables at ready (its exit): the sampler's
    periodic samples hold its pages, and `scan` records those (and the header page) instead of the file."""
    root = tmp_path / "root"
    root.mkdir()
    lib = root / "lib.so"
    lib.write_bytes(os.urandom(16 * MiB))
    p = _mapper(lib, 8 * MiB, 8 * MiB + 32768)
    sampler = Sampler(MappedPages(p.pid, [str(root)]), period=0.05).start()
    time.sleep(0.3)
    p.kill()
    p.wait()
    runs = sampler.finish()
    assert runs is not None and str(lib) in runs
    st = lib.stat()
    rec = scan(
        "k", [str(root)], [FileInfo(str(lib), st.st_size, st.st_mtime_ns, 0)], whole=lambda _p: True, mapped=runs
    )
    assert rec.method == "opened-files"
    offsets = [(o, n) for _, o, n in rec.extents]
    assert offsets[0][0] == 0  # the header page
    assert any(o <= 8 * MiB and o + n >= 8 * MiB + 32768 for o, n in offsets)
    # the pages and what the kernel mapped with them (a large folio: 2 MiB), not the 16 MiB file
    assert rec.total_bytes <= 4 * MiB
    # the ref carries those extents, so a start rebuilds the record without the blob and pyarrow
    again = from_deps({"method": rec.method, "roots": rec.roots, **ref_extras(rec)}, "k", [str(root)])
    assert again is not None and again.extents == rec.extents and again.files == rec.files
    # without page tables the same file is recorded whole, as before
    info = FileInfo(str(lib), st.st_size, st.st_mtime_ns, 0)
    assert scan("k", [str(root)], [info], whole=lambda _p: True).total_bytes == 16 * MiB


def test_a_huge_mapping_costs_bounded_memory_and_pages_past_the_cap_are_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job can map a huge sparse file under the roots: root's reader goes through its page table
    in windows and records at most MAX_FILE_PAGES pages of a file (here scaled down to 1,024)."""
    from bootseer_cli.hotblocks import mapped

    monkeypatch.setattr(mapped, "MAX_FILE_PAGES", 1024)
    monkeypatch.setattr(mapped, "WINDOW_PAGES", 256)
    root = tmp_path / "root"
    root.mkdir()
    huge = root / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(64 * MiB)  # sparse
    job = _mapper(huge, 0, 16 * MiB)  # touches 4,096 pages: 1,024 of them may be recorded
    try:
        pages = MappedPages(job.pid, [str(root)])
        pages.sample()
        pages.close()
        seen = {p for first, n in pages.runs()[str(huge)] for p in range(first, first + n)}
        assert seen == set(range(1024))
        assert len(pages.pages[str(huge)]) == 1024
    finally:
        job.kill()
        job.wait()
