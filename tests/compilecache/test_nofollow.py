"""Issue 26, case 2: the compile publish and restore never follow what the training user put in its cache.

The compile caches may be directories a plain user owns (its TORCHINDUCTOR_CACHE_DIR), while the
agent that publishes them and the stage that restores them run as root. A real plain user
(`bsuser`, made here with `useradd` when missing) owns the trees; the attacks are the ones the issue
reports: a file swapped for a link to a root-only file between the walk and the read (it was
uploaded), a `fxgraph -> elsewhere` link at restore (root wrote through it), a directory of another
uid inside the tree and a cache root of another user (both were accepted).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.compilecache import publish as publish_mod
from bootseer_cli.compilecache.index import Entry, read_index, write_index
from bootseer_cli.compilecache.publish import publish
from bootseer_cli.compilecache.restore import restore
from bootseer_cli.compilecache.tree import Baseline, make_dirs
from bootseer_cli.store.core import Store, open_store

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (useradd, files of two owners)")

USER = "bsuser"
KEY = "c" * 64
SECRET = b"root-only: the key of the cluster\n"
NOBODY = 65534


@pytest.fixture(scope="module")
def user() -> pwd.struct_passwd:
    """A plain local user. Kept once made: other tests of the suite may use the same account (it has
    no home and no login shell)."""
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
        return pwd.getpwnam(USER)


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """A directory both root and the plain user can reach (tmp_path is root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="bootseer-nofollow-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _users_tree(base: Path, user: pwd.struct_passwd) -> Path:
    root = base / "user-cache" / "inductor"
    root.mkdir(parents=True)
    for p in (root, root.parent):
        os.chown(p, user.pw_uid, user.pw_gid)
    return root


def _put_as(user: pwd.struct_passwd, path: Path, data: bytes) -> None:
    """A file the user made: its own, created in its own directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    d = path.parent
    while d.owner() != user.pw_name:
        os.chown(d, user.pw_uid, user.pw_gid)
        d = d.parent
    path.write_bytes(data)
    os.chown(path, user.pw_uid, user.pw_gid)


def _secret(base: Path) -> Path:
    secret = base / "root-only"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    return secret


def test_publish_never_uploads_what_a_swapped_link_or_a_root_file_holds(
    base: Path, tmp_path: Path, user: pwd.struct_passwd, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _users_tree(base, user)
    secret = _secret(base)
    _put_as(user, root / "fxgraph" / "ab" / "entry", b"a compiled graph")
    _put_as(user, root / "fxgraph" / "cd" / "entry", b"another compiled graph")
    _put_as(user, root / "kernel.py", b"print('a kernel')")
    # A root-only file inside the user's tree (e.g. a hard link a privileged tool made): not the user's.
    (root / "fxgraph" / "ab" / "rootfile").write_bytes(SECRET + b"2")
    (root / "fxgraph" / "ab" / "rootfile").chmod(0o600)
    real_changes = publish_mod.changes

    def walk_then_swap(roots: dict[str, Path], baseline: Baseline) -> object:
        out = real_changes(roots, baseline)
        # Between the walk and the read, the user swaps a listed file, and a listed directory, for links.
        (root / "fxgraph" / "ab" / "entry").unlink()
        os.symlink(secret, root / "fxgraph" / "ab" / "entry")
        os.lchown(root / "fxgraph" / "ab" / "entry", user.pw_uid, user.pw_gid)
        (root / "fxgraph" / "cd").rename(root / "fxgraph" / "cd-old")
        (base / "fake-cd").mkdir()
        (base / "fake-cd" / "entry").write_bytes(SECRET + b"3")
        (base / "fake-cd" / "entry").chmod(0o600)
        os.symlink(base / "fake-cd", root / "fxgraph" / "cd")
        return out

    monkeypatch.setattr(publish_mod, "changes", walk_then_swap)
    store = open_store((tmp_path / "store").as_uri())
    roots = {"inductor": root}
    res = publish(store, KEY, "n0", roots, Baseline(roots={"inductor": str(root)}), 1 << 30)

    for leaked in (SECRET, SECRET + b"2", SECRET + b"3"):
        assert not store.has_blob(hashlib.sha256(leaked).hexdigest()), "a root-only file was uploaded"
    entries = read_index(store, KEY).entries
    assert set(entries) == {"inductor/kernel.py"}, entries  # the user's own file still travels
    assert res.skipped == 2


def test_restore_never_writes_through_a_linked_directory(base: Path, tmp_path: Path, user: pwd.struct_passwd) -> None:
    root = _users_tree(base, user)
    elsewhere = base / "root-owned"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, root / "fxgraph")
    os.lchown(root / "fxgraph", user.pw_uid, user.pw_gid)
    store = open_store((tmp_path / "store").as_uri())
    entries = {}
    for rel, data in {"inductor/fxgraph/ab/x.py": b"graph", "inductor/fxgraph/y": b"y", "inductor/ok/z": b"z"}.items():
        entries[rel] = Entry(store.put_blob_bytes(data), len(data), time.time())
    write_index(store, KEY, "n0", entries, [])

    out = restore(store, read_index(store, KEY), {"inductor": root}, 1 << 30)

    assert list(elsewhere.iterdir()) == [], "root wrote through the user's link"
    assert (root / "fxgraph").is_symlink()
    assert sorted(out.dropped) == ["inductor/fxgraph/ab/x.py", "inductor/fxgraph/y"] and out.files == 1
    z = root / "ok" / "z"
    assert z.read_bytes() == b"z"
    # Written as the tree's owner, with the modes masked.
    for p in (z, z.parent):
        assert p.stat().st_uid == user.pw_uid
    assert z.stat().st_mode & 0o7777 == 0o644 and z.parent.stat().st_mode & 0o7777 == 0o700


def test_restore_refuses_a_directory_of_another_owner(base: Path, tmp_path: Path, user: pwd.struct_passwd) -> None:
    root = _users_tree(base, user)
    other = root / "fxgraph"
    other.mkdir(mode=0o777)
    other.chmod(0o777)
    os.chown(other, NOBODY, NOBODY)
    store = open_store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(b"code")
    write_index(store, KEY, "n0", {"inductor/fxgraph/a.py": Entry(digest, 4, time.time())}, [])

    out = restore(store, read_index(store, KEY), {"inductor": root}, 1 << 30)

    assert list(other.iterdir()) == [] and out.dropped == ["inductor/fxgraph/a.py"]


def test_a_cache_root_of_another_user_is_not_used(base: Path, user: pwd.struct_passwd) -> None:
    """As the plain user: a TORCHINDUCTOR_CACHE_DIR that exists and belongs to someone else (here a
    world-writable directory of root's) is not its cache: what others put there would be loaded."""
    theirs = base / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    (base / "home").mkdir()
    os.chown(base / "home", user.pw_uid, user.pw_gid)
    mine = base / "home" / "cache" / "triton"
    os.setegid(user.pw_gid)
    os.seteuid(user.pw_uid)
    try:
        usable = make_dirs({"inductor": theirs, "triton": mine})
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert "inductor" not in usable
    assert usable.get("triton") == mine and mine.stat().st_uid == user.pw_uid


def test_root_publishes_and_restores_its_own_tree(tmp_path: Path) -> None:
    """Root's own caches (the default, under its cache directory) travel as before."""
    src, dst = tmp_path / "a" / "inductor", tmp_path / "b" / "inductor"
    (src / "fxgraph").mkdir(parents=True)
    (src / "fxgraph" / "g").write_bytes(b"graph")
    store: Store = open_store((tmp_path / "store").as_uri())
    publish(store, KEY, "n0", {"inductor": src}, Baseline(roots={"inductor": str(src)}), 1 << 30)
    dst.mkdir(parents=True)
    out = restore(store, read_index(store, KEY), {"inductor": dst}, 1 << 30)
    assert out.files == 1 and (dst / "fxgraph" / "g").read_bytes() == b"graph"


def test_publish_does_not_hang_on_a_fifo_swapped_in(
    base: Path, tmp_path: Path, user: pwd.struct_passwd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listed file swapped for a FIFO: opened O_NONBLOCK and refused by fstat, never waited on."""
    import threading

    root = _users_tree(base, user)
    _put_as(user, root / "kernel.py", b"print('a kernel')")
    real_changes = publish_mod.changes

    def walk_then_swap(roots: dict[str, Path], baseline: Baseline) -> object:
        out = real_changes(roots, baseline)
        (root / "kernel.py").unlink()
        os.mkfifo(root / "kernel.py")
        os.chown(root / "kernel.py", user.pw_uid, user.pw_gid)
        return out

    monkeypatch.setattr(publish_mod, "changes", walk_then_swap)
    store = open_store((tmp_path / "store").as_uri())
    done: list[object] = []
    t = threading.Thread(
        target=lambda: done.append(publish(store, KEY, "n0", {"inductor": root}, Baseline(roots={}), 1 << 30)),
        daemon=True,
    )
    t.start()
    t.join(20)
    if t.is_alive():  # let the reader go, then fail
        with open(os.open(root / "kernel.py", os.O_WRONLY | os.O_NONBLOCK), "wb") as w:
            w.write(b"x")
        pytest.fail("the publish waited on a FIFO")
    assert done and read_index(store, KEY).entries == {}
