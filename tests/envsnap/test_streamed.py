"""Issue 15: the streamed restore and the fast capture.

A restore reads the blob once, where it lies (a local store's file, or the node cache's), hashes it
beside the extraction and checks the digest before it commits: one copy on disk with the default
store, and a mismatch found at the end undoes the tree through the same journal as any failure. The
capture writes the same GNU tar bytes as tarfile, defers large files without ever putting a
hardlink before its target, and a local store opens without pyarrow.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bootseer_cli import delivery
from bootseer_cli.envsnap import capture, format, manifest, publish, reader, segments
from bootseer_cli.envsnap import restore as restore_mod
from bootseer_cli.envsnap.tree import EnvTree
from bootseer_cli.settings import P2PSettings, StoreSettings
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import Store, blob_path
from tests.envsnap.conftest import tree_state

KEY = "a" * 64
BIG = format.CHUNK_BYTES // 2 + 4096  # deferred to the end of the stream, a frame of its own


def build_tree(root: Path) -> None:
    """Small files over several frames, a large file, a hardlink to it, a symlink, nested dirs."""
    for i in range(40):
        d = root / "lib" / f"pkg{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_bytes(os.urandom(200 * 1024 + i))
    (root / "lib" / "aaa_big.so").write_bytes(os.urandom(BIG))  # sorts first, deferred to the end
    (root / "lib" / "big.so").write_bytes(os.urandom(BIG))
    os.link(root / "lib" / "big.so", root / "lib" / "big-link.so")
    (root / "lib" / "a.py").write_text("NEW = 1\n")
    os.symlink("pkg0/m0.py", root / "lib" / "alias.py")


@pytest.fixture(params=["one-writer", "forked-segments"])
def world(tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A snapshot of `env` published to a file:// store; `env` emptied again (keeping the root).

    Captured by one writer, or by forked segment writers (the path a large env takes)."""
    if request.param == "forked-segments":
        monkeypatch.setattr(segments, "SEGMENT_MIN_ENTRIES", 5)
        monkeypatch.setattr(os, "cpu_count", lambda: 3)
    return make_world(tmp_path, (tmp_path / "store").as_uri())


def make_world(tmp_path: Path, uri: str) -> dict:
    root = tmp_path / "env"
    root.mkdir()
    settings = StoreSettings(uri=uri, cache_dir=tmp_path / "node1")
    baseline = manifest.scan([root])
    build_tree(root)
    want = tree_state(root)
    store = Store(uri)
    cache1 = BlobCache(tmp_path / "node1", 1 << 40)
    cap = capture.capture(settings, [str(root)], baseline, KEY, cache1, warn=lambda m: None)
    publish.publish(P2PSettings(), store, cache1, cap, KEY, [str(root)])
    shutil.rmtree(root)
    root.mkdir()
    return {"root": root, "store": store, "want": want, "digest": cap.digest, "tmp": tmp_path}


def restore(w: dict, cache: BlobCache, key: str = KEY) -> restore_mod.Restored:
    r = restore_mod.restore(P2PSettings(), w["store"], cache, key, EnvTree([str(w["root"])]))
    assert r is not None
    return r


def files_under(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if p.is_file()]


def test_a_local_store_blob_is_read_in_place_and_linked_into_the_cache(world: dict) -> None:
    cache = BlobCache(world["tmp"] / "node2", 1 << 40)
    r = restore(world, cache)
    assert r.source == "store" and tree_state(world["root"]) == world["want"]
    stored = Path(world["store"].path(blob_path(world["digest"])))
    cached = cache.path(world["digest"])
    assert cached.stat().st_ino == stored.stat().st_ino  # one copy on disk: the cache links the store's
    assert files_under(world["tmp"] / "node2") == [cached]  # no staging copy, no leftovers
    # a restart on this node reads the cache's link (verified while it is extracted)
    shutil.rmtree(world["root"])
    world["root"].mkdir()
    assert restore(world, cache).source == "cache" and tree_state(world["root"]) == world["want"]


def test_a_digest_mismatch_found_at_the_end_undoes_the_tree(world: dict) -> None:
    """A blob that extracts cleanly but is not what its ref names: the whole tree is written, the
    digest is found wrong before the commit, and the journal puts every path back."""
    root, store = world["root"], world["store"]
    (root / "lib").mkdir()
    (root / "lib" / "a.py").write_text("OLD = 1\n")  # the snapshot replaces it
    (root / "keep.txt").write_text("mine\n")
    before = tree_state(root)
    wrong = hashlib.sha256(b"not this blob").hexdigest()
    good = Path(store.path(blob_path(world["digest"])))
    store.put_bytes(blob_path(wrong), good.read_bytes())
    ref = store.read_ref("env", KEY)
    store.write_ref("env", "b" * 64, {**ref, "blob": wrong})
    cache = BlobCache(world["tmp"] / "node2", 1 << 40)

    with pytest.raises(delivery.DigestMismatch, match=r"does not match its digest.*put back"):
        restore(world, cache, key="b" * 64)
    assert tree_state(root) == before
    assert not [p for p in os.listdir(root) if p.startswith(".bootseer")]
    assert not store.has_blob(wrong)  # dropped, so the next capture replaces it
    assert not cache.path(wrong).exists() and files_under(world["tmp"] / "node2") == []


def test_a_corrupt_cached_copy_is_dropped_and_the_store_read(world: dict, capsys: pytest.CaptureFixture) -> None:
    cache = BlobCache(world["tmp"] / "node2", 1 << 40)
    bad = bytearray(Path(world["store"].path(blob_path(world["digest"]))).read_bytes())
    bad[len(bad) // 3] ^= 0xFF  # inside a frame: the extraction fails, or the digest does
    cached = cache.path(world["digest"])
    cached.parent.mkdir(parents=True)
    cached.write_bytes(bytes(bad))

    r = restore(world, cache)
    assert r.source == "store" and tree_state(world["root"]) == world["want"]
    assert "failed its sha256 check" in capsys.readouterr().err
    assert cached.read_bytes() != bytes(bad)


def test_the_restore_of_a_local_store_imports_no_pyarrow(world: dict) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\nfrom bootseer_cli.store.cache import BlobCache\n"
        "from bootseer_cli.envsnap import restore\nfrom bootseer_cli.envsnap.tree import EnvTree\n"
        "from bootseer_cli.settings import P2PSettings\n"
        "from bootseer_cli.store.core import Store\n"
        f"r = restore.restore(P2PSettings(), Store({world['store'].uri!r}), BlobCache(Path(sys.argv[1]), 1 << 40),"
        f" {KEY!r}, EnvTree([{str(world['root'])!r}]))\n"
        "print(r.files, 'pyarrow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(world["tmp"] / "node3")], capture_output=True, text=True, check=True
    )
    assert out.stdout.split()[1] == "False", out.stdout
    assert tree_state(world["root"]) == world["want"]


def test_the_capture_writes_tarfiles_headers_and_defers_large_files(world: dict) -> None:
    cases = [
        ("/x/" + "é" * 80 + "/" + "a" * 120, manifest.FILE, 0o100644, 5, 10, ""),
        ("/x/" + "d" * 120, manifest.DIR, 0o40755, 5, 0, ""),
        ("/a/b", manifest.SYMLINK, 0o777, 1, 0, "../" + "z" * 200),
        ("/a/\udcff", manifest.FILE, 0o644, 1, 3, ""),
        ("/a/l", format.HARDLINK, 0o644, 1, 0, "/a/" + "t" * 120),
        ("/big", manifest.FILE, 0o644, 1, 9 << 30, ""),  # beyond octal: tarfile's base-256
        ("/old", manifest.FILE, 0o644, -5, 1, ""),
    ]
    for c in cases:
        assert format._tar_header(*c) == format._tarfile_header(*c), c[0][:40]

    blob = Path(world["store"].path(blob_path(world["digest"])))
    meta = reader.read_meta(blob, 1000)
    order = [e.path for e in meta.entries]
    root = str(world["root"])
    for i, e in enumerate(meta.entries):
        if e.kind == format.HARDLINK:  # a hardlink to a deferred file brought it forward
            assert order.index(e.extra) < i and e.extra in (f"{root}/lib/big.so", f"{root}/lib/big-link.so")
    big = f"{root}/lib/aaa_big.so"
    # a part of its own, appended as soon as it is done: before, between or after the small files'
    # pieces, which keep their order (a large file with a second link stays among them, deferred
    # to its piece's end or brought forward by its link)
    assert order.count(big) == 1
    small = [p for p in order if p not in (big, f"{root}/lib/big.so", f"{root}/lib/big-link.so")]
    assert small == sorted(small)
    listed = subprocess.run(["tar", "-I", "zstd", "-tf", str(blob)], capture_output=True, text=True, check=True)
    assert big.lstrip("/") in listed.stdout.splitlines()  # GNU tar reads it
    out = world["tmp"] / "by-tar"
    out.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", str(blob), "-C", str(out)], check=True)  # parents made on the way
    got = tree_state(out / root.lstrip("/"))
    base = str(out / root.lstrip("/"))
    assert {k[len(base) :]: v for k, v in got.items()} == {k[len(root) :]: v for k, v in world["want"].items()}
    with (
        subprocess.Popen(["zstd", "-dc", str(blob)], stdout=subprocess.PIPE) as z,
        tarfile.open(fileobj=z.stdout, mode="r|") as t,
    ):
        assert sum(1 for m in t if m.isfile()) == 43


@pytest.mark.parametrize("mode", ["one-writer", "forked-segments"])
def test_a_capture_that_fails_in_a_worker_says_why_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A fifo among the changes cannot be snapshotted: the worker's error reaches the caller as one
    BootseerError naming it, and neither the blob nor a segment part is left in the node cache."""
    from bootseer_cli.errors import BootseerError

    if mode == "forked-segments":
        monkeypatch.setattr(segments, "SEGMENT_MIN_ENTRIES", 5)
        monkeypatch.setattr(os, "cpu_count", lambda: 2)
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    build_tree(root)
    os.mkfifo(root / "lib" / "pkg3" / "zz.pipe")
    cache = BlobCache(tmp_path / "node1", 1 << 40)
    settings = StoreSettings(uri=(tmp_path / "store").as_uri(), cache_dir=tmp_path / "node1")
    with pytest.raises(BootseerError, match=r"cannot snapshot .*zz\.pipe"):
        capture.capture(settings, [str(root)], baseline, KEY, cache, warn=lambda m: None)
    assert files_under(tmp_path / "node1") == []


@pytest.mark.integration
def test_a_remote_blob_streams_into_the_node_cache_and_a_mismatch_undoes_the_tree(tmp_path: Path, s3_server) -> None:
    """From the loopback S3 store: the metadata by a ranged read of the blob's end, the frames
    extracted as the download brings them, the digest checked before the commit; the cache keeps the
    blob, no partial file is left. The same blob under a wrong name is undone and dropped."""
    w = make_world(tmp_path, s3_server.uri(f"t-{os.urandom(6).hex()}"))
    store, root = w["store"], w["root"]
    cache = BlobCache(tmp_path / "node2", 1 << 40)
    r = restore(w, cache)
    assert r.source == "store" and r.bytes_from_store > 0 and tree_state(root) == w["want"]
    assert [p.name for p in files_under(tmp_path / "node2")] == [w["digest"]]
    assert hashlib.sha256(cache.path(w["digest"]).read_bytes()).hexdigest() == w["digest"]

    (root / "keep.txt").write_text("mine\n")
    shutil.rmtree(root / "lib")
    before = tree_state(root)
    wrong = hashlib.sha256(b"not this blob").hexdigest()
    store.put_bytes(blob_path(wrong), cache.path(w["digest"]).read_bytes())
    store.write_ref("env", "b" * 64, {**store.read_ref("env", KEY), "blob": wrong})
    cache3 = BlobCache(tmp_path / "node3", 1 << 40)
    with pytest.raises(delivery.DigestMismatch, match=r"does not match its digest.*put back"):
        restore(w, cache3, key="b" * 64)
    assert tree_state(root) == before and not store.has_blob(wrong)
    assert files_under(tmp_path / "node3") == []


@pytest.mark.parametrize("outcome", ["arrives", "download-fails"])
def test_extraction_waits_for_frames_still_arriving(world: dict, outcome: str) -> None:
    """The extraction of a blob still being written in order (as a download writes it) waits for each
    frame; a download that fails pads the file to its size, the frames fail, the tree is undone."""
    import threading
    import time

    from bootseer_cli.envsnap import extract
    from bootseer_cli.errors import IntegrityError

    root = world["root"]
    data = Path(world["store"].path(blob_path(world["digest"]))).read_bytes()
    meta = reader.read_meta(Path(world["store"].path(blob_path(world["digest"]))), 1000)
    part = world["tmp"] / "arriving.part"
    w = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    r = os.open(part, os.O_RDONLY)
    cut = len(data) // 2

    def writer() -> None:
        for off in range(0, len(data), 256 << 10):
            if outcome == "download-fails" and off >= cut:
                os.ftruncate(w, len(data))  # what _Download does on a failure: zeros to the end
                break
            os.write(w, data[off : off + (256 << 10)])
            time.sleep(0.01)
        os.close(w)

    t = threading.Thread(target=writer)
    t.start()
    try:
        if outcome == "arrives":
            extract.extract(r, meta, [str(root)], threads=3, arriving=True)
            assert tree_state(root) == world["want"]
        else:
            with pytest.raises(IntegrityError, match="put back"):
                extract.extract(r, meta, [str(root)], threads=3, arriving=True)
            assert tree_state(root) == {}
            assert not [p for p in os.listdir(root) if p.startswith(".bootseer")]
    finally:
        t.join()
        os.close(r)
