"""A real lazy loader for the tests: `rclone mount` of a bucket on the loopback S3 server.

`--vfs-cache-mode off` reads each range from the bucket and does not return keep-cache to the
kernel, so a file's pages are dropped at every open; `--vfs-cache-mode full` keeps fetched chunks in
its own disk cache (still no keep-cache). Credentials go through RCLONE_S3_* environment variables,
never the command line.

    upload(tree, endpoint, "bucket/tree")
    with RcloneMount(endpoint, "bucket/tree", mnt, cache_mode="off", workdir=tmp) as m: ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .fuseproc import FuseProcess, mounted
from .s3server import ACCESS_KEY, SECRET_KEY

__all__ = ["RcloneMount", "mounted", "rclone_env", "upload"]


def rclone_env(endpoint: str) -> dict[str, str]:
    return dict(
        os.environ,
        RCLONE_S3_PROVIDER="Other",
        RCLONE_S3_ENDPOINT=f"http://{endpoint}",
        RCLONE_S3_ACCESS_KEY_ID=ACCESS_KEY,
        RCLONE_S3_SECRET_ACCESS_KEY=SECRET_KEY,
        RCLONE_S3_REGION="us-east-1",
        RCLONE_CONFIG="/dev/null",
    )


def upload(tree: Path, endpoint: str, dest: str) -> None:
    """Copy `tree` into the bucket path `dest` ("bucket/prefix"), keeping modification times."""
    binary = shutil.which("rclone") or "rclone"
    subprocess.run(
        [binary, "copy", str(tree), f":s3:{dest}", "--transfers", "16"],
        env=rclone_env(endpoint),
        check=True,
        capture_output=True,
        timeout=300,
    )


class RcloneMount(FuseProcess):
    """`rclone mount` as a subprocess: `start()` waits until mounted, `stop()` unmounts however it ends."""

    name = "rclone-mount"

    def __init__(
        self, endpoint: str, remote: str, mountpoint: Path, cache_mode: str, workdir: Path, chunk: str = "1M"
    ) -> None:
        super().__init__(mountpoint, workdir)
        self.endpoint, self.remote, self.cache_mode, self.chunk = endpoint, remote, cache_mode, chunk

    def argv(self) -> list[str]:
        cache_dir = self.workdir / f"rclone-cache-{self.mountpoint.name}"
        return [
            shutil.which("rclone") or "rclone",
            "mount",
            f":s3:{self.remote}",
            str(self.mountpoint),
            "--read-only",
            "--vfs-cache-mode",
            self.cache_mode,
            "--buffer-size",
            "0",
            "--vfs-read-chunk-size",
            self.chunk,
            "--dir-cache-time",
            "1h",
            "--cache-dir",
            str(cache_dir),
            "--allow-other",
        ]

    def env(self) -> dict[str, str]:
        return rclone_env(self.endpoint)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir / f"rclone-cache-{self.mountpoint.name}", ignore_errors=True)
