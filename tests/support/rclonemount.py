"""A real lazy loader for the tests: `rclone mount` of a bucket on the loopback S3 server.

`--vfs-cache-mode off` reads each range from the bucket and does not return keep-cache to the
kernel, so a file's pages are dropped at every open; `--vfs-cache-mode full` keeps fetched chunks in
its own disk cache (still no keep-cache). Credentials go through RCLONE_S3_* environment variables,
never the command line.

    upload(tree, endpoint, "bucket/tree")
    with RcloneMount(endpoint, "bucket/tree", mnt, cache_mode="off", workdir=tmp) as m: ...
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time
from pathlib import Path

from .s3server import ACCESS_KEY, SECRET_KEY


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


def mounted(mountpoint: Path) -> bool:
    real = os.path.realpath(mountpoint)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == real for line in f)


class RcloneMount:
    """`rclone mount` as a subprocess: `start()` waits until mounted, `stop()` unmounts however it ends."""

    def __init__(
        self, endpoint: str, remote: str, mountpoint: Path, cache_mode: str, workdir: Path, chunk: str = "1M"
    ) -> None:
        self.endpoint, self.remote, self.mountpoint = endpoint, remote, mountpoint
        self.cache_mode, self.workdir, self.chunk = cache_mode, workdir, chunk
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

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

    def start(self, timeout: float = 20.0) -> RcloneMount:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"rclone-mount-{self.mountpoint.name}.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), env=rclone_env(self.endpoint), stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.time() + timeout
        while not mounted(self.mountpoint):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"rclone mount did not come up: {log.read_text(errors='replace')[-1500:]}")
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
        shutil.rmtree(self.workdir / f"rclone-cache-{self.mountpoint.name}", ignore_errors=True)

    def restart(self) -> RcloneMount:
        self.stop()
        return self.start()

    def __enter__(self) -> RcloneMount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
