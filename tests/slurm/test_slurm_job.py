"""Issue 26: the rendered batch script and prolog in a real Slurm, the job running as a plain user.

The first job sets its env up (the summary line says so), the second restores it from the node cache
the prolog filled as the user; then case 1's attacks, from the user's side: a fan-out directory of
the node cache linked to a directory of root's, a job config that names another store, a tiny cache
bound and `[env] files = ["/dev/zero"]`. Root writes, deletes and hashes nothing of theirs.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slurm.conftest import Slurm

pytestmark = pytest.mark.integration

TRAIN = "import os\nprint('trained on', os.environ.get('SLURM_JOB_ID'), open(os.environ['BS_MARK']).read().strip())\n"


def _job_dir(slurm: Slurm, name: str, toml: str) -> Path:
    job = slurm.world / name
    job.mkdir(mode=0o755)
    (job / "bootseer.toml").write_text(toml)
    (job / "train.py").write_text(TRAIN)
    for p in (job, job / "bootseer.toml", job / "train.py"):
        os.chown(p, slurm.user.uid, slurm.user.gid)
    return job


def _config(job: Path, image: str, extra: str = "") -> str:
    root = job / "envroot"
    setup = f"mkdir -p {root}/lib && echo ready-{image[-6:]} > {root}/lib/mark.txt"
    return f'[image]\nref = "{image}"\n[env]\nsetup = ["{setup}"]\nroots = ["{root}"]\n{extra}'


def _script(slurm: Slurm, job: Path, image: str) -> Path:
    script = job / "train.sbatch"
    slurm.render(
        script,
        "slurm-job.sbatch",
        f"IMAGE={image}",
        f"STORE={slurm.store.as_uri()}",
        "NODES=1",
        "GPUS=1",
        "SRUN_ARGS=",
        "LAUNCH=",
        f"NODE_CACHE={slurm.node_cache}",
        "KEYS_DIR=",  # unsigned on purpose (a configured one without a readable key fails closed)
        f"READ_CREDENTIALS={job}/no-credentials",
        "SCRIPT=train.py",
        "NAME=bootseer-test",
    )  # fmt: skip  (bare metal: pyxis is not packaged)
    text = script.read_text().replace(
        "set -euo pipefail\n", f"set -euo pipefail\nexport BS_MARK={job}/envroot/lib/mark.txt\n", 1
    )
    script.write_text(text)
    os.chown(script, slurm.user.uid, slurm.user.gid)
    return script


def _summary(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("bootseer: image ")]
    assert lines, output[-3000:]
    return lines[-1]


def _fresh_root(job: Path) -> None:
    shutil.rmtree(job / "envroot", ignore_errors=True)  # another node, or a cleaned one


@dataclass
class Published:
    job: Path
    image: str
    script: Path


@pytest.fixture(scope="module")
def published(slurm: Slurm) -> Published:
    """The first job of an image: it sets the env up (the summary line says so) and publishes it."""
    image = f"bootseer-slurm@sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}"
    job = _job_dir(slurm, f"job-{uuid.uuid4().hex[:6]}", "")
    (job / "bootseer.toml").write_text(_config(job, image))
    script = _script(slurm, job, image)
    first = slurm.submit(job, script)
    assert first.state == "COMPLETED", first.output[-3000:]
    line = _summary(first.output)
    assert "setup" in line and "captured" in line, line
    assert "trained on " + first.id in first.output
    return Published(job, image, script)


def test_second_job_restores_from_the_cache_the_prolog_filled(slurm: Slurm, published: Published) -> None:
    job, script = published.job, published.script
    _fresh_root(job)
    cache = slurm.node_cache / slurm.user.name
    shutil.rmtree(cache / "sha256")  # what job 1 left: the blob can only come from the prolog's prefetch
    second = slurm.submit(job, script)
    assert second.state == "COMPLETED", second.output[-3000:]
    line = _summary(second.output)
    assert "restored" in line and "from cache" in line, line  # the prolog had fetched it, as the user
    st = cache.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (slurm.user.uid, 0o700)
    owners = {p.stat().st_uid for p in cache.rglob("*") if not p.is_symlink()}
    assert owners == {slurm.user.uid}, owners  # nothing root-owned in the user's cache


def _victim(slurm: Slurm) -> Path:
    """A directory of root's the user can name but not write: /etc/cron.d, in the issue."""
    victim = slurm.world / f"victim-{uuid.uuid4().hex[:6]}"
    victim.mkdir(mode=0o755)
    for name in ("crontab", "b" * 64):
        (victim / name).write_text("root's\n")
        os.utime(victim / name, (1, 1))  # older than any blob: first in line for an eviction
    return victim


def test_attacks_from_the_job_user_do_not_steer_root(slurm: Slurm, published: Published) -> None:
    """A linked fan-out dir, a job config naming its own store and a tiny bound: the job still starts,
    and nothing of root's is written or deleted (the prolog acts as the user, no-follow)."""
    job, image, script = published.job, published.image, published.script
    victim = _victim(slurm)
    cache = slurm.node_cache / slurm.user.name
    fans = sorted(p.name for p in (cache / "sha256").iterdir())
    assert fans  # the env blob (and the hot record), from the jobs before
    for fan in fans:  # the user swaps each fan-out dir for a link to root's directory
        r = slurm.user.run("sh", "-c", f'rm -rf "{cache}/sha256/{fan}" && ln -s "{victim}" "{cache}/sha256/{fan}"')
        assert r.returncode == 0, r.stderr
    evil = slurm.world / f"evil-{uuid.uuid4().hex[:6]}"
    steer = f'[store]\nuri = "{evil.as_uri()}"\ncache_max_gb = 0.00000001\n'
    (job / "bootseer.toml").write_text(_config(job, image, steer))  # the same env key: only [store] added
    _fresh_root(job)
    second = slurm.submit(job, script)
    assert second.state == "COMPLETED", second.output[-3000:]  # the job still starts
    assert "trained on " + second.id in second.output
    assert sorted(p.name for p in victim.iterdir()) == sorted(["crontab", "b" * 64])  # nothing written, nothing gone
    assert all(p.stat().st_uid == 0 and p.read_text() == "root's\n" for p in victim.iterdir())
    assert not evil.exists()  # the site's store, not the job's


def test_env_files_naming_dev_zero_do_not_hold_the_node(slurm: Slurm) -> None:
    """`[env] files = ["/dev/zero"]` once kept the root prolog hashing until its timeout (90 s here)."""
    image = f"bootseer-slurm@sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}"
    job = _job_dir(slurm, f"job-{uuid.uuid4().hex[:6]}", "")
    (job / "bootseer.toml").write_text(_config(job, image, 'files = ["/dev/zero"]\n'))
    script = _script(slurm, job, image)
    ran = slurm.submit(job, script, timeout_s=80)
    assert ran.took_s < 60, f"{ran.took_s:.0f} s"
    assert "not a regular file" in ran.output, ran.output[-3000:]  # one line from the job's own bootseer
