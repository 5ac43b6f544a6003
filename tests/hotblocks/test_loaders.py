"""Hot blocks on a real lazy loader: `rclone mount` of a bucket on the loopback S3 server, behind a
proxy that delays every request (no netem on this kernel), with `--vfs-cache-mode off` (each read a
ranged GET, pages dropped at every open) and `full` (rclone's own disk cache; still no keep-cache).

And Debian's `s3fs`, without `kernel_cache` (pages dropped at every open) and with it (pages kept,
as on an image snapshotter: the record is taken by mincore and the replay lands in the page cache).

Small trees (a few hundred files, a few MB) so each test takes seconds; mounts, servers and proxies
are torn down however a test ends.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootseer_cli.hotblocks import probe
from tests.support.delayproxy import DelayProxy
from tests.support.lazyfs import LazyMount
from tests.support.rclonemount import RcloneMount, upload
from tests.support.s3fsmount import S3fsMount
from tests.support.s3fsmount import available as s3fs_available
from tests.support.s3server import delayed

from .conftest import bootseer, wait_for, write_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("rclone") is None, reason="needs root, FUSE and rclone"),
]

SMALL, BIG = 200, 3


def make_tree(base: Path) -> Path:
    """`base/tree`: SMALL files of 12 kB under pkg/ and BIG files of 2 MiB (what PROG reads from)."""
    tree = base / "tree"
    (tree / "pkg").mkdir(parents=True)
    for i in range(SMALL):
        (tree / "pkg" / f"m{i:03d}.py").write_bytes(os.urandom(12_000))
    for i in range(BIG):
        (tree / f"big{i}.bin").write_bytes(os.urandom(2 << 20))
    return tree


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, DelayProxy]]:
    """The tree in a bucket: (remote, local copy, the delaying proxy in front of the S3 server)."""
    base = tmp_path_factory.mktemp("loaders")
    tree = make_tree(base)
    with delayed(base / "s3") as (_, proxy):
        upload(tree, proxy.endpoint, "bootseer/tree")
        yield "bootseer/tree", tree, proxy


def _mount(bucket: tuple[str, Path, DelayProxy], tmp_path: Path, mode: str) -> RcloneMount | S3fsMount:
    """ "off"/"full": rclone's VFS cache modes; "s3fs"/"s3fs-kernel_cache": s3fs without/with kernel_cache."""
    remote, _, proxy = bucket
    probe.forget()
    if mode.startswith("s3fs"):
        if not s3fs_available():
            pytest.skip("s3fs is not installed (apt-get install s3fs)")
        return S3fsMount(proxy.endpoint, remote, tmp_path / f"mnt-{mode}", mode.endswith("kernel_cache"), tmp_path)
    return RcloneMount(proxy.endpoint, remote, tmp_path / f"mnt-{mode}", mode, tmp_path)


def _exec(cfg: Path, cwd: Path, prog: Path, root: Path) -> str:
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, str(prog), str(root), cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stderr


def _show(cfg: Path, cwd: Path) -> dict:
    return json.loads(bootseer("hot", "show", "--json", "-c", str(cfg), cwd=cwd).stdout)


def test_the_probe_tells_trees_that_keep_pages_from_trees_that_drop_them(
    bucket: tuple[str, Path, DelayProxy], tmp_path: Path
) -> None:
    _, tree, _ = bucket
    for mode, kind in (("off", "fuse.rclone"), ("full", "fuse.rclone"), ("s3fs", "fuse.s3fs")):
        with _mount(bucket, tmp_path, mode) as m:
            p = probe.probe_root(str(m.mountpoint))
            assert p.fstype == kind and p.drops, p
            cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint])
            out = bootseer("doctor", "-c", str(cfg), cwd=tmp_path).stdout
            assert f"image root   {m.mountpoint} ({kind}): drops a file's pages at every open" in out
    with _mount(bucket, tmp_path, "s3fs-kernel_cache") as m:
        assert probe.probe_root(str(m.mountpoint)).keeps
    probe.forget()
    with LazyMount(tree, tmp_path / "lazy", delay_ms=3) as lazy:
        assert probe.probe_root(str(lazy.mountpoint)).keeps
    assert probe.probe_root(str(tree)).keeps


@pytest.mark.parametrize("mode", ["off", "s3fs"])
def test_record_through_a_mount_that_drops_pages_then_replay_is_skipped(
    bucket: tuple[str, Path, DelayProxy], prog: Path, tmp_path: Path, mode: str
) -> None:
    """The record is taken through the mount itself (fanotify: the files the start opened, whole),
    and a later start skips replay with one line, since its pages would be dropped at open."""
    _, _, proxy = bucket
    with _mount(bucket, tmp_path, mode) as m:
        cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint], ready="call")
        assert "recording this start" in _exec(cfg, tmp_path, prog, m.mountpoint)
        wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
        shown = _show(cfg, tmp_path)
        assert shown["method"] == "opened-files"
        assert shown["files"] == 41  # exactly what the start opened: 40 small files and big0
        assert {Path(f["path"]).name for f in shown["top_files"]} >= {"big0.bin"}

        before = proxy.requests
        out = _exec(cfg, tmp_path, prog, m.mountpoint)
        assert "not replaying:" in out and "drops a file's pages at every open" in out
        assert "no replay (pages dropped at open)" in out and "replayed" not in out
        assert proxy.requests - before < 200  # the program's own reads only (no replay of 2 MB + 40 files)


def test_replay_into_a_loaders_own_cache_saves_the_starts_requests(
    bucket: tuple[str, Path, DelayProxy], prog: Path, tmp_path: Path
) -> None:
    """`replay = "always"` on rclone's full cache mode: the replay fills rclone's disk cache, so the
    program that follows asks the bucket for nothing it recorded."""
    _, _, proxy = bucket
    with _mount(bucket, tmp_path, "full") as m:
        cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint], ready="call", replay="always")
        _exec(cfg, tmp_path, prog, m.mountpoint)
        wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
        program = [sys.executable, str(prog), str(m.mountpoint)]
        skip = ("exec", "-q", "-c", str(cfg), "--skip", "image", "--")

        def requests_of_the_program() -> int:
            before = proxy.requests
            r = bootseer(*skip, *program, cwd=tmp_path)
            assert r.returncode == 0, r.stderr
            return proxy.requests - before

        m.restart()  # an empty disk cache
        assert requests_of_the_program() >= 41  # the control: cold, every file it opens is a GET
        m.restart()
        r = bootseer("hot", "replay", "--json", "-c", str(cfg), cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["files"] == 41
        cold = requests_of_the_program()
        assert cold <= 2, f"the program still made {cold} requests after the replay"


def test_never_slower_turns_replay_off_on_a_loader_after_a_start_it_made_slower(
    bucket: tuple[str, Path, DelayProxy], prog: Path, tmp_path: Path
) -> None:
    """A replay capped at 1 MB/s before exec (~2.5 MB of whole files) loses to the recording start:
    the agent compares the two starts' time to ready and turns replay off for this image."""
    with _mount(bucket, tmp_path, "full") as m:
        cfg = write_config(
            tmp_path / "bootseer.toml",
            [m.mountpoint],
            ready="call",
            replay="always",
            prefetch_mbps=1.0,
            foreground_s=30.0,
        )
        _exec(cfg, tmp_path, prog, m.mountpoint)
        wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
        m.restart()
        assert "replayed" in _exec(cfg, tmp_path, prog, m.mountpoint)
        wait_for(lambda: _show(cfg, tmp_path)["replay"]["off"], timeout=60, what="the verdict")
        m.restart()
        out = _exec(cfg, tmp_path, prog, m.mountpoint)
        assert "not replaying: replay is off for this image" in out and "replayed" not in out


def test_replay_reads_each_file_front_to_back_in_one_stream(tree: Path, tmp_path: Path) -> None:
    """The loader sees one forward stream per file: the chunks of a recorded file are fetched in
    offset order, even with many replay threads (the old pool read 1 MiB pieces of one file in parallel)."""
    prog = tmp_path / "whole.py"
    prog.write_text("import sys\nfor n in ('f1.bin', 'f2.bin'):\n    open(sys.argv[1] + '/' + n, 'rb').read()\n")
    with LazyMount(tree, tmp_path / "lazy", delay_ms=30) as lazy:
        mnt = str(lazy.mountpoint)
        r = bootseer("hot", "record", "--root", mnt, "--", sys.executable, str(prog), mnt, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        lazy.restart()
        cfg = write_config(tmp_path / "bootseer.toml", [lazy.mountpoint], prefetch_threads=16)
        r = bootseer("hot", "replay", "--json", "-c", str(cfg), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        fetched = lazy.fetches()
    for name in ("/f1.bin", "/f2.bin"):
        order = [chunk for path, chunk in fetched if path == name]
        assert order == [0, 1, 2], f"{name}: chunks fetched in the order {order}"


def test_on_a_mount_that_keeps_pages_the_record_is_by_mincore_and_replay_spares_the_program_its_fetches(
    bucket: tuple[str, Path, DelayProxy], prog: Path, tmp_path: Path
) -> None:
    """s3fs with kernel_cache: the record (taken through the mount) holds the pages the start read,
    not whole files, and after a replay the program fetches little more than with a warm page cache
    (s3fs asks the bucket once per open even then: that is the floor)."""
    _, _, proxy = bucket
    with _mount(bucket, tmp_path, "s3fs-kernel_cache") as m:
        cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint], ready="call")
        program = [sys.executable, str(prog), str(m.mountpoint)]
        assert "recording this start" in _exec(cfg, tmp_path, prog, m.mountpoint)
        wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
        shown = _show(cfg, tmp_path)
        assert shown["method"] == "mincore" and shown["files"] == 41
        assert shown["bytes"] < 40 * 12_000 + (1 << 20)  # big0: the pages read and readahead, not its 2 MiB

        def requests_of_the_program() -> int:
            before = proxy.requests
            r = bootseer("exec", "-q", "-c", str(cfg), "--skip", "image", "--", *program, cwd=tmp_path)
            assert r.returncode == 0, r.stderr
            return proxy.requests - before

        m.restart()  # an empty page cache for the mount
        cold = requests_of_the_program()
        warm = requests_of_the_program()
        m.restart()
        r = bootseer("hot", "replay", "--json", "-c", str(cfg), cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        after_replay = requests_of_the_program()
        assert cold >= warm + 40, (cold, warm)  # the control: data fetches are what replay can save
        assert after_replay <= warm + (cold - warm) // 2, (cold, warm, after_replay)


def test_a_start_blocked_on_a_slow_loader_is_not_taken_for_quiet(tree: Path, tmp_path: Path) -> None:
    """Each chunk takes longer than the quiet window to arrive: the start's resident set does not grow
    while it waits, but its process is in state D, so "quiet" waits for both reads to be recorded."""
    prog = tmp_path / "slow.py"
    prog.write_text(
        "import sys, time\n"
        "for n in ('f1.bin', 'f3.bin'):\n"
        "    with open(sys.argv[1] + '/' + n, 'rb') as f:\n"
        "        f.read(1000)\n"
        "time.sleep(6)\n"  # then quiet for longer than the window: the record ends by "quiet"
    )
    with LazyMount(tree, tmp_path / "lazy", delay_ms=3500) as lazy:
        mnt = str(lazy.mountpoint)
        r = bootseer(
            "hot", "record", "--root", mnt, "--ready", "quiet", "--", sys.executable, str(prog), mnt, cwd=tmp_path
        )
    assert r.returncode == 0, r.stderr
    assert "recorded 2 files" in r.stderr and "(quiet)" in r.stderr


def test_the_recording_asks_the_loader_for_nothing_while_the_program_starts(
    bucket: tuple[str, Path, DelayProxy], tmp_path: Path
) -> None:
    """Each fanotify event comes with an fd the kernel opens on the file when the event is read; on s3fs
    that open is a request. The agent reads the queue only once the start is over, so until then (the
    program opened its 41 files and works on for 2 s) a recording start asks the bucket for what a plain
    start asks, no more; the agent's opens come after ready, and the record still lists every file."""
    import subprocess
    import time

    prog = tmp_path / "slow_start.py"
    prog.write_text(
        "import os, sys, time\n"
        "root = sys.argv[1]\n"
        "for i in range(40):\n"
        "    open(os.path.join(root, 'pkg', f'm{i:03d}.py'), 'rb').read()\n"
        "open(os.path.join(root, 'big0.bin'), 'rb').read(300_000)\n"
        "print('opened', flush=True)\n"
        "time.sleep(2.0)\n"
    )
    _, _, proxy = bucket

    def requests_while_starting(argv: list[str]) -> tuple[int, str]:
        """Requests from the launch to 1.5 s after the program's opens (it is still starting then)."""
        before = proxy.requests
        with subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "opened"
            time.sleep(1.5)
            made = proxy.requests - before
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        return made, err

    with _mount(bucket, tmp_path, "s3fs") as m:
        cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint], ready="quiet")
        program = [sys.executable, str(prog), str(m.mountpoint)]
        plain, _ = requests_while_starting(program)
        m.restart()  # s3fs's caches empty again
        recording, err = requests_while_starting(
            [sys.executable, "-m", "bootseer_cli", "exec", "-c", str(cfg), "--", *program]
        )
        assert "recording this start" in err, err
        assert recording <= plain + 3, (
            f"a recording start made {recording} requests while starting, a plain one {plain}"
        )
        wait_for(lambda: _show(cfg, tmp_path).get("record"), timeout=60, what="the record")
        assert _show(cfg, tmp_path)["files"] == 41
