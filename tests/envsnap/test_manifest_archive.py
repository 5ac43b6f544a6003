"""Manifest diffs and the archive round trip on real trees: files, symlinks, hardlinks, modes, mtimes, deletions."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bootseer_cli.envsnap import extract, format, manifest, reader
from bootseer_cli.errors import IntegrityError
from tests.envsnap.conftest import tree_state


def make_base(root: Path) -> None:
    (root / "lib" / "old_pkg" / "sub").mkdir(parents=True)
    (root / "lib" / "old_pkg" / "__init__.py").write_text("old = 1\n")
    (root / "lib" / "old_pkg" / "sub" / "m.py").write_text("x = 1\n")
    (root / "lib" / "keep.py").write_text("keep\n")
    (root / "lib" / "becomes_dir").write_text("was a file\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "bin" / "gone").write_text("gone\n")


def setup_changes(root: Path) -> None:
    """What a setup does: add, change, upgrade (delete old), link, chmod, change a kind."""
    shutil.rmtree(root / "lib" / "old_pkg")
    (root / "bin" / "gone").unlink()
    (root / "lib" / "new_pkg" / "data").mkdir(parents=True)
    (root / "lib" / "new_pkg" / "__init__.py").write_text("new = 2\n")
    (root / "lib" / "new_pkg" / "data" / "blob.bin").write_bytes(os.urandom(3 << 20))
    deep = root / "lib" / "new_pkg" / ("d" * 90) / ("e" * 90)
    deep.mkdir(parents=True)
    (deep / ("f" * 120 + ".py")).write_text("long names\n")
    os.link(root / "lib" / "new_pkg" / "__init__.py", root / "lib" / "new_pkg" / "alias.py")
    os.symlink("new_pkg/__init__.py", root / "lib" / "rel_link")
    os.symlink("/usr/bin/env", root / "bin" / "outside_link")  # allowed: a link, never written through
    (root / "bin" / "tool").chmod(0o755)
    (root / "lib" / "becomes_dir").unlink()
    (root / "lib" / "becomes_dir").mkdir()
    (root / "lib" / "becomes_dir" / "inside.txt").write_text("now a dir\n")
    (root / "lib" / "empty_dir").mkdir(mode=0o750)
    os.utime(root / "lib" / "new_pkg" / "__init__.py", (1_600_000_000, 1_600_000_000))


def build_blob(root: Path, base: manifest.Manifest, blob: Path) -> format.Written:
    after = manifest.scan([root])
    d = manifest.diff(base, after)
    links = manifest.hardlink_groups(after, d.changed)
    w = format.ArchiveWriter(blob)
    for p in d.changed:
        w.add(p, after[p], link_to=links.get(p))
    return w.finish({"roots": [str(root)], "deletions": d.deleted})


def test_diff_sees_adds_changes_deletions_links_modes(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    make_base(root)
    base = manifest.scan([root])
    setup_changes(root)
    after = manifest.scan([root])
    d = manifest.diff(base, after)
    r = str(root)
    assert f"{r}/lib/old_pkg" in d.deleted and f"{r}/bin/gone" in d.deleted
    assert not any(p.startswith(f"{r}/lib/old_pkg/") for p in d.deleted), "only the top of a deleted subtree"
    for p in (
        "lib/new_pkg",
        "lib/new_pkg/__init__.py",
        "lib/rel_link",
        "bin/outside_link",
        "bin/tool",
        "lib/becomes_dir",
        "lib/becomes_dir/inside.txt",
        "lib/empty_dir",
    ):
        assert f"{r}/{p}" in d.changed, p
    assert f"{r}/lib/keep.py" not in d.changed and f"{r}/lib" not in d.changed
    assert after[f"{r}/lib/rel_link"].kind == manifest.SYMLINK
    links = manifest.hardlink_groups(after, d.changed)
    assert links == {f"{r}/lib/new_pkg/alias.py": f"{r}/lib/new_pkg/__init__.py"}
    # the baseline file round-trips
    manifest.save(base, tmp_path / "b.manifest", [r])
    loaded, roots, _extra = manifest.load(tmp_path / "b.manifest")
    assert loaded == base and roots == [r]


def test_roundtrip_restores_the_exact_tree(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    make_base(root)
    base = manifest.scan([root])
    setup_changes(root)
    want = tree_state(root)
    want_mtime = os.stat(root / "lib" / "new_pkg" / "__init__.py").st_mtime
    blob = tmp_path / "snap.tar.zst"
    written = build_blob(root, base, blob)
    assert written.files > 5 and written.size == blob.stat().st_size
    # standard tools read it: a plain .tar.zst (the metadata rides in a skippable frame)
    listing = subprocess.run(f"zstd -dc {blob} | tar -t", shell=True, capture_output=True, text=True, check=True)
    assert str(root / "lib" / "new_pkg" / "alias.py").lstrip("/") in listing.stdout

    shutil.rmtree(root)  # "another node": the same base at the same path
    root.mkdir()
    make_base(root)
    meta = reader.read_meta(blob)
    ex = extract.extract(blob, meta, [str(root)], threads=4)
    assert ex.files == written.files
    assert tree_state(root) == want
    a, b = root / "lib" / "new_pkg" / "__init__.py", root / "lib" / "new_pkg" / "alias.py"
    assert os.stat(a).st_ino == os.stat(b).st_ino, "hardlinks stay hardlinks"
    assert os.stat(a).st_mtime == want_mtime
    assert not any(p.name.startswith(manifest.UNDO_PREFIX) for p in root.iterdir())


def test_scan_handles_many_files_quickly(tmp_path: Path) -> None:
    root = tmp_path / "many"
    for i in range(10):
        d = root / f"d{i}"
        d.mkdir(parents=True)
        for j in range(500):
            os.close(os.open(d / f"f{j}", os.O_CREAT | os.O_WRONLY, 0o644))
    import time

    t = time.monotonic()
    m = manifest.scan([root])
    took = time.monotonic() - t
    assert len(m) == 1 + 10 + 10 * 500
    assert took < 5.0, f"scan of 5k entries took {took:.1f} s"


@pytest.mark.parametrize("kind", ["huge"])
def test_big_file_gets_its_own_frames(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "env"
    root.mkdir()
    base = manifest.scan([root])
    data = os.urandom(1 << 20) * 24  # 24 MiB, above the frame size: compressed by zstd's own threads
    (root / "big.bin").write_bytes(data)
    (root / "small.txt").write_text("s")
    blob = tmp_path / "b.tar.zst"
    build_blob(root, base, blob)
    meta = reader.read_meta(blob)
    assert len(meta.frames) >= 2
    shutil.rmtree(root)
    root.mkdir()
    extract.extract(blob, meta, [str(root)])
    assert (root / "big.bin").read_bytes() == data
    assert (root / "small.txt").read_text() == "s"


def test_a_root_the_setup_created_is_restored(tmp_path: Path) -> None:
    """An extra root that did not exist before the setup (a compile cache) comes back, parents and all."""
    env, cache = tmp_path / "env", tmp_path / "home" / ".triton" / "cache"
    env.mkdir()
    roots = [str(env), str(cache)]
    base = manifest.scan(roots)
    (env / "a.py").write_text("a\n")
    (cache / "kernels").mkdir(parents=True)
    (cache / "kernels" / "k.so").write_bytes(b"\x7fELF")
    after = manifest.scan(roots)
    d = manifest.diff(base, after)
    assert str(cache) in d.changed
    blob = tmp_path / "b.tar.zst"
    w = format.ArchiveWriter(blob)
    for p in d.changed:
        w.add(p, after[p])
    w.finish({"roots": roots, "deletions": d.deleted})
    want = tree_state(tmp_path, skip=(str(blob),))
    shutil.rmtree(tmp_path / "home")
    (env / "a.py").unlink()
    extract.extract(blob, reader.read_meta(blob), roots)
    assert tree_state(tmp_path, skip=(str(blob),)) == want


def test_the_first_root_the_setup_created_is_restored(tmp_path: Path) -> None:
    """A fresh container has no /opt/venv until the restore makes it: the journal (beside the stamp, in
    the first root) must not need the root to exist first (it did: every fresh container ran the setup)."""
    venv = tmp_path / "opt" / "venv"
    roots = [str(venv)]
    base = manifest.scan(roots)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "tool").write_text("#!/bin/sh\n")
    after = manifest.scan(roots)
    d = manifest.diff(base, after)
    blob = tmp_path / "b.tar.zst"
    w = format.ArchiveWriter(blob)
    for p in d.changed:
        w.add(p, after[p])
    w.finish({"roots": roots, "deletions": d.deleted})
    want = tree_state(tmp_path, skip=(str(blob),))
    shutil.rmtree(venv)
    extract.extract(blob, reader.read_meta(blob), roots)
    assert tree_state(tmp_path, skip=(str(blob),)) == want


def test_a_bad_frame_in_a_parallel_restore_undoes_every_worker(tmp_path: Path) -> None:
    """Many frames, extracted by several workers; one frame is broken: all the others' files go away again."""
    root = tmp_path / "env"
    make_base(root)
    base = manifest.scan([root])
    for i in range(6):
        d = root / "lib" / f"pkg{i}"
        d.mkdir()
        for j in range(40):
            (d / f"m{j}.py").write_bytes(os.urandom(40_000))
    blob = tmp_path / "snap.tar.zst"
    build_blob(root, base, blob)
    meta = reader.read_meta(blob)
    assert len(meta.frames) >= 3
    shutil.rmtree(root)
    make_base(root)
    before = tree_state(root)
    data = bytearray(blob.read_bytes())
    off = meta.frames[len(meta.frames) // 2].offset
    data[off : off + 4] = b"\0\0\0\0"  # that frame's magic: it no longer decompresses
    blob.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="put back"):
        extract.extract(blob, meta, [str(root)], threads=4)
    assert tree_state(root) == before


def _refuse_kernel_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel or filesystem without `copy_file_range` between these files: the plain copy runs."""

    def refuse(*_a: object, **_k: object) -> int:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_segments_appended_make_one_blob_with_its_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool
) -> None:
    """The capture's segments (written apart, appended by copy_file_range, or by a plain copy where the
    kernel refuses it) make one blob whose digest is its bytes' sha256 and which restores the tree."""
    import hashlib

    if not kernel_copy:
        _refuse_kernel_copy(monkeypatch)
    root = tmp_path / "env"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for i in range(40):
        (root / ("a" if i < 20 else "b") / f"m{i}.py").write_bytes(os.urandom(9000))
    after = manifest.scan([root])
    paths = sorted(after)
    want = tree_state(root)
    blob = tmp_path / "snap.tar.zst"
    w = format.ArchiveWriter(blob)
    for k, seg in enumerate((paths[: len(paths) // 2], paths[len(paths) // 2 :])):
        part = tmp_path / f"part{k}"
        sw = format.ArchiveWriter(part, threads=1, segment=True)
        for p in seg:
            sw.add(p, after[p])
        w.append_segment(part, *sw.end_segment())
        part.unlink()  # as the capture does, right after handing it over
    written = w.finish({"roots": [str(root)], "deletions": []})
    assert written.digest == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert written.size == blob.stat().st_size
    shutil.rmtree(root)
    extract.extract(blob, reader.read_meta(blob), [str(root)])
    assert tree_state(root) == want


def test_a_few_mib_file_is_spread_over_every_compression_thread(tmp_path: Path) -> None:
    """zstd's own job size (8 MiB at level 3) gave a 6 MiB library to one thread of sixteen, so a tree of
    CUDA's 2-30 MiB libraries captured at about one core (2.1x tar's time on a 16-core node). Its jobs
    are now a sixteenth of it (1 MiB at least); a file large enough to fill every thread keeps zstd's
    own size. Either way the file comes back whole."""
    root = tmp_path / "env"
    root.mkdir()
    base = manifest.scan([root])
    few = os.urandom(1 << 20) * 6  # 6 MiB: above half a frame, so a large file with frames of its own
    many = os.urandom(1 << 20) * 3 * 48  # 144 MiB: 9 MiB a thread, more than zstd's own job
    (root / "few.so").write_bytes(few)
    (root / "many.so").write_bytes(many)
    after = manifest.scan([root])
    d = manifest.diff(base, after)
    blob = tmp_path / "b.tar.zst"
    w = format.ArchiveWriter(blob, threads=16)
    for p in d.changed:  # the large files now, not deferred to the end: their compressors are seen
        if after[p].kind == manifest.FILE:
            w.add_now(p)
        else:
            w.add(p, after[p])
    assert sorted(w._big_cctx) == [0, format.BIG_JOB_MIN]  # many.so: zstd's own; few.so: 1 MiB jobs
    w.finish({"roots": [str(root)], "deletions": d.deleted})
    assert w._big_cctx == {}  # the compressors (and their zstd threads) end with the writer
    shutil.rmtree(root)
    root.mkdir()
    extract.extract(blob, reader.read_meta(blob), [str(root)])
    assert (root / "few.so").read_bytes() == few
    assert (root / "many.so").read_bytes() == many


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_a_segment_appended_report_by_report_makes_the_same_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool
) -> None:
    """A large-file writer's reports (`report`, then `end_segment`) go in as byte ranges of its part
    that start anywhere (not on a page), with another segment between them: the blob's digest is its
    bytes' sha256, its frames are where they now lie, and it restores the tree."""
    import hashlib

    if not kernel_copy:
        _refuse_kernel_copy(monkeypatch)
    root = tmp_path / "env"
    (root / "big").mkdir(parents=True)
    (root / "small").mkdir()
    for i in range(3):
        (root / "big" / f"lib{i}.so").write_bytes(os.urandom(format.CHUNK_BYTES // 2 + 777 * (i + 1)))
    for i in range(20):
        (root / "small" / f"m{i}.py").write_bytes(os.urandom(900 + i))
    after = manifest.scan([root])
    want = tree_state(root)
    big = sorted(p for p in after if p.endswith(".so"))
    small = sorted(p for p in after if p not in big)
    blob = tmp_path / "snap.tar.zst"
    w = format.ArchiveWriter(blob)
    bw = format.ArchiveWriter(tmp_path / "partbig", threads=2, segment=True)
    sw = format.ArchiveWriter(tmp_path / "part0", threads=1, segment=True)
    for p in small:
        sw.add(p, after[p])
    bw.add_now(big[0])
    first = bw.report()
    assert first[0]["start"] == 0 and first[0]["end"] % 4096 != 0
    w.append_segment(tmp_path / "partbig", *first)
    w.append_segment(tmp_path / "part0", *sw.end_segment())  # between the two ranges
    bw.add_now(big[1])
    bw.add_now(big[2])
    assert bw.unreported() > 0
    second = bw.report()
    assert second[0]["start"] == first[0]["end"]
    w.append_segment(tmp_path / "partbig", *second)
    w.append_segment(tmp_path / "partbig", *bw.end_segment())  # nothing new: an empty range
    written = w.finish({"roots": [str(root)], "deletions": []})
    assert written.digest == hashlib.sha256(blob.read_bytes()).hexdigest()
    meta = reader.read_meta(blob)
    assert sorted(e.path for e in meta.entries) == sorted(after)
    shutil.rmtree(root)
    extract.extract(blob, meta, [str(root)])
    assert tree_state(root) == want
