"""A store that answers the manifest, then stops sending the stripes (a hung proxy, an overloaded server).

Each ranged read waited the S3 client's low-speed timeout (60 s) per attempt, three attempts, and the
reader retried that four times: `ckpt pull`, the checkpoint stage before exec and a read through the
mount waited minutes. Each now gives up in about `storeguard.STALL_S`."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store
from bootseer_cli.store.guard import STALL_S
from bootseer_cli.stripe.mount import mount_detached
from bootseer_cli.stripe.push import push
from tests.support.s3server import S3Server
from tests.support.silentendpoint import StallingProxy

from .conftest import write_random

pytestmark = pytest.mark.integration

BIG_CELL = 1 << 20  # far over the proxy's 64 kB per connection: the first ranged read stalls
IN_TIME_S = STALL_S + 25  # the deadline, plus room for a loaded 2-core machine; before: 13 min (802 s)
READ = "import sys\ntry:\n    open(sys.argv[1], 'rb').read()\nexcept OSError as e:\n    print(e.errno)\n"


def _cli(*args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bootseer_cli", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_pull_stage_and_mount_give_up_a_store_that_stops_sending_stripes_in_time(
    s3_server: S3Server, tmp_path: Path, mounts: Path
) -> None:
    proxy = StallingProxy(("127.0.0.1", s3_server.port))
    try:
        uri = f"s3://{s3_server.bucket}/t-{os.urandom(6).hex()}?endpoint_override=127.0.0.1:{proxy.port}&scheme=http"
        write_random(tmp_path / "src" / "w" / "f.bin", 4 * BIG_CELL + 5, 1)
        m = push(Store(uri), tmp_path / "src", "job", "t1", stripes=2, cell_size=BIG_CELL)
        proxy.stall()  # from here on, every new connection's response stops after 64 kB
        mount_detached(m, mounts / "m", uri)
        cfg = tmp_path / "bootseer.toml"
        cfg.write_text(
            f'[store]\nuri = "{uri}"\n\n[checkpoint]\nname = "job"\nmountpoint = "{mounts / "ck"}"\nmode = "pull"\n'
        )
        t0 = time.monotonic()
        procs = {
            "pull": _cli("ckpt", "pull", "job:t1", str(tmp_path / "dst"), "--store", uri),
            "exec": _cli("exec", "--config", str(cfg), "--", sys.executable, "-c", "print('started')"),
            "mount": subprocess.Popen(
                [sys.executable, "-c", READ, str(mounts / "m" / "w" / "f.bin")], stdout=subprocess.PIPE, text=True
            ),
        }
        out: dict[str, tuple[int, str, str, float]] = {}
        for name, p in procs.items():
            try:
                stdout, stderr = p.communicate(timeout=max(1.0, IN_TIME_S - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                for q in procs.values():
                    q.kill()
                pytest.fail(f"{name} still waiting for the store after {IN_TIME_S:g} s")
            out[name] = (p.returncode, stdout, stderr or "", time.monotonic() - t0)
    finally:
        proxy.close()

    rc, stdout, stderr, _ = out["pull"]
    assert rc == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith("bootseer: error: ") and f"sent nothing for {STALL_S:g} s" in stderr, stderr
    assert not (tmp_path / "dst").exists()

    rc, stdout, stderr, _ = out["exec"]
    assert rc == 0 and stdout.strip() == "started", stderr
    assert "checkpoint" in stderr and f"sent nothing for {STALL_S:g} s" in stderr, stderr

    rc, stdout, _, took = out["mount"]
    assert stdout.strip() == str(errno.EIO)  # an I/O error for the program, never wrong bytes
    assert took >= STALL_S - 1  # the read did wait out the deadline (the cap, not something else, ended it)
