"""Issue 29 item 10, the smaller items: `ckpt mount` refuses to stack on a mount or to hide a non-empty
directory; `--json` on restore, baseline, ckpt pull/mount/umount/rm and env rm; shell completion of
template names and checkpoint refs (never hanging on a store that does not answer)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.envsnap.test_cli import SITE, make_base, project
from tests.support import pkgindex

pytestmark = pytest.mark.integration


def _env(tmp_path: Path, store: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in pkgindex.clean_env().items() if not k.startswith(("BOOTSEER_", "_BOOTSEER"))}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "cache"), "BOOTSEER_EXEC_AGENT": "0", **extra})
    env["BOOTSEER_STORE"] = store or (tmp_path / "store").as_uri()
    return env


def bs(tmp_path: Path, *args: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    # the console script: completion keys its variable on the program's name (_BOOTSEER_COMPLETE)
    return subprocess.run(
        [str(Path(sys.executable).parent / "bootseer"), *args],
        cwd=cwd or tmp_path,
        env=_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def ckpt(tmp_path: Path) -> Iterator[str]:
    """A small checkpoint m:t1 in a local store; whatever the test mounted is unmounted at the end."""
    d = tmp_path / "ck"
    d.mkdir()
    (d / "weights.bin").write_bytes(os.urandom(100_000))
    r = bs(tmp_path, "ckpt", "push", str(d), "-n", "m", "-t", "t1")
    assert r.returncode == 0, r.stderr
    yield "m:t1"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4]
        if mp.startswith(str(tmp_path)):
            subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True)


def test_ckpt_mount_refuses_a_second_mount_on_a_mounted_path(tmp_path: Path, ckpt: str) -> None:
    mp = tmp_path / "mp"
    first = bs(tmp_path, "ckpt", "mount", ckpt, str(mp), "--json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["mountpoint"] == str(mp) and doc["name"] == "m" and doc["tag"] == "t1" and doc["pid"] > 0
    again = bs(tmp_path, "ckpt", "mount", ckpt, str(mp))
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert again.stderr.strip() == (
        f"bootseer: error: {mp} already holds the checkpoint mount bootseer:m:t1; "
        f"not mounting over it (`bootseer ckpt umount {mp}` first)"
    )
    mounts = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if f" {mp} " in ln]
    assert len(mounts) == 1, mounts
    assert (mp / "weights.bin").stat().st_size == 100_000
    off = bs(tmp_path, "ckpt", "umount", str(mp), "--json")
    assert off.returncode == 0 and json.loads(off.stdout) == {"unmounted": str(mp)}, off.stderr


def test_ckpt_mount_refuses_to_hide_a_non_empty_directory(tmp_path: Path, ckpt: str) -> None:
    mp = tmp_path / "busy"
    mp.mkdir()
    (mp / "notes.txt").write_text("mine\n")
    r = bs(tmp_path, "ckpt", "mount", ckpt, str(mp))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{mp} is not empty (1 entry): the mount would hide them" in r.stderr and "--force" in r.stderr
    assert not any(f" {mp} " in ln for ln in Path("/proc/self/mountinfo").read_text().splitlines())
    forced = bs(tmp_path, "ckpt", "mount", ckpt, str(mp), "--force")
    assert forced.returncode == 0, forced.stderr
    assert sorted(os.listdir(mp)) == ["weights.bin"]
    assert bs(tmp_path, "ckpt", "umount", str(mp)).returncode == 0
    assert (mp / "notes.txt").read_text() == "mine\n"


def test_ckpt_pull_and_rm_json(tmp_path: Path, ckpt: str) -> None:
    r = bs(tmp_path, "ckpt", "pull", ckpt, str(tmp_path / "out"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dest"] == str(tmp_path / "out") and doc["bytes"] == 100_000 and doc["skipped"] is False
    assert doc["bytes_from_store"] == 100_000 and doc["bytes_from_peers"] == 0
    r = bs(tmp_path, "ckpt", "rm", ckpt, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["removed"] == "m:t1" and doc["stripe_objects_deleted"] > 0
    assert "m:t1" not in bs(tmp_path, "ckpt", "ls").stdout


def test_restore_baseline_and_env_rm_json(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    root = project(tmp_path, store)
    miss = bs(tmp_path, "restore", "--json", store=store)
    assert miss.returncode == 3, miss.stderr
    key = json.loads(miss.stdout)["env_key"]
    assert json.loads(miss.stdout) == {"env_key": key, "outcome": "miss"}

    base = bs(tmp_path, "baseline", "--json", store=store)
    assert base.returncode == 0, base.stderr
    doc = json.loads(base.stdout)
    assert doc["roots"] == [str(root)] and doc["entries"] > 0 and doc["carried"] is None
    subprocess.run(["sh", "setup.sh"], cwd=tmp_path, check=True)
    assert bs(tmp_path, "snapshot", store=store).returncode == 0

    make_base(root)
    hit = bs(tmp_path, "restore", "--json", store=store)
    assert hit.returncode == 0, hit.stderr
    doc = json.loads(hit.stdout)
    assert doc["outcome"] == "restored" and doc["env_key"] == key and doc["files"] == 3, doc
    assert doc["unpacked_bytes"] > 0 and doc["source"] and doc["blob"]
    assert (root / SITE / "pkg_b" / "__init__.py").exists()
    present = bs(tmp_path, "restore", "--json", store=store)
    assert json.loads(present.stdout) == {"env_key": key, "outcome": "present"}

    rm = bs(tmp_path, "env", "rm", key[:12], "--json", store=store)
    assert rm.returncode == 0, rm.stderr
    assert json.loads(rm.stdout) == {"removed": [key]}


def _complete(tmp_path: Path, words: str, **extra: str) -> tuple[list[str], float]:
    """What bash completion offers for the last word of `words` (typer's complete_bash protocol)."""
    parts = words.split(" ")
    t0 = time.monotonic()
    r = bs(tmp_path, _BOOTSEER_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1), **extra)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout.split(), time.monotonic() - t0


def test_completion_offers_template_names(tmp_path: Path) -> None:
    offered, _ = _complete(tmp_path, "bootseer init --template k8s")
    assert offered == ["k8s-job.yaml", "k8s-init.sh"] or sorted(offered) == ["k8s-init.sh", "k8s-job.yaml"]
    offered, _ = _complete(tmp_path, "bootseer init --template ")
    assert "Dockerfile.bootseer" in offered and "slurm-prolog.sh" in offered


def test_completion_offers_checkpoint_refs(tmp_path: Path, ckpt: str) -> None:
    for verb in ("pull", "mount", "rm"):
        offered, _ = _complete(tmp_path, f"bootseer ckpt {verb} ")
        assert offered == ["m:latest", "m:t1"], (verb, offered)
    offered, _ = _complete(tmp_path, "bootseer ckpt pull m:t")
    assert offered == ["m:t1"]


def test_completion_does_not_hang_on_a_store_that_does_not_answer(tmp_path: Path) -> None:
    """A listener that accepts and never answers: completion gives up within its deadline."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        port = srv.getsockname()[1]
        store = f"s3://b/x?endpoint_override=http://127.0.0.1:{port}&scheme=http"
        offered, took = _complete(tmp_path, "bootseer ckpt pull ", BOOTSEER_STORE=store, AWS_ACCESS_KEY_ID="k")
    assert offered == [] and took < 10, (offered, took)
