"""Issue 28 item 2: the capture starts writing the large files while the scan still runs, and looks
outside the roots in a child of its own; neither may change what the blob holds or leave anything
behind when the capture fails."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bootseer_cli.envsnap import capture, format, manifest, reader, segments
from bootseer_cli.errors import BootseerError
from bootseer_cli.settings import StoreSettings
from bootseer_cli.store.cache import BlobCache
from tests.support.slowdown import scaled

BIG = format.CHUNK_BYTES // 2 + 4096  # a frame of its own, written by the large-file writer


def _capture(root: Path, baseline: manifest.Manifest, cache_dir: Path) -> capture.Captured:
    settings = StoreSettings(uri=(cache_dir / "store").as_uri(), cache_dir=cache_dir)
    return capture.capture(settings, [str(root)], baseline, "a" * 64, BlobCache(cache_dir, 1 << 40), warn=print)


def test_large_files_are_written_while_the_scan_runs_and_the_blob_holds_exactly_the_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "env"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "kept.so").write_bytes(os.urandom(BIG))  # in the baseline, unchanged: not in the blob
    (root / "lib" / "grown.so").write_bytes(os.urandom(BIG))  # in the baseline, then rewritten
    baseline = manifest.scan([root])
    time.sleep(0.01)
    (root / "lib" / "grown.so").write_bytes(os.urandom(BIG + 1))
    (root / "lib" / "new.so").write_bytes(os.urandom(BIG))
    (root / "lib" / "linked.so").write_bytes(os.urandom(BIG))  # two links: it must precede its link
    os.link(root / "lib" / "linked.so", root / "lib" / "z-link.so")
    for i in range(30):
        (root / "lib" / f"m{i}.py").write_bytes(os.urandom(1000 + i))

    events: list[str] = []
    start, scan = segments.BigWriter._start, manifest.scan

    def spy_start(self: segments.BigWriter) -> None:
        events.append("large-file writer started")
        start(self)

    def spy_scan(*a: object, **k: object) -> manifest.Manifest:
        out = scan(*a, **k)  # type: ignore[arg-type]
        events.append("scan done")
        return out

    monkeypatch.setattr(segments.BigWriter, "_start", spy_start)
    monkeypatch.setattr(manifest, "scan", spy_scan)
    cap = _capture(root, baseline, tmp_path / "cache")

    assert events[-1] == "scan done" and set(events[:-1]) == {"large-file writer started"}  # started during it
    meta = reader.read_meta(cap.blob)
    names = [e.path for e in meta.entries]
    lib = str(root / "lib")
    assert f"{lib}/kept.so" not in names
    assert {f"{lib}/grown.so", f"{lib}/new.so", f"{lib}/linked.so", f"{lib}/z-link.so"} <= set(names)
    assert names.index(f"{lib}/linked.so") < names.index(f"{lib}/z-link.so")
    assert len(names) == len(set(names)) == len(manifest.diff(baseline, manifest.scan([root])).changed)
    # the blob is a plain .tar.zst whose members hold the bytes of the tree
    import subprocess

    listing = subprocess.run(["tar", "-I", "zstd", "-tvf", str(cap.blob)], capture_output=True, text=True, check=True)
    assert "lib/new.so" in listing.stdout and "lib/z-link.so link to" in listing.stdout
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", str(cap.blob), "-C", str(out)], check=True)
    for name in ("grown.so", "new.so", "linked.so", "m7.py"):
        assert (out / lib.lstrip("/") / name).read_bytes() == (root / "lib" / name).read_bytes()


@pytest.mark.parametrize("writers", [1, 2])
def test_a_capture_refused_after_the_scan_leaves_no_writer_and_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: int
) -> None:
    monkeypatch.setattr(segments, "big_writers", lambda cores: writers)
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    for i in range(writers + 1):
        (root / f"big{i}.so").write_bytes(os.urandom(BIG))
    (root / "outside.pth").write_text("/somewhere/else/entirely\n")  # an editable install: refused
    started: list[int] = []
    start = segments.BigWriter._start

    def spy_start(self: segments.BigWriter) -> None:
        start(self)
        started.append(self.kids[-1].pid)

    monkeypatch.setattr(segments.BigWriter, "_start", spy_start)
    with pytest.raises(BootseerError, match="editable installs"):
        _capture(root, baseline, tmp_path / "cache")
    assert len(started) == writers, "the large files were not handed to the writers during the scan"
    for pid in started:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no writer goes on in the background
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_the_look_outside_the_roots_is_cut_off_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A walk that hangs (a dead NFS home, say) costs the capture its deadline, never more."""
    monkeypatch.setattr(capture, "OUTSIDE_BUDGET_S", 0.0)
    monkeypatch.setattr(capture, "walk_outside", lambda *a, **k: time.sleep(60) or ["never"])
    t = time.monotonic()
    look = capture.OutsideLook(time.time(), [str(tmp_path)], [], grace_s=0.3)
    pid = look.pid
    assert look.result() == []
    assert time.monotonic() - t < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_the_look_outside_the_roots_finds_a_file_the_setup_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    since = time.time() - 1
    (home / ".local" / "bin" / "tool").write_text("#!/bin/sh\n")
    found = capture.OutsideLook(since, [str(tmp_path / "env")], []).result()
    assert str(home / ".local" / "bin" / "tool") in found


def _base_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packages: int) -> tuple[Path, float]:
    """A base interpreter whose site-packages holds `packages` old packages; HOME empty. Returns its
    site-packages and the setup's start (after every file of it)."""
    import sysconfig

    base = tmp_path / "base"
    site = Path(sysconfig.get_paths(vars={"base": str(base), "platbase": str(base)})["purelib"])
    for i in range(packages):
        (site / f"pkg{i}").mkdir(parents=True)
        (site / f"pkg{i}" / "__init__.py").write_text("")
    (site / "easy-install.pth").write_text("")
    (base / "bin").mkdir()
    monkeypatch.setattr("sys.base_prefix", str(base))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    time.sleep(0.05)  # the setup starts after every ctime of it (the kernel's clock is coarse)
    since = time.time()
    time.sleep(0.05)
    return site, since


def test_an_unchanged_base_site_packages_is_looked_at_not_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing was installed into it (its own mtime is older than the setup): its own entries are looked
    at (a `.pth` appended to in place is found), its packages are not walked (a large one took the
    whole share of the budget, 0.27 s of a small layer's capture)."""
    site, since = _base_interpreter(tmp_path, monkeypatch, packages=50)
    with open(site / "easy-install.pth", "a") as f:  # in place: the directory's mtime stays
        f.write("/somewhere\n")
    places, skip, shallow = capture.outside_places([str(tmp_path / "env")], [], since)
    assert str(site) in shallow
    listed: list[str] = []
    scandir = os.scandir

    def counting(path: str) -> object:
        listed.append(str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counting)
    found = capture.walk_outside(since, places, skip, str(tmp_path / "home"), shallow=shallow)
    assert str(site / "easy-install.pth") in found
    assert not [d for d in listed if d.startswith(str(site) + "/")]  # no package of it listed


def test_an_install_into_the_base_site_packages_is_still_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setup that installed into the base interpreter instead of the env: its new package is found
    by the look (in its forked child), as before."""
    site, since = _base_interpreter(tmp_path, monkeypatch, packages=50)
    (site / "newpkg").mkdir()
    (site / "newpkg" / "__init__.py").write_text("")
    (site / "newpkg-1.0.dist-info").mkdir()
    found = capture.OutsideLook(since, [str(tmp_path / "env")], []).result()
    assert str(site / "newpkg" / "__init__.py") in found


def test_a_blob_written_without_the_scans_writer_gives_large_files_their_own_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The squash writes a blob of a tree it did not scan for a capture: the large files then go to a
    writer forked with the small files' ones, last in the stream, and the blob is the same tree."""
    import subprocess

    monkeypatch.setattr(segments, "SEGMENT_MIN_ENTRIES", 5)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    root = tmp_path / "env"
    (root / "a").mkdir(parents=True)
    (root / "a" / "big.so").write_bytes(os.urandom(BIG))
    for i in range(40):
        (root / "a" / f"m{i}.py").write_bytes(os.urandom(3000 + i))
    after = manifest.scan([root])
    changed = manifest.diff({}, after).changed
    written, entries = segments.write_blob(tmp_path / "blob.tar.zst", after, changed, {"roots": [str(root)]}, False)
    assert [e.path for e in entries][-1] == str(root / "a" / "big.so")  # the large file last
    assert sorted(e.path for e in entries) == sorted(changed)
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", str(tmp_path / "blob.tar.zst"), "-C", str(out)], check=True)
    for p in (root / "a").iterdir():
        assert (out / str(p).lstrip("/")).read_bytes() == p.read_bytes()
    assert list(tmp_path.glob("blob.tar.zst.part*")) == []
    assert written.size == (tmp_path / "blob.tar.zst").stat().st_size


def test_the_large_files_part_goes_first_when_its_writer_ends_first_and_tar_still_reads_the_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appended as soon as it is done, the large files' part can precede their directories' entries:
    our restore makes directories on demand, and so does GNU tar."""
    import subprocess

    from tests.envsnap.conftest import tree_state

    slow = segments._segment_child

    def slow_small_writer(*a: object) -> None:  # runs in the forked child
        time.sleep(1.0)
        slow(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(segments, "_segment_child", slow_small_writer)
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    (root / "pkg" / "lib").mkdir(parents=True)
    os.chmod(root / "pkg", 0o750)
    (root / "pkg" / "lib" / "big.so").write_bytes(os.urandom(BIG))
    for i in range(20):
        (root / "pkg" / f"m{i}.py").write_bytes(os.urandom(700 + i))
    want = tree_state(root)
    cap = _capture(root, baseline, tmp_path / "cache")
    names = [e.path for e in reader.read_meta(cap.blob).entries]
    assert names[0] == str(root / "pkg" / "lib" / "big.so")  # before its own directories
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", str(cap.blob), "-C", str(out)], check=True)
    base = str(out / str(root).lstrip("/"))
    got = {k[len(base) :]: v for k, v in tree_state(Path(base)).items()}
    assert got == {k[len(str(root)) :]: v for k, v in want.items()}  # modes of the directories too
    # and our own restore, into the emptied root
    import shutil

    from bootseer_cli.envsnap import extract

    shutil.rmtree(root)
    root.mkdir()
    extract.extract(cap.blob, reader.read_meta(cap.blob), [str(root)])
    assert tree_state(root) == want


def test_a_large_file_writer_that_dies_fails_the_capture_with_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It dies at once: the scan goes on sending it paths (a broken pipe, taken quietly), and the
    capture then fails with a BootseerError, not a BrokenPipeError, with no part left behind."""
    monkeypatch.setattr(segments, "_big_child", lambda *a: os._exit(3))
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    for i in range(3):
        (root / f"big{i}.so").write_bytes(os.urandom(BIG))
    (root / "small.py").write_text("x = 1\n")
    with pytest.raises(BootseerError, match="a capture worker died"):
        _capture(root, baseline, tmp_path / "cache")
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def _timed_appends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, str]]:
    """(time, part name) of every segment the parent appends to the blob."""
    seen: list[tuple[float, str]] = []
    append = format.ArchiveWriter.append_segment

    def spy(self: format.ArchiveWriter, part: Path, doc: dict, rows: str) -> None:
        seen.append((time.monotonic(), part.name))
        append(self, part, doc, rows)

    monkeypatch.setattr(format.ArchiveWriter, "append_segment", spy)
    return seen


def _one_writer_reporting_each_file(
    monkeypatch: pytest.MonkeyPatch, on_third: Callable[[], object]
) -> list[tuple[float, str]]:
    """One large-file writer, a report after every file, `on_third` run in it before its third file;
    returns the parent's appends (`_timed_appends`)."""
    monkeypatch.setattr(segments, "REPORT_BYTES", 1)
    monkeypatch.setattr(segments, "big_writers", lambda cores: 1)
    add_now = format.ArchiveWriter.add_now
    count = [0]

    def counted(self: format.ArchiveWriter, path: str) -> bool:  # runs in the forked writer
        count[0] += 1
        if count[0] == 3:
            on_third()
        return add_now(self, path)

    monkeypatch.setattr(format.ArchiveWriter, "add_now", counted)
    return _timed_appends(monkeypatch)


def _four_large_files(tmp_path: Path) -> tuple[Path, manifest.Manifest]:
    """An env root whose baseline is empty, then four large files in it."""
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    for i in range(4):
        (root / f"big{i}.so").write_bytes(os.urandom(BIG + i))
    return root, baseline


def test_what_a_large_file_writer_has_written_goes_into_the_blob_while_it_still_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its part went into the blob whole once its last file was done: copied and hashed on the
    capture's critical path (~2 GB for the CUDA torch tree). Now each report goes in as it comes."""
    appends = _one_writer_reporting_each_file(monkeypatch, on_third=lambda: time.sleep(1.5))
    root, baseline = _four_large_files(tmp_path)
    (root / "small.py").write_text("x = 1\n")
    cap = _capture(root, baseline, tmp_path / "cache")

    large = [t for t, name in appends if ".partbig" in name]
    assert len(large) >= 3, appends
    assert large[-1] - large[0] > 1.0  # the first files were in before the third was even read
    meta = reader.read_meta(cap.blob)
    assert sorted(e.path for e in meta.entries) == sorted(
        [*(str(root / f"big{i}.so") for i in range(4)), str(root / "small.py")]
    )
    out = tmp_path / "out"
    extract_into(cap.blob, out)
    for i in range(4):
        assert (out / str(root).lstrip("/") / f"big{i}.so").read_bytes() == (root / f"big{i}.so").read_bytes()
    assert list((tmp_path / "cache" / "tmp").glob("*.part*")) == []


def extract_into(blob: Path, out: Path) -> None:
    """GNU tar's reading of the blob, into `out`."""
    import subprocess

    out.mkdir()
    subprocess.run(["tar", "-I", "zstd", "-xf", str(blob), "-C", str(out)], check=True)


def test_several_large_file_writers_share_the_large_files_and_the_blob_is_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On many cores the large files go to several writers (one reads and compresses while another
    waits for its last file's frame); each file is in the blob once, read back by tar and by us."""
    from bootseer_cli.envsnap import extract
    from tests.envsnap.conftest import tree_state

    monkeypatch.setattr(segments, "big_writers", lambda cores: 3)
    appends = _timed_appends(monkeypatch)
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    (root / "lib").mkdir()
    for i in range(5):
        (root / "lib" / f"big{i}.so").write_bytes(os.urandom(BIG + 1000 * i))
    for i in range(30):
        (root / "lib" / f"m{i}.py").write_bytes(os.urandom(500 + i))
    want = tree_state(root)
    cap = _capture(root, baseline, tmp_path / "cache")

    assert {name[-1] for _, name in appends if ".partbig" in name} == {"0", "1", "2"}  # each wrote a part
    names = [e.path for e in reader.read_meta(cap.blob).entries]
    assert len(names) == len(set(names)) == len(manifest.diff(baseline, manifest.scan([root])).changed)
    out = tmp_path / "out"
    extract_into(cap.blob, out)
    for i in range(5):
        assert (out / str(root).lstrip("/") / "lib" / f"big{i}.so").read_bytes() == (
            root / "lib" / f"big{i}.so"
        ).read_bytes()
    import shutil

    shutil.rmtree(root)
    root.mkdir()
    extract.extract(cap.blob, reader.read_meta(cap.blob), [str(root)])
    assert tree_state(root) == want
    assert list((tmp_path / "cache" / "tmp").glob("*.part*")) == []


def test_a_large_file_writer_that_dies_after_a_report_fails_the_capture_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first files are in the blob already when it dies: the capture still fails as a whole (no
    `last` report), with one line, and no part or blob is left."""
    appends = _one_writer_reporting_each_file(monkeypatch, on_third=lambda: os._exit(3))
    root, baseline = _four_large_files(tmp_path)
    with pytest.raises(BootseerError, match="a capture worker died"):
        _capture(root, baseline, tmp_path / "cache")
    assert any(".partbig" in name for _, name in appends)  # it had reported before it died
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


@pytest.mark.parametrize(("cores", "writers"), [(1, 1), (2, 2), (8, 2), (12, 3), (16, 4), (256, 4)])
def test_large_file_writers_per_core_count(cores: int, writers: int) -> None:
    """Two from 2 cores on (measured: a tree of large libraries 1.28x tar's time with one, 1.02-1.06x
    with two), one per 4 cores from 12 on, at most four."""
    assert segments.big_writers(cores) == writers


def test_writers_whose_reports_fill_their_pipe_do_not_stall_the_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large-file writer that reports as it goes blocks on its full report pipe until the parent
    reads it, which the parent does only once every path is sent; had the writer stopped reading its
    paths meanwhile, the parent's last send would wait for it for ever. Pipes of one page each make
    that happen with a few dozen files (on a node: a few hundred large files)."""
    import fcntl
    import signal

    pipe = os.pipe

    def small_pipe() -> tuple[int, int]:
        r, w = pipe()
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        return r, w

    def stalled(*_a: object) -> None:
        raise TimeoutError("the capture stalled")

    monkeypatch.setattr(os, "pipe", small_pipe)
    monkeypatch.setattr(segments, "REPORT_BYTES", 1)
    monkeypatch.setattr(segments, "big_writers", lambda cores: 1)
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    deep = root / ("d" * 100) / ("e" * 100)
    deep.mkdir(parents=True)
    for i in range(80):
        with open(deep / f"lib{i:03}.so", "wb") as f:  # sparse: quick to read and to compress
            f.truncate(BIG + i)
    old = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(60)
    try:
        cap = _capture(root, baseline, tmp_path / "cache")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    names = {e.path for e in reader.read_meta(cap.blob).entries}
    assert {str(deep / f"lib{i:03}.so") for i in range(80)} <= names


def test_a_large_file_writer_that_cannot_be_forked_leaves_its_files_to_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fork for the second writer (a process limit): the first takes every large file, and the blob
    is still the whole tree."""
    from tests.envsnap.conftest import tree_state

    monkeypatch.setattr(segments, "big_writers", lambda cores: 3)
    forks = [0]
    fork = os.fork

    def fork_once() -> int:
        forks[0] += 1
        if forks[0] == 2:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return fork()

    start = segments.BigWriter._start

    def spy_start(self: segments.BigWriter) -> None:
        monkeypatch.setattr(os, "fork", fork_once)
        try:
            start(self)
        finally:
            monkeypatch.setattr(os, "fork", fork)

    monkeypatch.setattr(segments.BigWriter, "_start", spy_start)
    appends = _timed_appends(monkeypatch)
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    for i in range(4):
        (root / f"big{i}.so").write_bytes(os.urandom(BIG + i))
    (root / "small.py").write_text("x = 1\n")
    want = tree_state(root)
    cap = _capture(root, baseline, tmp_path / "cache")
    assert {name for _, name in appends if ".partbig" in name} == {next(n for _, n in appends if ".partbig" in n)}
    out = tmp_path / "out"
    extract_into(cap.blob, out)
    got = tree_state(out / str(root).lstrip("/"))
    assert {k.rsplit("/", 1)[-1]: v for k, v in got.items()} == {k.rsplit("/", 1)[-1]: v for k, v in want.items()}


def test_a_writer_stuck_in_a_read_is_given_up_at_the_deadline_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture runs before exec: a large-file writer that never returns from a read (a hung
    network filesystem) made the parent wait on its reports for ever. Now a capture whose writers
    neither report nor grow a part for STALL_S fails with one line, the writer stopped, no part left."""
    import signal

    def stalled(*_a: object) -> None:
        raise TimeoutError("the capture waited for ever")

    stall_s = scaled(0.5)
    monkeypatch.setattr(segments, "STALL_S", stall_s)
    monkeypatch.setattr(segments, "big_writers", lambda cores: 1)
    monkeypatch.setattr(segments, "_big_child", lambda *a: time.sleep(3600))  # runs in the forked writer
    root, baseline = _four_large_files(tmp_path)
    old = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(int(scaled(30)))  # far past the deadline: the capture would otherwise wait for ever
    try:
        with pytest.raises(BootseerError, match=rf"^capture: no writer made progress in {stall_s:g} s"):
            _capture(root, baseline, tmp_path / "cache")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_a_slow_writer_whose_part_grows_is_not_given_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline is on progress, not on the capture's length: a writer that takes 0.3 STALL_S per
    file and reports only at its end (its part grows meanwhile) outlasts STALL_S and succeeds. The
    deadline comes from the suite's slowdown knob: a literal 0.5 s fired under load (issue 46)."""
    stall_s = scaled(1.0)
    monkeypatch.setattr(segments, "STALL_S", stall_s)
    monkeypatch.setattr(segments, "REPORT_BYTES", 0)
    monkeypatch.setattr(segments, "big_writers", lambda cores: 1)
    add_now = format.ArchiveWriter.add_now

    def slow(self: format.ArchiveWriter, path: str) -> bool:  # runs in the forked writer
        time.sleep(0.3 * stall_s)
        return add_now(self, path)

    monkeypatch.setattr(format.ArchiveWriter, "add_now", slow)
    root = tmp_path / "env"
    root.mkdir()
    baseline = manifest.scan([root])
    for i in range(8):
        (root / f"big{i}.so").write_bytes(os.urandom(BIG + i))
    t0 = time.monotonic()
    cap = _capture(root, baseline, tmp_path / "cache")
    assert time.monotonic() - t0 > 2 * stall_s  # well past STALL_S
    assert {e.path for e in reader.read_meta(cap.blob).entries} >= {str(root / f"big{i}.so") for i in range(8)}
