"""A FUSE filesystem served by a subprocess (rclone mount, s3fs): start it, wait for the mount, and
take it down however the test ends (lazy unmount, then the process). The loaders differ only in their
argv and environment; the lifecycle is this one class."""

from __future__ import annotations

import atexit
import os
import subprocess
import time
from pathlib import Path


def mounted(mountpoint: Path) -> bool:
    real = os.path.realpath(mountpoint)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == real for line in f)


class FuseProcess:
    """Subclasses give `name`, `argv()` and optionally `env()` and `cleanup()`."""

    name = "fuse"

    def __init__(self, mountpoint: Path, workdir: Path) -> None:
        self.mountpoint, self.workdir = mountpoint, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def cleanup(self) -> None:
        """What to remove once the process is gone (a loader's own cache)."""

    def start(self, timeout: float = 20.0) -> FuseProcess:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"{self.name}-{self.mountpoint.name}.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(self.argv(), env=self.env(), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while not mounted(self.mountpoint):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not mount: {log.read_text(errors='replace')[-1500:]}")
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
        self.cleanup()

    def restart(self) -> FuseProcess:
        self.stop()
        return self.start()

    def __enter__(self) -> FuseProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
