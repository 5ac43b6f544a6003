"""A real one-node Slurm cluster (munge, slurmctld, slurmd) for the prolog and batch-template tests.

`tests/slurm/cluster.sh` starts it (idempotent; `.ci/run` installs slurm-wlm and munge). The
cluster's `Prolog` is the rendered `slurm-prolog.sh` at /etc/slurm/prolog.d/bootseer.sh, with the
site's settings in /etc/bootseer/prolog.env (root 0600; any earlier file is put back after), as the
README installs them. Jobs are submitted as the plain user `bsuser`. Outside CI a machine without
Slurm or root skips these tests; in CI that is a failure (a skip fails CI), so it fails here at once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm.plainuser import PlainUser, plain_user, user_bin, world_dir

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "cluster.sh"
PROLOG_AT = Path("/etc/slurm/prolog.d/bootseer.sh")
SITE_AT = Path("/etc/bootseer/prolog.env")
JOB_DEADLINE_S = 120.0
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing() -> str:
    if os.geteuid() != 0:
        return "the Slurm tests need root (slurmd and the prolog run as root)"
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "setpriv", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install slurm-wlm munge; .ci/run does)"
    return ""


@dataclass
class Job:
    id: str
    state: str
    exit_code: str
    output: str
    took_s: float


@dataclass
class Slurm:
    user: PlainUser
    world: Path
    bin_dir: Path
    store: Path
    node_cache: Path

    def render(self, dest: Path, template: str, *sets: str) -> None:
        args = [str(self.bin_dir / "bootseer"), "init", str(dest), "--force", "--template", template]
        for s in sets:
            args += ["--set", s]
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr

    def submit(self, job_dir: Path, script: Path, timeout_s: float = JOB_DEADLINE_S) -> Job:
        """sbatch `script` as the plain user from `job_dir` and wait for it to end (GPUs: none here)."""
        u = self.user
        path = f"PATH={self.bin_dir}:/usr/local/bin:/usr/bin:/bin"
        env = ["env", "-i", path, f"HOME={u.home}", f"USER={u.name}", f"LOGNAME={u.name}", "LANG=C.UTF-8"]
        out = job_dir / "out-%j.txt"
        t0 = time.monotonic()
        argv = ["sbatch", "--parsable", "--gpus-per-node=0", f"--chdir={job_dir}", f"--output={out}", str(script)]
        r = self.user.run(*env, *argv, cwd=str(job_dir), timeout=60)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip().split(";")[0]
        deadline = t0 + timeout_s
        state = exit_code = ""
        while time.monotonic() < deadline:
            show = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
            state = _field(show.stdout, "JobState")
            exit_code = _field(show.stdout, "ExitCode")
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                break
            time.sleep(0.5)
        else:
            subprocess.run(["scancel", job_id], capture_output=True)
            raise AssertionError(f"job {job_id} still {state} after {timeout_s:.0f} s")
        took = time.monotonic() - t0
        path = job_dir / f"out-{job_id}.txt"
        text = path.read_text(errors="replace") if path.exists() else ""
        return Job(job_id, state, exit_code, text, took)


def _field(line: str, name: str) -> str:
    m = re.search(rf"\b{name}=(\S+)", line)
    return m.group(1) if m else ""


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    why = _missing()
    if why:
        if IN_CI:
            pytest.fail(f"Slurm tests cannot run in CI: {why}")
        pytest.skip(why)
    user = plain_user()
    was_running = subprocess.run(["sh", str(CLUSTER), "status"], capture_output=True).returncode == 0
    with world_dir("bootseer-slurm-") as world:
        bin_dir = user_bin(user, world)
        store, node_cache = world / "store", world / "node-cache"
        store.mkdir()
        os.chown(store, user.uid, user.gid)  # a store the job's agent may publish to (no write credentials)
        node_cache.mkdir(mode=0o755)
        s = Slurm(user, world, bin_dir, store, node_cache)
        PROLOG_AT.parent.mkdir(parents=True, exist_ok=True)
        s.render(PROLOG_AT, "slurm-prolog.sh")
        SITE_AT.parent.mkdir(parents=True, exist_ok=True)
        before = SITE_AT.read_bytes() if SITE_AT.exists() else None
        # The site's settings (literal KEY=VALUE): the store, the node cache, where bootseer is, and a
        # write credential that must never reach the user's prefetch.
        SITE_AT.write_text(
            f"BOOTSEER_STORE={store.as_uri()}\nBOOTSEER_NODE_CACHE={node_cache}\n"
            f"PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\nBOOTSEER_PREFETCH_TIMEOUT=90\n"
            f"AWS_SECRET_ACCESS_KEY=site-write-secret-{uuid.uuid4().hex[:6]}\n"
        )
        SITE_AT.chmod(0o600)
        try:
            r = subprocess.run(
                ["sh", str(CLUSTER), "start", str(PROLOG_AT)], capture_output=True, text=True, timeout=120
            )
            assert r.returncode == 0, f"the Slurm cluster did not start: {r.stderr[-3000:]}"
            yield s
        finally:
            if before is None:
                SITE_AT.unlink(missing_ok=True)
            else:
                SITE_AT.write_bytes(before)
            if not was_running:
                subprocess.run(["sh", str(CLUSTER), "stop"], capture_output=True, timeout=60)
