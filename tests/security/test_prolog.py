"""Issue 26 case 1, in the Slurm prolog itself (run as root, as slurmd runs it; no cluster needed).

The prefetch acts for the job's user as that user (`setpriv` to SLURM_JOB_UID/GID) with the site's
settings and none of its secrets; root only makes the user's cache directory, and refuses one that
is a link or someone else's; a job config naming /dev/zero does not hold the prolog.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.plainuser import PlainUser, plain_user, user_bin, world_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROLOG = REPO / "hooks" / "slurm-prolog.sh"


@pytest.fixture(scope="module")
def user() -> PlainUser:
    return plain_user()


@pytest.fixture
def world() -> Iterator[Path]:
    with world_dir() as d:
        yield d


def _job(world: Path, user: PlainUser, toml: str) -> Path:
    job = world / "job"
    job.mkdir()
    (job / "bootseer.toml").write_text(toml)
    os.chown(job, user.uid, user.gid)
    os.chown(job / "bootseer.toml", user.uid, user.gid)
    return job


def _site(world: Path, lines: str) -> Path:
    site = world / "prolog.env"
    site.write_text(lines)
    site.chmod(0o600)
    return site


def _prolog(user: PlainUser, site: Path, job: Path, path: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": path, "BOOTSEER_PROLOG_ENV": str(site), "BOOTSEER_CONFIG": str(job / "bootseer.toml"),
        "SLURM_JOB_ID": "26", "SLURM_JOB_USER": user.name, "SLURM_JOB_UID": str(user.uid),
        "SLURM_JOB_GID": str(user.gid), **extra,
    }  # fmt: skip
    return subprocess.run(["sh", str(PROLOG)], env=env, capture_output=True, text=True, timeout=300, cwd="/")


def _probe(world: Path) -> tuple[Path, Path]:
    """A `bootseer` that records who ran it, where, and with what environment (then exits 0)."""
    bin_dir, out = world / "probe-bin", world / "probe-out"
    bin_dir.mkdir(mode=0o755)
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    (bin_dir / "bootseer").write_text(f"#!/bin/sh\nid -u > {out}/uid\npwd > {out}/cwd\nenv > {out}/env\n")
    (bin_dir / "bootseer").chmod(0o755)
    return bin_dir, out


def test_prefetch_runs_as_the_job_user_with_the_site_store_and_no_secrets(user: PlainUser, world: Path) -> None:
    bin_dir, out = _probe(world)
    node_cache = world / "nc"
    site = _site(
        world,
        "BOOTSEER_STORE=s3://b/p?endpoint_override=10.0.0.1:9000&scheme=http\n"  # literal: `&` keeps the rest
        "AWS_ACCESS_KEY_ID=AKIAWRITE\nAWS_SECRET_ACCESS_KEY=write-secret\n"
        "BOOTSEER_TRUST_SIGNING_KEY=/etc/bootseer/domain.key\n"
        f"BOOTSEER_NODE_CACHE={node_cache}\nBOOTSEER_STORE_CACHE_MAX_GB=5\n",
    )
    job = _job(world, user, '[store]\nuri = "file:///tmp/evil"\ncache_max_gb = 0.00000001\n')
    r = _prolog(user, site, job, f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    assert (out / "uid").read_text().strip() == str(user.uid)  # dropped before anything ran for the job
    assert (out / "cwd").read_text().strip() == "/"
    env = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines() if "=" in line)
    assert env["BOOTSEER_STORE"] == "s3://b/p?endpoint_override=10.0.0.1:9000&scheme=http"
    assert env["BOOTSEER_STORE_CACHE_MAX_GB"] == "5"  # the site's bound wins over the job's (env over file)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "BOOTSEER_TRUST_SIGNING_KEY"} & set(env)
    assert "write-secret" not in (out / "env").read_text()
    st = (node_cache / user.name).stat()
    assert (st.st_uid, st.st_mode & 0o777) == (user.uid, 0o700)


def test_a_linked_or_foreign_cache_directory_is_refused(user: PlainUser, world: Path) -> None:
    bin_dir, out = _probe(world)
    node_cache = world / "nc"
    node_cache.mkdir()
    victim = world / "victim"  # root's: what a link would hand over
    victim.mkdir()
    (victim / "keep").write_text("root's\n")
    site = _site(world, f"BOOTSEER_STORE=file:///nonexistent\nBOOTSEER_NODE_CACHE={node_cache}\n")
    job = _job(world, user, "")
    (node_cache / user.name).symlink_to(victim)
    r = _prolog(user, site, job, f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0 and "is a symlink: refused" in r.stderr
    assert not (out / "uid").exists()
    st = victim.stat()
    assert st.st_uid == 0 and [p.name for p in victim.iterdir()] == ["keep"]

    (node_cache / user.name).unlink()
    (node_cache / user.name).mkdir()  # root's (another owner's) directory: not the user's to fill
    r = _prolog(user, site, job, f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0 and "refused" in r.stderr and not (out / "uid").exists()


def test_a_site_file_not_owned_by_root_is_ignored(user: PlainUser, world: Path) -> None:
    bin_dir, out = _probe(world)
    site = _site(world, "BOOTSEER_STORE=file:///from-the-user\n")
    os.chown(site, user.uid, user.gid)
    job = _job(world, user, "")
    r = _prolog(user, site, job, f"{bin_dir}:/usr/bin:/bin", BOOTSEER_NODE_CACHE=str(world / "nc"))
    assert r.returncode == 0 and "not owned by uid 0: ignored" in r.stderr
    assert "from-the-user" not in (out / "env").read_text()


def test_env_files_naming_dev_zero_do_not_hold_the_prolog(user: PlainUser, world: Path) -> None:
    """`[env] files = ["/dev/zero"]` once kept root hashing until the prolog's timeout."""
    bin_dir = user_bin(user, world)
    store = world / "store"
    store.mkdir()
    os.chown(store, user.uid, user.gid)
    site = _site(world, f"BOOTSEER_STORE={store.as_uri()}\nBOOTSEER_NODE_CACHE={world / 'nc'}\n")
    toml = '[image]\nref = "x@sha256:' + "a" * 64 + '"\n[env]\nsetup = ["true"]\nfiles = ["/dev/zero"]\n'
    job = _job(world, user, toml)
    t0 = time.monotonic()
    r = _prolog(user, site, job, f"{bin_dir}:/usr/bin:/bin", BOOTSEER_PREFETCH_TIMEOUT="120")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert took < 60, f"the prolog took {took:.0f} s: {r.stderr[-1000:]}"
    assert "prefetch ended with status" in r.stderr and "not a regular file" in r.stderr


def test_a_site_store_uri_with_credentials_is_never_handed_to_the_user(user: PlainUser, world: Path) -> None:
    """A secret inside the site's store URI would reach the user's process and `env`'s argv: nothing runs."""
    bin_dir, out = _probe(world)
    site = _site(
        world,
        "BOOTSEER_STORE=s3://AKIAWRITE:write-secret@b/p?endpoint_override=10.0.0.1:9000\n"
        "BOOTSEER_EXEC_AGENT=s3://b/p?secret_key=other-secret\n"
        f"BOOTSEER_NODE_CACHE={world / 'nc'}\n",
    )
    job = _job(world, user, "")
    r = _prolog(user, site, job, f"{bin_dir}:/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    assert not (out / "env").exists(), "the prefetch ran with the site's secret"
    assert "BOOTSEER_STORE carries credentials" in r.stderr
    assert "write-secret" not in r.stderr and "other-secret" not in r.stderr


@pytest.mark.parametrize(("mode", "p2p"), [("mount", False), ("pull", False), ("pull", True)])
def test_only_stripes_the_start_reads_from_the_cache_are_prefetched(world: Path, mode: str, p2p: bool) -> None:
    """Issue 46 finding 8: a mount reads its stripes from the store, never the node cache, so the prolog
    fetching them filled the cache for nothing; so does a pull without the swarm. A pull with `[p2p]
    enabled` fetches whole stripes through the cache: those are prefetched. The job's user is root
    here: the plain user cannot open /dev/fuse on this machine, and a node that cannot mount pulls."""
    from bootseer_cli.store.cache import BlobCache
    from bootseer_cli.store.core import Store
    from bootseer_cli.stripe.push import push
    from bootseer_cli.stripe.stage import fuse_missing

    if fuse_missing():
        pytest.skip(f"no FUSE here: {fuse_missing()}")
    root = PlainUser("root", 0, 0, "/root")
    store = Store((world / "store").as_uri())
    src = world / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(300 << 10))
    m = push(store, src, "m", "v1", stripes=2, cell_size=64 << 10)
    node_cache = world / "nc"
    site = _site(world, f"BOOTSEER_STORE={store.uri}\nBOOTSEER_NODE_CACHE={node_cache}\n")
    toml = f'[image]\nref = "x@sha256:{"a" * 64}"\n[checkpoint]\nname = "m"\nmode = "{mode}"\n'
    toml += "[p2p]\nenabled = true\n" if p2p else ""
    job = _job(world, root, toml)
    r = _prolog(root, site, job, f"{user_bin(root, world)}:/usr/bin:/bin", SLURM_JOB_USER="root")
    assert r.returncode == 0, r.stderr
    assert "prefetch ended with status" not in r.stderr, r.stdout + r.stderr
    cache = BlobCache(node_cache / "root", 1 << 30)
    cached = [s.digest for s in m.stripes if cache.get(s.digest) is not None]
    if not p2p:
        assert cached == [], r.stdout
        assert "checkpoint skipped" in r.stdout and "not the node cache" in r.stdout, r.stdout
    else:
        assert cached == [s.digest for s in m.stripes], r.stdout + r.stderr
