"""kept.py's rule: a node's copy of a save is stacked over tag T only if it can show nothing but T."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from bootseer_cli.stripe.kept import PART, WHOLE, hold_for, judge, keep, kept_root
from bootseer_cli.stripe.layout import FileEntry, Manifest


def usable_for(upper: Path, m: Manifest, fuse_markers: bool | None = None) -> bool:
    """Whether stacking the copy over `m`'s stripes shows exactly `m`."""
    return bool(judge(upper, m, fuse_markers))


def _copy(tmp_path: Path) -> tuple[Path, Manifest]:
    """An upper directory as a run left it, and the manifest of the tag it was pushed as."""
    up = tmp_path / "upper"
    (up / "checkpoint-2").mkdir(parents=True)
    (up / "ckpt.pt").write_bytes(b"new")
    (up / "checkpoint-2" / "state.pt").write_bytes(b"state")
    entries = []
    for rel, off in (("checkpoint-2/state.pt", 0), ("ckpt.pt", 5), ("extra.pt", 8)):
        p = up / rel
        size = p.stat().st_size if p.exists() else 4
        entries.append(FileEntry(rel, off, size, "0" * 64, p.stat().st_mtime_ns if p.exists() else 1))
    return up, Manifest("job", "t2", 512, [], entries, [], ["checkpoint-2"])


def test_a_copy_of_the_tag_is_usable(tmp_path: Path) -> None:
    up, m = _copy(tmp_path)
    assert usable_for(up, m)


def test_a_file_changed_since_the_push_is_not(tmp_path: Path) -> None:
    up, m = _copy(tmp_path)
    st = (up / "ckpt.pt").stat()
    os.utime(up / "ckpt.pt", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert not usable_for(up, m)


def test_a_path_the_tag_lacks_or_a_link_is_not(tmp_path: Path) -> None:
    for extra in ("stray.pt", "link"):
        up, m = _copy(tmp_path / extra)
        if extra == "link":
            os.symlink("ckpt.pt", up / "link")
        else:
            (up / extra).write_bytes(b"x")
        assert not usable_for(up, m, fuse_markers=True), extra


def test_fuse_overlayfs_markers_only_under_fuse_overlayfs(tmp_path: Path) -> None:
    """fuse-overlayfs marks the directories it creates opaque with a `.wh..wh..opq` file: its own view
    (a plain user's) reads it as a mark, the kernel's overlay (root's) would show it as a file."""
    up, m = _copy(tmp_path)
    (up / "checkpoint-2" / ".wh..wh..opq").write_bytes(b"")
    (up / ".wh.old.pt").write_bytes(b"")  # a deletion of a path T lacks
    assert usable_for(up, m, fuse_markers=True)
    assert not usable_for(up, m, fuse_markers=False)
    (up / ".wh.extra.pt").write_bytes(b"")  # hides a file T has: not T's view
    assert not usable_for(up, m, fuse_markers=True)


def test_a_whiteout_of_a_path_the_tag_lacks_is_fine(tmp_path: Path) -> None:
    up, m = _copy(tmp_path)
    os.mknod(up / "gone.pt", 0o600 | 0o020000, os.makedev(0, 0))  # the kernel overlay's whiteout (root)
    assert usable_for(up, m)
    os.unlink(up / "gone.pt")
    os.mknod(up / "extra.pt", 0o600 | 0o020000, os.makedev(0, 0))  # hides a file T has: not T's view
    assert not usable_for(up, m)


def test_a_copy_holding_every_file_and_directory_of_the_tag_is_whole(tmp_path: Path) -> None:
    """WHOLE: the copy alone is the tag (the view needs no stripe mount); any file or directory of the
    tag missing, or any whiteout or marker in it, and it is only PART of the view."""
    up, m = _copy(tmp_path)
    assert judge(up, m) == PART  # extra.pt is only in the stripes
    (up / "extra.pt").write_bytes(b"xtra")
    whole = Manifest(m.name, m.tag, 512, [], [*m.files[:2], _entry(up, "extra.pt", 8)], [], m.dirs)
    assert judge(up, whole) == WHOLE
    assert judge(up, Manifest(m.name, m.tag, 512, [], whole.files, [], [*m.dirs, "empty"])) == PART
    os.mknod(up / "gone.pt", 0o600 | 0o020000, os.makedev(0, 0))  # hides a path T lacks: fine, not whole
    assert judge(up, whole) == PART
    os.unlink(up / "gone.pt")
    (up / ".wh.old.pt").write_bytes(b"")
    assert judge(up, whole, fuse_markers=True) == PART


def test_kept_without_the_whiteouts_of_what_the_job_deleted(tmp_path: Path, isolated_cache: Path) -> None:
    """The tag was pushed from the view the copy was the upper layer of: each whiteout or fuse-overlayfs
    marker there names a path the tag lacks, and is dropped, so the copy can be WHOLE."""
    up, m = _copy(tmp_path)
    (up / "extra.pt").write_bytes(b"xtra")
    whole = Manifest(m.name, m.tag, 512, [], [*m.files[:2], _entry(up, "extra.pt", 8)], [], m.dirs)
    os.mknod(up / "old.pt", 0o600 | 0o020000, os.makedev(0, 0))  # the kernel overlay's deletion
    (up / "checkpoint-2" / ".wh..wh..opq").write_bytes(b"")  # fuse-overlayfs's opaque mark
    assert judge(up, whole, fuse_markers=True) == PART
    entry = keep(up, "job", "t2", tmp_path, pushed=whole)
    assert entry is not None and judge(entry / "upper", whole) == WHOLE
    assert sorted(str(p.relative_to(entry / "upper")) for p in (entry / "upper").rglob("*")) == [
        "checkpoint-2",
        "checkpoint-2/state.pt",
        "ckpt.pt",
        "extra.pt",
    ]


def _entry(up: Path, rel: str, off: int) -> FileEntry:
    st = (up / rel).stat()
    return FileEntry(rel, off, st.st_size, "0" * 64, st.st_mtime_ns)


def test_one_copy_per_checkpoint_and_never_one_a_run_holds(tmp_path: Path, isolated_cache: Path) -> None:
    retired = tmp_path / "retired"
    retired.mkdir()
    up, m = _copy(tmp_path / "a")
    first = keep(up, "job", "t2", retired)
    assert first is not None and not up.exists()
    held = hold_for(m)
    assert held is not None and held.upper == first / "upper" and not held.whole
    up2, _ = _copy(tmp_path / "b")
    second = keep(up2, "job", "t3", retired)
    assert sorted(kept_root().iterdir()) == sorted([first, second])  # the held copy stays
    assert hold_for(Manifest("job", "t9", 512, [], [], [], [])) is None  # another tag: no copy
    os.close(held.fd)
    up3, _ = _copy(tmp_path / "c")
    third = keep(up3, "job", "t4", retired)
    assert list(kept_root().iterdir()) == [third]  # both older ones retired, once no run holds them
    assert len(list(retired.iterdir())) == 2
    fd = os.open(third / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nothing holds the newest
    os.close(fd)


def test_cache_info_counts_them_and_prune_to_nothing_removes_the_unheld(tmp_path: Path, isolated_cache: Path) -> None:
    """A job that moved to other nodes leaves its last save here: `cache info` shows it, `cache prune
    --max-size 0` removes it, never a copy a running job stacks under its checkpoint directory."""
    import subprocess
    import sys

    up, m = _copy(tmp_path / "a")
    keep(up, "job", "t2", tmp_path)
    up2, _ = _copy(tmp_path / "b")
    other = keep(up2, "other-job", "t1", tmp_path)
    held = hold_for(m)
    assert held is not None and other is not None

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=60)

    info = cli("cache", "info")
    assert info.returncode == 0 and "kept    2 checkpoint save(s)" in info.stdout, info.stdout + info.stderr
    r = cli("cache", "prune", "--max-size", "0")
    assert r.returncode == 0 and "removed 1 kept checkpoint save(s)" in r.stdout, r.stdout + r.stderr
    assert list(kept_root().iterdir()) == [held.upper.parent]  # the held one stays
    assert not other.exists()
    os.close(held.fd)
