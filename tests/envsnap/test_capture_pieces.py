"""Issue 28 item 2: the small files' writers take contiguous pieces from a queue, so a writer that is
done early takes the next piece and the writers end together; the pieces still go into the blob in
their order, and a writer that dies fails the capture with one line and leaves no part behind."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bootseer_cli.envsnap import manifest, reader, segments
from bootseer_cli.errors import BootseerError
from tests.envsnap.conftest import tree_state


def _tree(root: Path, n: int = 60) -> None:
    for d in ("a", "b", "c"):
        (root / d).mkdir(parents=True)
        for i in range(n // 3):
            (root / d / f"m{i:02}.py").write_bytes(os.urandom(2000 + i))
    os.link(root / "a" / "m00.py", root / "c" / "z-link.py")  # its target is in an earlier piece


def test_a_writer_done_early_takes_the_next_pieces_and_the_blob_keeps_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "SEGMENT_MIN_ENTRIES", 5)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    log, marker = tmp_path / "pieces.log", tmp_path / "slow-taken"
    writer, child = segments.ArchiveWriter, segments._segment_child

    class Logged(writer):  # type: ignore[misc, valid-type]
        def end_segment(self):  # type: ignore[no-untyped-def]  # runs in the forked writer
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {self.path.name}\n")
            return super().end_segment()

    def one_slow_writer(*a: object) -> None:  # runs in the forked child: the first one sleeps first
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            time.sleep(1.5)
        except FileExistsError:
            pass
        child(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(segments, "ArchiveWriter", Logged)
    monkeypatch.setattr(segments, "_segment_child", one_slow_writer)
    root = tmp_path / "env"
    _tree(root)
    want = tree_state(root)
    after = manifest.scan([root])
    changed = manifest.diff({}, after).changed
    blob = tmp_path / "blob.tar.zst"
    _, entries = segments.write_blob(blob, after, changed, {"roots": [str(root)], "deletions": []}, False)

    assert [e.path for e in entries] == changed  # the pieces in their order, whoever wrote them
    by_writer: dict[str, int] = {}
    for line in log.read_text().splitlines():
        pid = line.split()[0]
        by_writer[pid] = by_writer.get(pid, 0) + 1
    assert sum(by_writer.values()) == 2 * segments.PIECES_PER_WORKER
    # the slow one takes at most one piece after its nap: the other has taken the rest meanwhile
    assert max(by_writer.values()) >= 2 * segments.PIECES_PER_WORKER - 1
    assert list(tmp_path.glob("blob.tar.zst.part*")) == []
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", str(blob), "-C", str(out)], check=True)
    base = out / str(root).lstrip("/")
    assert {k[len(str(base)) :]: v for k, v in tree_state(base).items()} == {
        k[len(str(root)) :]: v for k, v in want.items()
    }
    assert reader.read_meta(blob).entries == tuple(entries)


def test_small_writers_that_die_fail_the_capture_with_one_line_and_leave_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "SEGMENT_MIN_ENTRIES", 5)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(segments, "_segment_child", lambda *a: os._exit(3))
    root = tmp_path / "env"
    _tree(root)
    after = manifest.scan([root])
    changed = manifest.diff({}, after).changed
    with pytest.raises(BootseerError, match="a capture worker died"):
        segments.write_blob(tmp_path / "blob.tar.zst", after, changed, {"roots": [str(root)], "deletions": []}, False)
    assert list(tmp_path.iterdir()) == [tmp_path / "env"]


def test_a_writers_error_is_the_captures_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "SEGMENT_MIN_ENTRIES", 5)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    root = tmp_path / "env"
    _tree(root)
    after = manifest.scan([root])
    changed = manifest.diff({}, after).changed
    (root / "b" / "m05.py").chmod(0)  # unreadable once the writers open it (root reads it anyway)
    if os.access(root / "b" / "m05.py", os.R_OK):
        os.unlink(root / "b" / "m05.py")
        os.mkfifo(root / "b" / "m05.py")  # what the scan saw as a file is a FIFO now: refused
    with pytest.raises(BootseerError, match=r"m05\.py"):
        segments.write_blob(tmp_path / "blob.tar.zst", after, changed, {"roots": [str(root)], "deletions": []}, False)
    assert list(tmp_path.iterdir()) == [tmp_path / "env"]


def test_pieces_weigh_a_small_files_cost_not_only_its_bytes() -> None:
    """A thousand 1 KiB files cost a writer about what 9 MiB of one file does (their opens, reads
    and headers): with a 3 MiB file after them, two pieces of equal work cut the small files at
    about two thirds (counted as a header block each, they were one piece with the large file)."""
    after = {f"/r/s{i:04}": manifest.Entry(manifest.FILE, 0o644, 1024, 0) for i in range(1000)}
    after["/r/z"] = manifest.Entry(manifest.FILE, 0o644, 3 << 20, 0)
    pieces = segments._segments(after, sorted(after), 2)
    assert [len(p) for p in pieces] == [672, 329]
