"""The record's staleness check beside the replay's reads (issue 28, item 5; `freshness.Check`).

Into a loader's own cache the stage no longer waits for the whole check before reading: it stats the
files with the most recorded bytes first, and reads each file once its own stat says it is fresh, while
the rest are checked. The loader is a real `rclone mount --vfs-cache-mode full` of a bucket on the
loopback S3 server, behind the delaying proxy, whose log of request lines gives the order in which
rclone asked the bucket (a HEAD per file stat'ed, a ranged GET per read).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.commands.options import load_settings
from bootseer_cli.hotblocks import loadercache, probe
from bootseer_cli.hotblocks.freshness import Check
from bootseer_cli.hotblocks.record import REF_KIND
from bootseer_cli.store.core import open_store
from tests.support.delayproxy import DelayProxy
from tests.support.lazyfs import HANG_S, LazyMount
from tests.support.rclonemount import RcloneMount, upload
from tests.support.s3server import delayed

from .conftest import MiB, bootseer, wait_for, write_config

SMALL = 400  # small files beside the large one: a HEAD each when the check stats them
needs_rclone = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("rclone") is None, reason="needs root, FUSE and rclone"
)

PROGRAM = """
import os, sys, bootseer_cli
root = sys.argv[1]
for d, _, names in sorted(os.walk(root)):
    for n in sorted(names):
        with open(os.path.join(d, n), "rb") as f:
            f.read()
bootseer_cli.ready()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root and FUSE")
def test_a_stat_that_never_answers_holds_no_wait_past_the_deadline(tmp_path: Path) -> None:
    """A dead mount: the stat of one file (the largest, checked first) does not return for `HANG_S`.
    Every wait of the check ends at its deadline, 1 s (before: the verdict waited for that stat, for
    ever on a mount that never answers, and the start with it); the file is not called fresh, and the
    check says it is not complete."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(b"x" * 4000)
    (src / "small.bin").write_bytes(b"y" * 10)
    with LazyMount(src, tmp_path / "lazy", delay_ms=1, hang="big.bin") as lazy:
        root = lazy.mountpoint
        small = root / "small.bin"
        st = os.stat(small)
        deps = [(str(root / "big.bin"), 4000, st.st_mtime_ns, 4000), (str(small), 10, st.st_mtime_ns, 10)]
        t0 = time.monotonic()
        check = Check(deps, 0.5, threads=2, deadline=t0 + 1.0).start()
        answers: list[object] = []
        waiter = threading.Thread(
            target=lambda: answers.extend([check.mostly_stale(), check.fresh(str(root / "big.bin"))])
        )
        waiter.start()
        waiter.join(HANG_S - 2)
        assert not waiter.is_alive(), "a wait of the check outlasted its deadline"
        assert answers == [False, False]  # undecided: not mostly stale; the unanswered file: not fresh
        staleness, fresh = check.wait()
        assert time.monotonic() - t0 < HANG_S - 1
        assert not check.complete and fresh == {str(small)} and staleness.fresh_files == 1


def test_the_verdict_comes_from_the_longest_files_and_is_exact(tmp_path: Path) -> None:
    """The mostly-stale answer is given as soon as the files checked settle it, never guessed: a fresh
    large file settles "no" whatever the small ones are; a stale one "yes"; an even split waits for all."""
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(b"x" * 1000)
    small.write_bytes(b"y" * 10)
    deps = [(str(p), p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_size) for p in (small, big)]
    check = Check(deps, 0.5, threads=1)
    assert [d[0] for d in check.deps] == [str(big), str(small)]  # the most recorded bytes first
    assert check.start().mostly_stale() is False
    staleness, fresh = check.wait()
    assert fresh == {str(big), str(small)} and staleness.fresh_bytes == 1010
    stale_big = [(str(big), 999, deps[1][2], 1000), deps[0]]
    check = Check(stale_big, 0.5).start()
    assert check.mostly_stale() is True and not check.fresh(str(big)) and check.fresh(str(small))
    assert check.wait()[0].stale_bytes == 1000
    assert not check.fresh(str(tmp_path / "elsewhere"))  # not in the record: never read
    even = [(str(small), 10, deps[0][2], 50), (str(big), 1, 0, 50)]  # 50 % stale: not above the threshold
    assert Check(even, 0.5).start().mostly_stale() is False
    assert Check([], 0.5).start().mostly_stale() is False


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, DelayProxy]]:
    base = tmp_path_factory.mktemp("checkbeside")
    tree = base / "tree"
    (tree / "small").mkdir(parents=True)
    (tree / "big.bin").write_bytes(os.urandom(24 * MiB))
    for i in range(SMALL):
        (tree / "small" / f"s{i:03d}.bin").write_bytes(os.urandom(4096))
    with delayed(base / "s3", delay_ms=4.0) as (_, proxy):
        upload(tree, proxy.endpoint, "bootseer/tree")
        yield "bootseer/tree", proxy


def _stage_s(out: str) -> float:
    """The image stage's seconds, from its summary line ("image 1.1 s replayed …")."""
    line = next(x for x in out.splitlines() if "bootseer: image " in x and "|" in x)
    return float(line.split("image ", 1)[1].split(" s", 1)[0])


def _record_and_keep(m: RcloneMount, tmp_path: Path) -> tuple[Path, Any, str, list[str]]:
    """Record a start of `PROGRAM` (every file of the mount read) through the mount, and keep in the store
    that the mount's loader keeps a cache of its own (as an earlier start would have judged: the judgement
    is timed, and on 2 shared cores a busy moment made rclone's cached re-read look fetched again, a full
    suite, 2026-11-27; it has tests of its own, test_loader_cache.py). The config, the store, the image
    key and the program's argv."""
    probe.forget()
    loadercache.forget()
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    program = [sys.executable, str(prog), str(m.mountpoint)]
    cfg = write_config(tmp_path / "bootseer.toml", [m.mountpoint], ready="call", foreground_s=60.0)
    assert "recording this start" in _exec(cfg, tmp_path, program)
    show = lambda: json.loads(bootseer("hot", "show", "--json", "-c", str(cfg), cwd=tmp_path).stdout)  # noqa: E731
    wait_for(lambda: show()["record"], timeout=60, what="the record")
    store = open_store(load_settings(cfg).store.uri)
    shown = show()
    kept = {"own_cache": True, "first_ms": [], "again_ms": [], "at": time.time()}
    mounts = {loadercache.mount_key(str(m.mountpoint)): kept}
    store.write_ref(loadercache.KIND, shown["image_key"], {"record": shown["record"], "mounts": mounts})
    return cfg, store, str(shown["image_key"]), program


def _unread_small(ref: dict[str, Any]) -> list[Any]:
    """The `deps` entry of a small file that neither the samples nor the probe read (only the replay does)."""
    named = {s[0] for s in ref.get("samples") or []} | {str((ref.get("probe") or [""])[0])}
    return next(d for d in ref["deps"] if "/small/" in d[0] and d[0] not in named)


def _exec(cfg: Path, cwd: Path, program: list[str]) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "exec", "-c", str(cfg), "--", *program],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.mark.integration
@needs_rclone
@pytest.mark.parametrize("record", ["auto", "never"])
def test_a_replay_into_a_loaders_cache_reads_the_longest_file_while_the_rest_are_checked(
    bucket: tuple[str, DelayProxy], tmp_path: Path, record: str
) -> None:
    """The first GET of the record's longest file comes before the last HEAD of the check (before the
    change every file was stat'ed, one HEAD each, before the first read), and a file whose recorded
    mtime no longer matches is never read (no GET of it at all).

    With `record = "never"` too: no verdict is wanted there (the record is never taken again), and the
    reads waited for the whole check (`replay.plan`) until this was found by a traced benchmark run,
    whose replay starts use "never" to keep one record across rounds (1.4 s of HEADs before the first
    GET of `import torch`'s libraries)."""
    remote, proxy = bucket
    with RcloneMount(proxy.endpoint, remote, tmp_path / "mnt", "full", tmp_path) as m:
        cfg, store, key, program = _record_and_keep(m, tmp_path)
        m.restart()
        assert "replaying into it" in _exec(cfg, tmp_path, program)

        ref = store.read_ref(REF_KIND, key)
        assert ref is not None
        stale = _unread_small(ref)
        stale[2] += 7 * 1_000_000_000  # as if the file had changed since the record
        store.write_ref(REF_KIND, key, ref)
        m.restart()  # rclone's cache and its metadata empty
        if record != "auto":
            cfg = write_config(tmp_path / "replay.toml", [m.mountpoint], ready="call", foreground_s=60.0, record=record)
        first = len(proxy.lines)
        out = _exec(cfg, tmp_path, [sys.executable, "-c", "import time; time.sleep(0.5)"])  # reads nothing itself
        lines = proxy.lines[first:]
    assert "replayed" in out and "1 stale file(s) skipped" in out, out
    name = lambda line: line.split()[1].split("?")[0]  # noqa: E731
    heads = [i for i, x in enumerate(lines) if x.startswith("HEAD ") and "/tree/small/" in name(x)]
    gets = [i for i, x in enumerate(lines) if x.startswith("GET ") and name(x).endswith("/tree/big.bin")]
    assert len(heads) >= SMALL and gets, (len(heads), len(gets))
    assert gets[0] < heads[-1], f"the first read of big.bin came after the check's last HEAD ({gets[0]}, {heads[-1]})"
    stale_key = "/tree/" + stale[0].split(str(m.mountpoint) + "/", 1)[1]
    assert not [x for x in lines if x.startswith("GET ") and name(x).endswith(stale_key)], "a stale file was read"


@pytest.mark.integration
@needs_rclone
@pytest.mark.parametrize("record", ["auto", "never"])
def test_a_file_the_check_has_not_answered_by_the_deadline_still_goes_to_the_agent(
    bucket: tuple[str, DelayProxy], tmp_path: Path, record: str
) -> None:
    """`foreground_s = 1` and one small file whose stat (rclone's HEAD of it) takes 8 s: the check's waits
    end at the deadline with that file not checked, and the stage ends. The file's extents go to the
    agent with the rest of what the deadline left. Before: with "auto" a file not known fresh was dropped
    like a stale one, neither read nor handed on (the program fetched it itself); with "never" the stage
    checked the whole record before reading (`replay.plan`, no deadline) and took those seconds itself."""
    remote, proxy = bucket
    with RcloneMount(proxy.endpoint, remote, tmp_path / "mnt", "full", tmp_path) as m:
        _, store, image_key, _ = _record_and_keep(m, tmp_path)
        ref = store.read_ref(REF_KIND, image_key)
        assert ref is not None
        late = _unread_small(ref)[0]
        slow_cfg = write_config(tmp_path / "slow.toml", [m.mountpoint], ready="call", foreground_s=1.0, record=record)
        m.restart()  # rclone's cache and its metadata empty
        key = "/" + remote + "/" + late.split(str(m.mountpoint) + "/", 1)[1]
        proxy.slow["HEAD " + key] = 8.0
        first = len(proxy.lines)
        try:
            out = _exec(slow_cfg, tmp_path, [sys.executable, "-c", "import time; time.sleep(0.5)"])  # reads nothing
        finally:
            proxy.slow.clear()
        # the stage no longer waits for the slow stat (its line), though exec still does: a thread whose
        # FUSE request the daemon has read is waited out by the kernel before execve replaces the process
        assert "to the agent" in out and _stage_s(out) < 5.5, out
        runs = tmp_path / "xdg-cache" / "bootseer" / "runs"
        wait_for(
            lambda: any("hot-prefetch" in e.read_text() for e in runs.glob("*/events.jsonl")),
            timeout=60,
            what="the agent's replay",
        )
        gets = [x for x in proxy.lines[first:] if x.startswith("GET ") and x.split()[1].split("?")[0] == key]
    assert gets, f"{late} was not handed to the agent: nothing read it"
