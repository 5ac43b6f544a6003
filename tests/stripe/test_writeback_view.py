"""The write-back's merged view: what a resume from the new tag sees is what the job saw in its directory.

The upper directories are made the way the kernel's overlayfs and fuse-overlayfs make them (a 0/0
character device or a `.wh.NAME` file for a deletion, an xattr or `.wh..wh..opq` for an opaque
directory), and checked against the directory a real overlay shows.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bootseer_cli.stripe.layout import FileEntry, Manifest
from bootseer_cli.stripe.writeback import local_view, overlay_view

ZERO = "0" * 64


def _parent(files: dict[str, int], dirs: list[str]) -> Manifest:
    entries, off = [], 0
    for path, size in sorted(files.items()):
        entries.append(FileEntry(path, off, size, ZERO))
        off += size
    return Manifest("job", "v1", 512, [], entries, [], dirs)


def _shown(view) -> dict[str, object]:  # type: ignore[no-untyped-def]
    files, dirs, _ = view
    return {rel: (o if isinstance(o, FileEntry) else Path(o).read_bytes()) for rel, o, _ in files} | {
        d + "/": None for d in dirs
    }


def test_nothing_written_is_no_change(tmp_path: Path) -> None:
    parent = _parent({"ckpt.pt": 10, "a/b.pt": 5}, ["a"])
    (tmp_path / "up" / "a").mkdir(parents=True)  # a directory copied up for its metadata only
    files, dirs, changed = overlay_view(parent, tmp_path / "up", print)
    assert not changed and [f for f, _, _ in files] == ["a/b.pt", "ckpt.pt"] and dirs == ["a"]


def test_whiteouts_opaque_directories_and_replacements(tmp_path: Path) -> None:
    parent = _parent(
        {"ckpt.pt": 10, "old/1.pt": 1, "old/2.pt": 2, "keep/x.pt": 3, "gone.pt": 4, "f": 1}, ["old", "keep"]
    )
    up = tmp_path / "up"
    (up / "old").mkdir(parents=True)
    (up / "ckpt.pt").write_bytes(b"new")  # replaced
    (up / "old" / "3.pt").write_bytes(b"3")
    (up / "old" / ".wh..wh..opq").write_bytes(b"")  # fuse-overlayfs: the old contents are hidden
    (up / ".wh.gone.pt").write_bytes(b"")  # fuse-overlayfs deletion
    (up / "f").mkdir()  # a file replaced by a directory
    (up / "f" / "g").write_bytes(b"g")
    os.symlink("ckpt.pt", up / "last.ckpt")  # a relative link to a file of the view
    os.symlink("/etc/passwd", up / "escape")  # never followed out of the directory
    said: list[str] = []
    view = overlay_view(parent, up, said.append)
    assert view[2]
    assert _shown(view) == {
        "ckpt.pt": b"new",
        "f/g": b"g",
        "keep/x.pt": parent.files[3],
        "last.ckpt": b"new",
        "old/3.pt": b"3",
        "f/": None,
        "keep/": None,
        "old/": None,
    }
    assert len(said) == 1 and "escape" in said[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="a kernel overlay (root) writes the upper directory")
def test_the_view_matches_what_a_kernel_overlay_shows(tmp_path: Path) -> None:
    """A real overlay over a plain lower directory: delete a file, remove a directory and make it
    again, replace a file; the merged view names exactly the files the overlay shows, with their bytes."""
    lower, up, work, mnt = (tmp_path / n for n in ("lower", "up", "work", "mnt"))
    for d in (up, work, mnt):
        d.mkdir()
    files = {"ckpt.pt": b"one", "d/a": b"a", "d/b": b"b", "e/c": b"c", "gone": b"x"}
    for rel, data in files.items():
        (lower / rel).parent.mkdir(parents=True, exist_ok=True)
        (lower / rel).write_bytes(data)
    opts = f"lowerdir={lower},upperdir={up},workdir={work},redirect_dir=off,metacopy=off,index=off"
    subprocess.run(["mount", "-t", "overlay", "-o", opts, "overlay", str(mnt)], check=True)
    try:
        (mnt / "gone").unlink()
        subprocess.run(["rm", "-r", str(mnt / "d")], check=True)
        (mnt / "d").mkdir()
        (mnt / "d" / "z").write_bytes(b"z")
        (mnt / "ckpt.pt").write_bytes(b"two")
        seen = {str(p.relative_to(mnt)): p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    parent = _parent({k: len(v) for k, v in files.items()}, ["d", "e"])
    got = {
        rel: (lower / rel).read_bytes() if isinstance(o, FileEntry) else Path(o).read_bytes()
        for rel, o, _ in overlay_view(parent, up, print)[0]
    }
    assert got == seen == {"ckpt.pt": b"two", "d/z": b"z", "e/c": b"c"}


def test_local_view_keeps_links_inside(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "last-10.ckpt").write_bytes(b"w")
    os.symlink("c/last-10.ckpt", tmp_path / "last.ckpt")
    files, dirs = local_view(tmp_path, print)
    assert [(rel, Path(o).read_bytes()) for rel, o, _ in files] == [("c/last-10.ckpt", b"w"), ("last.ckpt", b"w")]
    assert dirs == ["c"]
