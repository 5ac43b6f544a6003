"""Issue 26 case 3: an env restore, often as root, into a tree a plain user can write.

The user can swap any directory of the tree for a symlink while the restore runs. A check of the
parents followed by writes and `chmod`/`utime` by path followed the swapped link: a root-owned 0700
directory outside the tree became 0755. The restore must never follow a link it did not write, must
not hand out group/other write or setuid bits from the archive, and the capture must not hang on a
FIFO put where a file was.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from bootseer_cli.envsnap import extract, format, manifest, reader
from bootseer_cli.envsnap.format import CHUNK_BYTES
from bootseer_cli.errors import BootseerError
from tests.envsnap.test_safety import craft, rel

REPO = Path(__file__).resolve().parents[2]


def _outside(tmp_path: Path) -> tuple[Path, tuple]:
    """A root-owned 0700 directory outside the tree, and what must not change about it."""
    out = tmp_path / "secret"
    out.mkdir(mode=0o700)
    (out / "key").write_text("root only\n")
    os.chmod(out / "key", 0o600)
    os.utime(out, (1_500_000_000, 1_500_000_000))
    return out, _state(out)


def _state(d: Path) -> tuple:
    st = os.lstat(d)
    return (stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_ctime_ns, sorted(os.listdir(d)), (d / "key").read_text())


def _captured(root: Path, blob: Path) -> format.Meta:
    """A snapshot of everything under `root` (the root itself aside), then the tree wiped: the frames
    are the small files first, then the big file in a frame of its own."""
    after = manifest.scan([root])
    w = format.ArchiveWriter(blob, threads=1)
    for p in sorted(after):
        if p != str(root):
            w.add(p, after[p])
    w.finish({"roots": [str(root)], "deletions": []})
    for p in sorted(after, reverse=True):
        if p != str(root):
            (os.rmdir if after[p].kind == manifest.DIR else os.unlink)(p)
    meta = reader.read_meta(blob)
    assert len(meta.frames) >= 2
    return meta


@pytest.mark.parametrize("preexisting", [False, True])
def test_a_directory_swapped_for_a_symlink_mid_restore_is_never_followed(tmp_path: Path, preexisting: bool) -> None:
    """pkg5 is written into by the first frame; after it the "user" swaps pkg5 for a symlink to a
    root-owned 0700 directory. The next frame's file and the directory modes at the end must not go
    through it: the outside directory keeps its mode, contents and times, and the restore fails."""
    root = tmp_path / "env"
    pkg = root / "lib" / "pkg5"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "big.bin").write_bytes(os.urandom(CHUNK_BYTES))  # deferred: a frame of its own, last
    pkg.chmod(0o755)
    meta = _captured(root, tmp_path / "blob")
    if preexisting:  # pkg5 already in the tree (the snapshot only sets its mode): moved aside, not made
        pkg.mkdir(mode=0o700, parents=True)
    outside, before = _outside(tmp_path)
    swapped = []

    def swap(_n: int) -> None:
        if not swapped and (pkg / "__init__.py").exists():
            os.rename(pkg, root / "lib" / "pkg5.moved")
            os.symlink(outside, pkg)
            swapped.append(True)

    with pytest.raises(BootseerError):
        extract.extract(tmp_path / "blob", meta, [str(root)], threads=1, progress=swap)
    assert swapped, "the swap happened mid-restore"
    assert _state(outside) == before, "the restore wrote through the swapped symlink"
    assert not (outside / "big.bin").exists()


def test_archive_modes_are_masked_to_0755(tmp_path: Path) -> None:
    """No group/other write and no setuid/setgid/sticky from an archive: 0o777 and 0o4755 come back 0o755."""
    root = tmp_path / "env"
    root.mkdir()
    files = {"world.py": 0o777, "suid": 0o4755, "sgid": 0o2775, "plain.py": 0o644}
    members = []
    entries: list[list] = []
    d = tarfile.TarInfo(f"{rel(root)}/open")
    d.type, d.mode = tarfile.DIRTYPE, 0o1777
    members.append((d, b""))
    entries.append([f"{root}/open", "d", 0o1777, 0, 0, ""])
    for name, mode in files.items():
        ti = tarfile.TarInfo(f"{rel(root)}/open/{name}")
        ti.size, ti.mode = 2, mode
        members.append((ti, b"hi"))
        entries.append([f"{root}/open/{name}", "f", mode, 2, 0, ""])
    meta = craft(tmp_path / "blob", members, entries, [str(root)])
    extract.extract(tmp_path / "blob", meta, [str(root)], threads=1)
    got = {n: stat.S_IMODE(os.lstat(root / "open" / n).st_mode) for n in files}
    assert got == {"world.py": 0o755, "suid": 0o755, "sgid": 0o755, "plain.py": 0o644}
    assert stat.S_IMODE(os.lstat(root / "open").st_mode) == 0o755


CAPTURE_WITH_FIFO = """
import os, sys
from pathlib import Path
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.envsnap import capture, manifest
from bootseer_cli.settings import StoreSettings

root, cache_dir, victim = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
real_scan = manifest.scan

def scan_then_swap(*a, **k):  # the scan sees a file; then the user puts a FIFO in its place
    out = real_scan(*a, **k)
    os.unlink(victim)
    os.mkfifo(victim)
    return out

manifest.scan = scan_then_swap
try:
    capture.capture(StoreSettings(cache_dir=cache_dir), [root], {}, "0" * 64, BlobCache(cache_dir, 1 << 30),
                    warn=lambda m: None)
except Exception as e:
    print("ERROR", e)
    sys.exit(3)
print("CAPTURED")
"""


@pytest.mark.parametrize("victim", ["mod.py", "site.pth"])
def test_capture_of_a_fifo_swapped_in_for_a_file_fails_promptly(tmp_path: Path, victim: str) -> None:
    """A FIFO where the scan saw a file: an error naming it, never a hang (open without O_NONBLOCK
    waits for a writer forever). A .pth is also read by the editable-install check."""
    root = tmp_path / "env"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "other.py").write_text("y = 2\n")
    (root / "lib" / victim).write_text("x = 1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                textwrap.dedent(CAPTURE_WITH_FIFO),
                str(root),
                str(tmp_path / "c"),
                str(root / "lib" / victim),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the capture hung on a FIFO swapped in for a file")
    assert r.returncode == 3, r.stdout + r.stderr
    assert str(root / "lib" / victim) in r.stdout and "regular file" in r.stdout, r.stdout


def test_the_scan_never_descends_into_a_directory_swapped_for_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the parent's listing (pkg is a directory) and the descent into pkg, the user swaps pkg
    for a symlink to a root-only directory: the scan must not list its files as the tree's (the
    capture would then read them into a snapshot others restore)."""
    root = tmp_path / "env"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mine.py").write_text("x = 1\n")
    outside, _ = _outside(tmp_path)
    real_entry = manifest._entry

    def entry_then_swap(st: os.stat_result, path: str, *rest: int | None) -> manifest.Entry:
        e = real_entry(st, path, *rest)
        if os.path.basename(path) == "pkg" and e.kind == manifest.DIR:
            os.rename(root / "pkg", root / "pkg.moved")
            os.symlink(outside, root / "pkg")
        return e

    monkeypatch.setattr(manifest, "_entry", entry_then_swap)
    got = manifest.scan([root])
    assert str(root / "pkg" / "key") not in got, "the scan listed a root-only file through the swapped link"
