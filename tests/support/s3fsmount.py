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

import os
import shutil
from pathlib import Path

from .fuseproc import FuseProcess
from .s3server import ACCESS_KEY, SECRET_KEY


def binary() -> str | None:
    return os.environ.get("S3FS_BIN") or shutil.which("s3fs")


def available() -> bool:
    found = binary()
    return found is not None and os.access(found, os.X_OK)


class S3fsMount(FuseProcess):
    name = "s3fs"
    """`s3fs -f` as a subprocess: `start()` waits until mounted, `stop()` unmounts however it ends."""

    def __init__(self, endpoint: str, remote: str, mountpoint: Path, kernel_cache: bool, workdir: Path) -> None:
        super().__init__(mountpoint, workdir)
        self.endpoint, self.remote, self.kernel_cache = endpoint, remote, kernel_cache

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

    def env(self) -> dict[str, str]:
        env = dict(os.environ, AWSACCESSKEYID=ACCESS_KEY, AWSSECRETACCESSKEY=SECRET_KEY)
        if os.environ.get("S3FS_LIBDIR"):
            env["LD_LIBRARY_PATH"] = os.environ["S3FS_LIBDIR"]
        return env
