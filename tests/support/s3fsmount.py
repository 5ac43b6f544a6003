"""Another real lazy loader: Debian's `s3fs` (s3fs-fuse) mounting a bucket of the loopback S3 server.

Without `kernel_cache` s3fs does not return keep-cache, so the kernel drops a file's pages at every
open; with it (`kernel_cache=True`) pages survive, as on an image snapshotter. Credentials go
through the AWSACCESSKEYID / AWSSECRETACCESSKEY environment variables, never the command line.
`use_cache` is left off: every read is a ranged GET. Install: `apt-get install s3fs`.

Debian's s3fs brings libfuse2, and mfusepy (lazyfs, the checkpoint mount) then loads libfuse2 unless
FUSE_LIBRARY_PATH names libfuse3 (lazyfs.py sets it). Without a system install, a private copy works:
`S3FS_BIN=/path/to/s3fs S3FS_LIBDIR=/dir/with/libfuse.so.2` (e.g. `apt-get download s3fs libfuse2`
and `dpkg -x` them into a directory ldconfig does not know).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time
from pathlib import Path

from .rclonemount import mounted
from .s3server import ACCESS_KEY, SECRET_KEY


def binary() -> str | None:
    return os.environ.get("S3FS_BIN") or shutil.which("s3fs")


def available() -> bool:
    found = binary()
    return found is not None and os.access(found, os.X_OK)


class S3fsMount:
    """`s3fs -f` as a subprocess: `start()` waits until mounted, `stop()` unmounts however it ends."""

    def __init__(self, endpoint: str, remote: str, mountpoint: Path, kernel_cache: bool, workdir: Path) -> None:
        self.endpoint, self.remote, self.mountpoint = endpoint, remote, mountpoint
        self.kernel_cache, self.workdir = kernel_cache, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    def argv(self) -> list[str]:
        bucket, _, prefix = self.remote.partition("/")
        opts = [
            f"url=http://{self.endpoint}",
            "use_path_request_style",
            "endpoint=us-east-1",
            "ro",
            "allow_other",
            "stat_cache_expire=3600",
            "multireq_max=8",
            "parallel_count=8",
        ]
        if self.kernel_cache:
            opts.append("kernel_cache")
        return [binary() or "s3fs", f"{bucket}:/{prefix}", str(self.mountpoint), "-f", "-o", ",".join(opts)]

    def start(self, timeout: float = 20.0) -> S3fsMount:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"s3fs-{self.mountpoint.name}.log"
        env = dict(os.environ, AWSACCESSKEYID=ACCESS_KEY, AWSSECRETACCESSKEY=SECRET_KEY)
        if os.environ.get("S3FS_LIBDIR"):
            env["LD_LIBRARY_PATH"] = os.environ["S3FS_LIBDIR"]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(self.argv(), env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while not mounted(self.mountpoint):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"s3fs did not mount: {log.read_text(errors='replace')[-1500:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False)
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def restart(self) -> S3fsMount:
        self.stop()
        return self.start()

    def __enter__(self) -> S3fsMount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
