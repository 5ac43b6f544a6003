"""Issue 48, first step: `[env] mode = "mount"` publishes a squashfs image and a fresh node mounts it.

Real `mksquashfs`, the kernel's squashfs driver on a loop device and overlayfs (root), real `bootseer
exec` and its agent, a job env made by `pip install --target` of two real wheels. The builder
publishes; the tree is then removed (a fresh node never had it) and another node cache starts the job
on the mounted image: it imports from it, writes into it (the write lands in the run's upper
directory, never in the image), and when the launcher ends the agent takes every mount down. A run
killed with its agent leaves its mounts; the next start takes them down. Without a way to mount (no
`mount`, no squashfuse on PATH) the start extracts and says why, and `bootseer doctor` says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.digests import sha256_file
from bootseer_cli.envmount.image import FIELD, FORMAT, image_stack
from bootseer_cli.envmount.mounts import devices_at
from bootseer_cli.store.core import Store

from .conftest import agents_done, bootseer, config, mounted_under, node

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a kernel loop mount)"),
]

JOB = """
import os, sys
root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "site"))
import six, idna
assert six.__file__.startswith(root), six.__file__
with open(os.path.join(root, "site", "late.txt"), "w") as f:
    f.write("late")
with open(os.path.join(root, "site", "six.py"), "a") as f:
    f.write("# touched by the job")
with open("/proc/self/mountinfo") as f:
    mounted = any(line.split()[4] == root for line in f)
print("ok", six.__version__, idna.__version__, open(os.path.join(root, "site", "late.txt")).read(), mounted)
"""


def _job(base: Path, root: Path) -> list[str]:
    script = base / "job.py"
    script.write_text(JOB)
    return [sys.executable, str(script), str(root)]


def _ref(base: Path) -> dict:
    store = Store((base / "store").as_uri())
    [name] = [p.name for p in (base / "store").rglob("refs/env/*.json")]
    return store.read_ref("env", name[: -len(".json")])


def _publish(base: Path, root: Path, wheels: Path, agent: bool = False) -> dict:
    """The builder: set up, capture, publish with the image (before exec without an agent; else the
    agent uploads both while the job runs); the tree then goes."""
    cfg = config(base, root, wheels)
    builder = node(base, "builder")
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], builder, agent=agent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["ok", "1.17.0"] and r.stdout.split()[-1] == "False", r.stdout
    agents_done(builder)
    shutil.rmtree(root)
    return _ref(base)


def test_fresh_node_mounts_the_image_imports_writes_and_unmounts(base: Path, wheels: Path) -> None:
    root = base / "env"
    ref = _publish(base, root, wheels)
    image = ref[FIELD]
    assert image["format"] == FORMAT and image["size"] > 0
    listing = subprocess.run(
        ["unsquashfs", "-l", str(base / "store" / "blobs" / "sha256" / image["digest"][:2] / image["digest"])],
        capture_output=True,
        text=True,
    )
    if listing.returncode != 0:  # the store's blob layout: found by digest anywhere under blobs/
        [blob] = list((base / "store").rglob(image["digest"] + "*"))
        listing = subprocess.run(["unsquashfs", "-l", str(blob)], capture_output=True, text=True)
    assert f"{str(root).lstrip('/')}/site/six.py" in listing.stdout, listing.stdout[-2000:]
    assert ".bootseer-env" not in listing.stdout
    nd = node(base, "fresh")
    cfg = base / "bootseer-mount.toml"
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "1.17.0", "3.20", "late", "True"], r.stdout + r.stderr
    assert "mounted image" in r.stderr and "kernel squashfs" in r.stderr, r.stderr
    agents_done(nd)
    assert mounted_under(str(base)) == [], "the mounts outlived the launcher"
    left = [n for n in os.listdir(root) if not n.startswith(".bootseer-env")]  # the tree lock's file may stay
    assert left == [], "what the job wrote went into the tree, not the run's upper directory"
    [cached] = [p for p in Path(nd["XDG_CACHE_HOME"]).rglob(image["digest"]) if "sha256" in p.parts]
    assert sha256_file(cached) == image["digest"]  # the job's write never reached the image
    assert not list((Path(nd["XDG_CACHE_HOME"]) / "bootseer" / "env-mount").iterdir())
    # The cached image is trusted by its identity once verified; a copy changed since is hashed again,
    # dropped, and fetched anew before it is mounted.
    data = bytearray(cached.read_bytes())  # a copy of its own: a local store's blob is linked into the cache
    data[image["size"] // 2 : image["size"] // 2 + 4096] = b"\0" * 4096
    bad = cached.with_name("bad")
    bad.write_bytes(data)
    os.replace(bad, cached)
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr
    assert "from store" in r.stderr, r.stderr
    agents_done(nd)
    assert sha256_file(cached) == image["digest"]


def test_the_agent_uploads_the_image_with_the_snapshot(base: Path, wheels: Path) -> None:
    root = base / "env"
    ref = _publish(base, root, wheels, agent=True)
    assert ref[FIELD]["format"] == FORMAT
    builder_cache = Path(node(base, "builder")["XDG_CACHE_HOME"])
    assert not list((builder_cache / "bootseer").rglob(f"pending/*{ref[FIELD]['digest']}*")), "left pending"
    nd = node(base, "fresh")
    r = bootseer(["exec", "--config", str(base / "bootseer-mount.toml"), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr
    agents_done(nd)
    assert mounted_under(str(base)) == []


def test_a_killed_runs_mounts_are_taken_down_by_the_next_start(base: Path, wheels: Path) -> None:
    root = base / "env"
    _publish(base, root, wheels)
    nd = node(base, "fresh")
    cfg = base / "bootseer-mount.toml"
    killer = (
        'for i in $(seq 200); do test -e "$BOOTSEER_RUN_DIR/agent.pid" && break; sleep 0.05; done; '
        'kill -9 $(cat "$BOOTSEER_RUN_DIR/agent.pid"); kill -9 $$'
    )
    r = bootseer(["exec", "--config", str(cfg), "--", "/bin/sh", "-c", killer], nd)
    assert r.returncode != 0
    time.sleep(0.5)
    stale = list((Path(nd["XDG_CACHE_HOME"]) / "bootseer" / "env-mount").iterdir())
    assert len(stale) == 1 and str(root) in mounted_under(str(base)), "the killed run left nothing to clean"
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr
    assert not stale[0].exists(), "the dead run's mount directory is still there"
    agents_done(nd)
    assert mounted_under(str(base)) == []


def _bare_path(base: Path) -> str:
    """A PATH with a shell and tar but neither `mount` nor squashfuse (nor fusermount)."""
    d = base / "bin"
    d.mkdir()
    for tool in ("sh", "tar", "zstd", "env", "cat"):
        found = shutil.which(tool)
        if found:
            (d / tool).symlink_to(found)
    return str(d)


def test_without_a_way_to_mount_the_start_extracts_and_says_why(base: Path, wheels: Path) -> None:
    root = base / "env"
    _publish(base, root, wheels)
    nd = node(base, "fresh")
    cfg = base / "bootseer-mount.toml"
    path = _bare_path(base)
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd, path=path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "1.17.0", "3.20", "late", "False"], r.stdout + r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if "not mounted:" in ln]
    assert "squashfuse is not installed" in line and "restored" in line, line
    agents_done(nd)
    d = bootseer(["doctor", "--config", str(cfg)], nd, path=path)
    [mode] = [ln for ln in d.stdout.splitlines() if "env mode" in ln]
    assert "extract only" in mode and "squashfuse" in mode, d.stdout
    d = bootseer(["doctor", "--config", str(cfg)], nd)
    [mode] = [ln for ln in d.stdout.splitlines() if "env mode" in ln]
    assert "mount (kernel" in mode, d.stdout


def test_a_root_holding_files_is_not_hidden_the_env_is_extracted(base: Path, wheels: Path) -> None:
    root = base / "env"
    _publish(base, root, wheels)
    root.mkdir()
    (root / "notes.txt").write_text("mine")
    nd = node(base, "fresh")
    r = bootseer(["exec", "--config", str(base / "bootseer-mount.toml"), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "False", r.stdout + r.stderr
    assert "not mounted:" in r.stderr and "already holds files the image would hide" in r.stderr, r.stderr
    assert (root / "notes.txt").read_text() == "mine"
    agents_done(nd)


def test_an_empty_mount_point_takes_the_overlay(base: Path, wheels: Path) -> None:
    """A root that is an empty mount point (a container's volume; each trainer node of the benchmarks binds
    its own venv directory at the root) hides nothing: the image is mounted over it (before: "already a
    mount point", the env extracted), and once the job ended the mount below is as it was, still empty."""
    root = base / "env"
    _publish(base, root, wheels)
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "bootseer-test", str(root)], check=True)
    try:
        below = devices_at(str(root))
        nd = node(base, "fresh")
        r = bootseer(["exec", "--config", str(base / "bootseer-mount.toml"), "--", *_job(base, root)], nd)
        assert r.returncode == 0 and r.stdout.split()[:2] == ["ok", "1.17.0"], r.stdout + r.stderr
        assert "mounted image" in r.stderr and "not mounted:" not in r.stderr, r.stderr
        agents_done(nd)
        assert devices_at(str(root)) == below and list(root.iterdir()) == []  # the job's writes: its upper dir
    finally:
        subprocess.run(["umount", str(root)], capture_output=True)


def test_the_ref_of_extract_mode_names_no_image(base: Path, wheels: Path) -> None:
    root = base / "env"
    cfg = config(base, root, wheels, mode="extract")
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], node(base, "builder"), agent=False)
    assert r.returncode == 0, r.stderr
    assert FIELD not in _ref(base)
    assert json.dumps(_ref(base))  # a plain document


def test_the_image_waits_in_the_pending_area_publish_sweeps() -> None:
    from bootseer_cli.envmount import image
    from bootseer_cli.envsnap import publish

    assert image.PENDING_DIR == publish.PENDING_DIR


def test_a_squashed_chain_keeps_its_image(base: Path, wheels: Path) -> None:
    """A layer at `[env] max_layers` is squashed under the same key: the new ref still names the images
    (before: the squash's ref dropped them, and every mount-mode node extracted from then on): the
    layer's own image over its parent's (test_layer_images.py), which a fresh node mounts."""
    root = base / "env"
    _publish(base, root, wheels)
    cfg = config(base, root, wheels)
    setup = cfg.read_text().split("setup = [")[1].rstrip().rstrip("]")
    cfg.write_text(
        cfg.read_text().replace(
            f"setup = [{setup}]", f'max_layers = 1\nsetup = [{setup}, "echo more > {root}/more.txt"]'
        )
    )
    builder = node(base, "builder")
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], builder, agent=False)
    assert r.returncode == 0, r.stderr
    assert "squashed" in r.stderr or "layer" in r.stderr, r.stderr
    refs = [
        Store((base / "store").as_uri()).read_ref("env", p.name[:-5]) for p in (base / "store").rglob("refs/env/*.json")
    ]
    [squashed] = [ref for ref in refs if ref.get("squashed")]
    [parent] = [ref for ref in refs if not ref.get("squashed")]
    stack = image_stack(squashed)
    assert squashed.get("depth") == 0 and stack is not None and len(stack) == 2, squashed
    assert stack[1][0] == parent[FIELD]["digest"] and parent[FIELD]["format"] == FORMAT
    shutil.rmtree(root)
    nd = node(base, "fresh")
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True" and "2 images" in r.stderr, r.stdout + r.stderr
    agents_done(nd)


def test_two_runs_on_one_root_stack_and_each_takes_down_only_its_own(base: Path, wheels: Path) -> None:
    """A second job on the node while the first runs: its overlay stacks over the first's (before: the
    root was "already a mount point" and the env was extracted into the first run's overlay, to vanish
    when that run ended). The first run ends first: its covered overlay stays recorded, the second's
    comes down with it, and the next start sweeps what is left."""
    root = base / "env"
    _publish(base, root, wheels)
    nd = node(base, "fresh")
    cfg = str(base / "bootseer-mount.toml")
    gate = base / "gate"
    hold = f'{_job(base, root)[0]} {_job(base, root)[1]} {root} && while [ ! -e "$0" ]; do sleep 0.1; done'

    def start(flag: Path) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
        env.update({**nd, "BOOTSEER_EXEC_AGENT": "1"})
        argv = [sys.executable, "-m", "bootseer_cli", "exec", "--config", cfg, "--", "/bin/sh", "-c", hold, str(flag)]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = start(gate / "1")
    gate.mkdir()
    second = None
    try:
        runs = Path(nd["XDG_CACHE_HOME"]) / "bootseer" / "env-mount"
        deadline = time.time() + 120
        while len(mounted_under(str(root))) < 1 and time.time() < deadline:
            time.sleep(0.1)
        second = start(gate / "2")
        while mounted_under(str(root)).count(str(root)) < 2 and time.time() < deadline:
            time.sleep(0.1)
        assert mounted_under(str(root)).count(str(root)) == 2, "the second run did not stack its overlay"
        stacked = devices_at(str(root))
        (gate / "1").touch()
        out1, err1 = first.communicate(timeout=120)
        assert first.returncode == 0 and out1.split()[-1] == "True", out1 + err1
        logs = Path(nd["XDG_CACHE_HOME"]) / "bootseer" / "runs"
        while sum("agent done" in p.read_text() for p in logs.glob("*/agent.log")) < 1 and time.time() < deadline:
            time.sleep(0.1)
        assert devices_at(str(root)) == stacked, "the first run took down the second run's view"
        (gate / "2").touch()
        out2, err2 = second.communicate(timeout=120)
        assert second.returncode == 0 and out2.split()[-1] == "True", out2 + err2
        assert "not mounted" not in err2, err2
    finally:  # the launchers end whatever failed
        (gate / "1").touch()
        (gate / "2").touch()
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.communicate(timeout=120)
    agents_done(nd)
    assert len(list(runs.iterdir())) == 1  # the first run's covered overlay, kept on record
    r = bootseer(["exec", "--config", cfg, "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr
    agents_done(nd)
    assert mounted_under(str(base)) == [] and not list(runs.iterdir())


def test_the_snapshot_verb_publishes_the_image_too(base: Path, wheels: Path) -> None:
    """`bootseer baseline`, the user's own setup, `bootseer snapshot`: in mount mode the ref names an image,
    which a fresh node mounts (before: the verb published the tar snapshot alone)."""
    root = base / "env"
    cfg = config(base, root, wheels)
    builder = node(base, "builder")
    root.mkdir()
    assert bootseer(["baseline", "--config", str(cfg)], builder, agent=False).returncode == 0
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
    subprocess.run([*pip, "--target", str(root / "site"), "six", "idna"], check=True, capture_output=True)
    r = bootseer(["snapshot", "--config", str(cfg)], builder, agent=False)
    assert r.returncode == 0, r.stderr
    assert _ref(base)[FIELD]["format"] == FORMAT
    shutil.rmtree(root)
    nd = node(base, "fresh")
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr
    agents_done(nd)


def test_the_launcher_starts_before_the_image_is_packed(base: Path, wheels: Path) -> None:
    """Before: the builder's start packed the image (mksquashfs) before exec, so the launcher waited for
    it (53 s for a CPU torch venv at zstd level 15). A capture that is the whole tree is now packed by
    the agent from the pending blob, behind the launcher. Here mksquashfs (a wrapper on PATH around the
    real one) waits until the launcher has started, 60 s at most: before, the build failed and the ref
    named no image; now the ref names it and a fresh node mounts it."""
    root = base / "env"
    started = base / "launcher-started"
    wrappers = base / "bin"
    wrappers.mkdir()
    real = shutil.which("mksquashfs")
    assert real is not None, "mksquashfs is required (apt-get install squashfs-tools)"
    (wrappers / "mksquashfs").write_text(
        f'#!/bin/sh\nfor i in $(seq 600); do [ -e "{started}" ] && exec "{real}" "$@"; sleep 0.1; done\n'
        'echo "the launcher never started" >&2; exit 1\n'
    )
    (wrappers / "mksquashfs").chmod(0o755)
    path = f"{wrappers}:{os.environ['PATH']}"
    cfg = config(base, root, wheels)
    builder = node(base, "builder")
    launcher = ["sh", "-c", f'touch "{started}" && exec "$0" "$@"', *_job(base, root)]
    r = bootseer(["exec", "--config", str(cfg), "--", *launcher], builder, path=path)
    assert r.returncode == 0 and r.stdout.split()[:2] == ["ok", "1.17.0"], r.stdout + r.stderr
    agents_done(builder)
    log = "".join(p.read_text() for p in Path(builder["XDG_CACHE_HOME"]).rglob("agent.log"))
    assert "env image packed" in log, log
    ref = _ref(base)
    assert ref[FIELD]["format"] == FORMAT, ref
    shutil.rmtree(root)
    nd = node(base, "fresh")
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr  # mounted, not extracted
    agents_done(nd)


def test_the_report_says_where_the_env_was_mounted(base: Path, wheels: Path) -> None:
    """Issue 48 item 4: `bootseer report` shows the nodes whose env was mounted, how, and the mount time
    (before: a mounted env read as any restore, with nothing of the mount in the report)."""
    root = base / "env"
    _publish(base, root, wheels)
    nd = node(base, "fresh")
    cfg = base / "bootseer-mount.toml"
    r = bootseer(["exec", "--config", str(cfg), "--", *_job(base, root)], nd)
    assert r.returncode == 0 and r.stdout.split()[-1] == "True", r.stdout + r.stderr
    agents_done(nd)
    text = bootseer(["report", "--config", str(cfg), "--last"], nd)
    assert text.returncode == 0, text.stderr
    [line] = [ln for ln in text.stdout.splitlines() if "env mounted" in ln]
    assert "on 1 of 1 node" in line and "kernel squashfs + kernel overlay" in line and "mount p50" in line, line
    doc = json.loads(bootseer(["report", "--config", str(cfg), "--last", "--json"], nd).stdout)
    assert doc["env_mounted"] == 1 and isinstance(doc["env_mount_p50_s"], float) and doc["env_mount_p50_s"] >= 0, doc
