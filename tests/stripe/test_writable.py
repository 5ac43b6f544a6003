"""Issue 44 item 2: the checkpoint directory is a trainer's `out_dir`: it resumes from it and saves into it.

Real `torch.save`/`torch.load`, the real FUSE mount and overlay, real `bootseer exec` and its agent.
A "node" is its own cache root (XDG_CACHE_HOME) and runtime directory (XDG_RUNTIME_DIR); the store is
shared. What the job saves is pushed by the agent as a new tag behind it, `latest` names that tag,
and a fresh node resumes from it. Nothing the job wrote is deleted by bootseer, in either mode.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store
from bootseer_cli.stripe.catalog import load_manifest
from bootseer_cli.stripe.mount import mount_info

from .conftest import CELL, file_store, run_cli, wait_until

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

# A trainer in the manner of nanoGPT/HF: resume from out_dir/ckpt.pt, save the next step over it and
# into a new checkpoint-N/, read its save back, and read a restored file it did not touch.
TRAINER = """
import os, signal, sys, time, torch
d = os.environ["BOOTSEER_CKPT_DIR"]
ck = torch.load(os.path.join(d, "ckpt.pt"))
step = ck["step"] + 1
torch.save({"step": step, "w": ck["w"] + 1}, os.path.join(d, "ckpt.pt"))
os.makedirs(os.path.join(d, f"checkpoint-{step}"), exist_ok=True)
torch.save({"step": step}, os.path.join(d, f"checkpoint-{step}", "state.pt"))
assert torch.load(os.path.join(d, "ckpt.pt"))["step"] == step
extra = torch.load(os.path.join(d, "extra.pt"))
if len(sys.argv) > 1:  # crash the agent before it can push (the node's sidecar killed)
    run = os.environ["BOOTSEER_RUN_DIR"]
    for _ in range(200):
        if os.path.exists(os.path.join(run, "agent.pid")):
            break
        time.sleep(0.05)
    os.kill(int(open(os.path.join(run, "agent.pid")).read()), signal.SIGKILL)
print(d, step, int(extra["x"].sum()))
"""


def _node(tmp_path: Path, name: str) -> dict[str, str]:
    home = tmp_path / name
    (home / "cache").mkdir(parents=True)
    (home / "rt").mkdir(mode=0o700)
    return {"XDG_CACHE_HOME": str(home / "cache"), "XDG_RUNTIME_DIR": str(home / "rt")}


def _first_checkpoint(tmp_path: Path, store: Store) -> None:
    from bootseer_cli.stripe.push import push

    src = tmp_path / "src"
    src.mkdir()
    torch.save({"step": 1, "w": torch.zeros(64, 1024)}, src / "ckpt.pt")
    torch.save({"x": torch.ones(3 * CELL // 4)}, src / "extra.pt")  # several cells, never rewritten
    push(store, src, "job", "v1", stripes=3, cell_size=CELL)


def _config(tmp_path: Path, store: Store, mode: str, mountpoint: Path | None = None) -> Path:
    cfg = tmp_path / f"bootseer-{mode}.toml"
    mp = f'mountpoint = "{mountpoint}"\n' if mountpoint else ""
    cfg.write_text(
        f'[store]\nuri = "{store.uri}"\n\n[checkpoint]\nname = "job"\nmode = "{mode}"\n{mp}'
        f"stripes = 3\ncell_size = {CELL}\n"
    )
    return cfg


def _exec(cfg: Path, tmp_path: Path, node: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    return run_cli("exec", "--config", str(cfg), "--", sys.executable, str(script), *args, env=node)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False  # gone (a killed agent leaves its pid file behind)
    return True


def _agents_done(node: dict[str, str], timeout: float = 120) -> None:
    runs = Path(node["XDG_CACHE_HOME"]) / "bootseer" / "runs"
    done = wait_until(lambda: not [p for p in runs.glob("*/agent.pid") if _alive(p)], timeout=timeout)
    assert done, "the agent did not finish"


def _events(node: dict[str, str], stage: str) -> list[dict[str, object]]:
    out = []
    for f in (Path(node["XDG_CACHE_HOME"]) / "bootseer" / "runs").glob("*/events.jsonl"):
        out += [e for e in map(json.loads, f.read_text().splitlines()) if e["stage"] == stage]
    return out


def _resumes_on_a_fresh_node(tmp_path: Path, store: Store, mode: str, step: int) -> None:
    node = _node(tmp_path, f"fresh-{mode}")
    r = _exec(_config(tmp_path, store, mode), tmp_path, node)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1:] == [str(step), str(3 * CELL // 4)], r.stdout
    _agents_done(node)


def test_mounted_checkpoint_takes_a_save_which_is_pushed_as_latest(tmp_path: Path, mounts: Path) -> None:
    """Before: the first save failed with EROFS (the mount is read-only)."""
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    r = _exec(_config(tmp_path, store, "mount", mounts / "out"), tmp_path, node)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(mounts / "out"), "2", str(3 * CELL // 4)]
    _agents_done(node)
    assert mount_info(mounts / "out") is None, "the writable view outlived the job"
    m = load_manifest(store, "job")
    assert m.tag != "v1" and sorted(f.path for f in m.files) == ["checkpoint-2/state.pt", "ckpt.pt", "extra.pt"]
    [ev] = _events(node, "ckpt-writeback")
    assert ev["outcome"] == "pushed" and ev["bytes"] == m.total_size and ev["detail"] == f"job:{m.tag}"
    report = run_cli("report", "--config", str(tmp_path / "bootseer-mount.toml"), env=node)
    rows = [ln for ln in report.stdout.splitlines() if "ckpt-writeback" in ln]
    assert report.returncode == 0 and rows and "behind the launcher" in rows[0], report.stdout + report.stderr
    # the staging copy goes once the tag is in the store; nothing else is left on the node
    assert not list((Path(node["XDG_CACHE_HOME"]) / "bootseer" / "ckpt-write").iterdir())
    _resumes_on_a_fresh_node(tmp_path, store, "mount", 3)


def _last_checkpoint_event(node: dict[str, str]) -> dict[str, object]:
    runs = sorted((Path(node["XDG_CACHE_HOME"]) / "bootseer" / "runs").iterdir())
    events = [json.loads(ln) for ln in (runs[-1] / "events.jsonl").read_text().splitlines()]
    [ev] = [e for e in events if e["stage"] == "checkpoint"]
    return {**ev, **json.loads(ev.get("extra") or "{}")}


def _kept(node: dict[str, str]) -> list[Path]:
    return sorted((Path(node["XDG_CACHE_HOME"]) / "bootseer" / "ckpt-kept").iterdir())


def test_a_restart_on_the_same_node_reads_its_own_save_from_local_disk(tmp_path: Path, mounts: Path) -> None:
    """What a run saved stays on the node once pushed (kept.py): the next start here stacks it over the
    stripes of the tag it became, so the resume reads local disk, not the store. One copy per checkpoint;
    a copy changed since its push is not used."""
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    cfg = _config(tmp_path, store, "mount")
    r = _exec(cfg, tmp_path, node)
    assert r.returncode == 0 and r.stdout.split()[1] == "2", r.stderr
    assert _last_checkpoint_event(node)["local_copy"] is False  # the first start: only the store's v1
    _agents_done(node)
    [entry] = _kept(node)
    assert sorted(str(p.relative_to(entry / "upper")) for p in (entry / "upper").rglob("*.pt")) == [
        "checkpoint-2/state.pt",
        "ckpt.pt",
    ]

    r = _exec(cfg, tmp_path, node)  # a restart: resumes from step 2, the save kept here
    assert r.returncode == 0 and r.stdout.split()[1:] == ["3", str(3 * CELL // 4)], r.stderr
    ev = _last_checkpoint_event(node)
    assert ev["local_copy"] is True and "from local disk" in str(ev["detail"]), ev
    _agents_done(node)
    [newer] = _kept(node)  # the copy of step 3's tag; step 2's (used under that run's view) retired
    assert newer != entry and not entry.exists()

    pt = newer / "upper" / "ckpt.pt"
    os.utime(pt, ns=(pt.stat().st_atime_ns, pt.stat().st_mtime_ns + 10**9))  # changed since its push
    r = _exec(cfg, tmp_path, node)
    assert r.returncode == 0 and r.stdout.split()[1] == "4", r.stderr  # step 3's save, read from the store
    assert _last_checkpoint_event(node)["local_copy"] is False
    _agents_done(node)
    assert not list((Path(node["XDG_CACHE_HOME"]) / "bootseer" / "ckpt-write").iterdir())
    _resumes_on_a_fresh_node(tmp_path, store, "mount", 5)


# A trainer in the manner of Lightning's ModelCheckpoint(save_last=True, save_top_k=1): every save
# rewrites `last.ckpt`, adds `step-N.ckpt` and deletes the one before. It says whether its run's stripe
# mount (`ckpt-<run id>.ro`) is mounted.
LAST_CKPT = """
import os, torch
d = os.environ["BOOTSEER_CKPT_DIR"]
ck = torch.load(os.path.join(d, "last.ckpt"))
step = ck["step"] + 1
torch.save({"step": step, "w": ck["w"] + 1}, os.path.join(d, "last.ckpt"))
torch.save({"step": step}, os.path.join(d, f"step-{step}.ckpt"))
os.unlink(os.path.join(d, f"step-{ck['step']}.ckpt"))
lower = "/ckpt-" + os.environ["BOOTSEER_RUN_ID"] + ".ro "
print(step, ",".join(sorted(os.listdir(d))), any(lower in ln for ln in open("/proc/self/mountinfo")))
"""


def test_a_restart_whose_own_save_is_the_whole_tag_needs_no_stripe_mount(tmp_path: Path, mounts: Path) -> None:
    """A job whose saves rewrite the whole checkpoint (deleting the save they replace) leaves a kept copy
    that is all of the tag it became: the restart on that node mounts the view over that copy alone,
    with no stripe mount (no FUSE server, no store read), resumes from it, and its own save is pushed
    as the next tag. The deletion's whiteout is not kept: it would have made the copy only a part."""
    from bootseer_cli.stripe.push import push

    store = file_store(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"step": 1, "w": torch.zeros(64, 1024)}, src / "last.ckpt")
    torch.save({"step": 1}, src / "step-1.ckpt")
    push(store, src, "job", "v1", stripes=3, cell_size=CELL)
    script = tmp_path / "last.py"
    script.write_text(LAST_CKPT)
    cfg = _config(tmp_path, store, "mount")
    node = _node(tmp_path, "a")

    def start(on: dict[str, str]) -> list[str]:
        r = run_cli("exec", "--config", str(cfg), "--", sys.executable, str(script), env=on)
        assert r.returncode == 0, r.stderr
        _agents_done(on)
        return r.stdout.split()

    assert start(node) == ["2", "last.ckpt,step-2.ckpt", "True"]  # from the store's stripes
    ev = _last_checkpoint_event(node)
    assert ev["local_copy"] is False and ev["stripe_mount"] is True
    assert start(node) == ["3", "last.ckpt,step-3.ckpt", "False"]  # step 2's save, the view's only layer
    ev = _last_checkpoint_event(node)
    assert ev["local_copy"] is True and ev["stripe_mount"] is False, ev
    assert "all of it from local disk" in str(ev["detail"])
    assert load_manifest(store, "job", "latest").tag != ev["checkpoint"].split(":")[1]  # step 3 pushed
    assert start(_node(tmp_path, "fresh")) == ["4", "last.ckpt,step-4.ckpt", "True"]  # another node


def test_pulled_checkpoint_takes_a_save_which_is_pushed_as_latest(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    r = _exec(_config(tmp_path, store, "pull"), tmp_path, node)
    assert r.returncode == 0, r.stderr
    _agents_done(node)
    m = load_manifest(store, "job")
    assert m.tag != "v1" and "checkpoint-2/state.pt" in {f.path for f in m.files}
    _resumes_on_a_fresh_node(tmp_path, store, "pull", 3)


def test_pulled_directory_with_new_files_is_kept_then_pushed(tmp_path: Path) -> None:
    """Before: the next `bootseer exec` deleted the pulled directory (and the job's two checkpoints in it)
    without a word, and left its `.ckpt-<run>` marker behind."""
    from bootseer_cli.stripe.rundirs import sweep

    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    cfg = _config(tmp_path, store, "pull")
    r = _exec(cfg, tmp_path, node, "kill-agent")  # the agent dies: nothing pushes what the job saved
    assert r.returncode == 0, r.stderr
    pulled = Path(r.stdout.split()[0])
    assert (pulled / "checkpoint-2" / "state.pt").exists()
    warned: list[str] = []
    sweep(pulled.parent, str(pulled.parent / "ckpt-other"), warned.append)
    assert torch.load(pulled / "checkpoint-2" / "state.pt")["step"] == 2, "bootseer removed what the job wrote"
    assert len(warned) == 1 and str(pulled) in warned[0] and "kept" in warned[0]
    assert load_manifest(store, "job").tag == "v1"
    # the next start pushes what that job saved before it resolves `latest`, so it resumes from step 2
    r = _exec(cfg, tmp_path, node)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == "3", r.stdout
    _agents_done(node)
    names = {f.path for f in load_manifest(store, "job").files}
    assert {"checkpoint-2/state.pt", "checkpoint-3/state.pt"} <= names
    base = pulled.parent
    leftovers = [n for n in os.listdir(base) if n.startswith(".ckpt-") and not (base / n[1:].split(".")[0]).exists()]
    assert not leftovers, f"markers left behind: {leftovers}"


@pytest.mark.parametrize("where", ["per-run", "configured"])
def test_agent_killed_in_mount_mode_the_next_start_pushes(tmp_path: Path, mounts: Path, where: str) -> None:
    """The agent dies with the job's save unpushed (and its overlay left mounted): the next start takes
    the overlay down, pushes the save before it resolves `latest`, and resumes from it."""
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    cfg = _config(tmp_path, store, "mount", mounts / "out" if where == "configured" else None)
    r = _exec(cfg, tmp_path, node, "kill-agent")
    assert r.returncode == 0, r.stderr
    first = r.stdout.split()[0]
    assert load_manifest(store, "job").tag == "v1"
    time.sleep(0.2)
    r = _exec(cfg, tmp_path, node)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == "3", r.stdout + r.stderr
    _agents_done(node)
    assert mount_info(first) is None, "the dead run's overlay was not taken down"
    assert {"checkpoint-2/state.pt", "checkpoint-3/state.pt"} <= {f.path for f in load_manifest(store, "job").files}


NOBODY = 65534
# A plain user (euid 65534) who may open root's 0600 /dev/fuse and this venv (DAC override), and is
# otherwise not root: the writable view is then fuse-overlayfs over the user's own FUSE mount.
AS_NOBODY = [
    "setpriv",
    f"--reuid={NOBODY}",
    f"--regid={NOBODY}",
    "--clear-groups",
    "--inh-caps=-all,+dac_read_search,+dac_override",
    "--ambient-caps=+dac_read_search,+dac_override",
]


# /dev/fuse is root's 0600 here, where a plain user's node has it 0666: a private mount namespace with a
# 0666 node of the same device bound over it (mounts made in it end with its last process, the agent).
_USER_FUSE = 'mknod -m 666 "$0" c 10 229 && mount --bind "$0" /dev/fuse && exec "$@"'


def _as_nobody(argv: list[str], node: dict[str, str]):  # type: ignore[no-untyped-def]
    import subprocess

    env = {**os.environ, **node, "HOME": node["XDG_CACHE_HOME"]}
    dev = Path(node["XDG_CACHE_HOME"]).parent / f"fuse-{time.monotonic_ns()}"
    cmd = ["unshare", "-m", "sh", "-c", _USER_FUSE, str(dev), *AS_NOBODY, sys.executable, "-m", "bootseer_cli"]
    return subprocess.run([*cmd, *argv], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become the plain user (setpriv)")
def test_plain_user_saves_into_the_mounted_checkpoint(tmp_path: Path) -> None:
    """fuse-overlayfs over the user's own stripe mount; the user's own domain in the store."""
    import shutil
    import tempfile

    if shutil.which("fuse-overlayfs") is None:
        pytest.fail("fuse-overlayfs is required (apt-get install fuse-overlayfs)")
    # tmp_path is root's 0700 and access(2) ignores capabilities: the user's files live in a 0755 base
    base = Path(tempfile.mkdtemp(prefix="bootseer-plain-", dir="/tmp"))
    base.chmod(0o755)
    try:
        _plain_user_round(base)
    finally:
        from .conftest import _mounted_under

        for mp in reversed(_mounted_under(str(base))):
            import subprocess

            subprocess.run(["umount", "-l", mp], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _plain_user_job(base: Path, node: dict[str, str], owned: list[str], mode: str) -> tuple[Path, list[str]]:
    """The plain user's store (and `owned` node directories, chowned to the user), its first checkpoint
    pushed as job:v1 by the user, and the trainer; (config, launcher)."""
    (base / "store").mkdir()
    for d in [*owned, str(base / "store")]:
        os.chown(d, NOBODY, NOBODY)
    store = Store((base / "store").as_uri())
    src = base / "src"
    src.mkdir()
    torch.save({"step": 1, "w": torch.zeros(64, 1024)}, src / "ckpt.pt")
    torch.save({"x": torch.ones(3 * CELL // 4)}, src / "extra.pt")
    cfg = _config(base, store, mode)
    r = _as_nobody(["ckpt", "push", "--config", str(cfg), str(src), "--name", "job", "--tag", "v1"], node)
    assert r.returncode == 0, r.stderr
    (base / "train.py").write_text(TRAINER)
    # the launcher through /bin/sh: bootseer checks it with access(2), which the plain user's python fails
    return cfg, ["/bin/sh", "-c", f"exec {sys.executable} {base / 'train.py'}"]


def _plain_user_round(base: Path) -> None:
    node = _node(base, "plain")
    cfg, launcher = _plain_user_job(base, node, list(node.values()), "mount")
    r = _as_nobody(["exec", "--config", str(cfg), "--", *launcher], node)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1:] == ["2", str(3 * CELL // 4)] and "pulling" not in r.stderr, r.stderr
    _agents_done(node)
    runtime = Path(r.stdout.split()[0]).parent
    left = sorted(p.name for p in runtime.iterdir() if "ckpt-" in p.name)
    assert left == [], f"left on the node after the agent ended: {left}"
    r = _as_nobody(["ckpt", "ls", "--config", str(cfg), "job"], node)
    assert r.returncode == 0 and len([ln for ln in r.stdout.splitlines() if "v1" not in ln and "job" in ln]) >= 1
    r = _as_nobody(["exec", "--config", str(cfg), "--", *launcher], node)
    assert r.returncode == 0 and r.stdout.split()[1] == "3", r.stderr
    assert _last_checkpoint_event(node)["local_copy"] is True  # its own save, under fuse-overlayfs
    _agents_done(node)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become the plain user (setpriv)")
def test_plain_user_pull_leaves_nothing_on_the_node_after_the_agent(tmp_path: Path) -> None:
    """Issue 46 finding 8: a plain user's pulled checkpoint (a whole copy, on the disk of the user's
    cache root where there is no /run/user) and its markers stayed after the agent had pushed it."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="bootseer-plain-", dir="/tmp"))
    base.chmod(0o755)
    try:
        node = _node(base, "plain")
        del node["XDG_RUNTIME_DIR"]  # a batch job's user often has none: the runtime dir is on disk
        cfg, launcher = _plain_user_job(base, node, [node["XDG_CACHE_HOME"]], "pull")
        r = _as_nobody(["exec", "--config", str(cfg), "--", *launcher], node)
        assert r.returncode == 0, r.stderr
        ckpt_dir = Path(r.stdout.split()[0])
        runtime = ckpt_dir.parent
        assert ckpt_dir.name.startswith("ckpt-") and r.stdout.split()[1] == "2", r.stdout + r.stderr
        _agents_done(node)
        r = _as_nobody(["ckpt", "ls", "--config", str(cfg), "job"], node)  # pushed: only then may the copy go
        assert r.returncode == 0 and [ln for ln in r.stdout.splitlines() if "job" in ln and "v1" not in ln], r.stdout
        left = sorted(p.name for p in runtime.iterdir() if "ckpt-" in p.name)
        assert left == [], f"left on the node after the agent ended: {left}"
        r = _as_nobody(["exec", "--config", str(cfg), "--", *launcher], node)  # resumes from the push
        assert r.returncode == 0 and r.stdout.split()[1] == "3", r.stdout + r.stderr
        _agents_done(node)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_pull_never_replaces_a_directory_holding_other_files(tmp_path: Path) -> None:
    """Before: a configured pull directory was moved aside and removed, whatever it held."""
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    cfg = _config(tmp_path, store, "pull", out)
    r = run_cli(
        "exec",
        "--config",
        str(cfg),
        "--",
        sys.executable,
        "-c",
        "import os; print(os.listdir(os.environ['BOOTSEER_CKPT_DIR']))",
        env=node,
    )
    assert r.returncode == 0, r.stderr
    assert (out / "notes.txt").read_text() == "mine" and r.stdout.strip() == "['notes.txt']"
    [warning] = [ln for ln in r.stderr.splitlines() if "warning" in ln and "kept" in ln]
    assert "warning" in warning and str(out) in warning and "notes.txt" in warning
    _agents_done(node)
    assert load_manifest(store, "job").tag == "v1"  # not pushed: bootseer never pulled into it


def test_without_an_agent_the_view_goes_with_the_job_and_the_next_start_pushes(tmp_path: Path, mounts: Path) -> None:
    """No agent (`BOOTSEER_EXEC_AGENT=0`): the stripe mount's server takes the writable view down with
    itself when the launcher ends; the save waits on local disk and the next start pushes it."""
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    cfg = _config(tmp_path, store, "mount", mounts / "out")
    r = _exec(cfg, tmp_path, {**node, "BOOTSEER_EXEC_AGENT": "0"})
    assert r.returncode == 0 and r.stdout.split()[1] == "2", r.stderr
    assert wait_until(lambda: mount_info(mounts / "out") is None, timeout=30), "the view outlived the job"
    assert load_manifest(store, "job").tag == "v1"
    r = _exec(cfg, tmp_path, node)
    assert r.returncode == 0 and r.stdout.split()[1] == "3", r.stderr
    _agents_done(node)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (an overlayfs to hold the node's cache)")
def test_cache_on_an_overlayfs_gets_fuse_overlayfs(tmp_path: Path, mounts: Path) -> None:
    """A container's root filesystem is an overlayfs, which the kernel refuses as an upper directory:
    root then takes fuse-overlayfs for the writable view rather than falling back to a pull."""
    import subprocess

    disk = tmp_path / "rootfs"
    for d in ("l", "u", "w", "rootfs"):
        (tmp_path / d).mkdir()
    opts = f"lowerdir={tmp_path / 'l'},upperdir={tmp_path / 'u'},workdir={tmp_path / 'w'}"
    subprocess.run(["mount", "-t", "overlay", "-o", opts, "overlay", str(disk)], check=True)
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(disk, "node")
    r = _exec(_config(tmp_path, store, "mount", mounts / "out"), tmp_path, node)
    assert r.returncode == 0 and r.stdout.split()[1] == "2", r.stderr
    assert "pulling" not in r.stderr and "warning" not in r.stderr, r.stderr
    _agents_done(node)
    assert "checkpoint-2/state.pt" in {f.path for f in load_manifest(store, "job").files}


def test_ckpt_umount_takes_a_writable_view_down(tmp_path: Path, mounts: Path) -> None:
    store = file_store(tmp_path)
    _first_checkpoint(tmp_path, store)
    node = _node(tmp_path, "a")
    cfg = _config(tmp_path, store, "mount", mounts / "out")
    umount = f"{sys.executable} -m bootseer_cli ckpt umount $BOOTSEER_CKPT_DIR"
    r = run_cli("exec", "--config", str(cfg), "--", "sh", "-c", umount, env=node)
    assert r.returncode == 0 and r.stdout.strip() == f"unmounted {mounts / 'out'}", r.stderr
    assert mount_info(mounts / "out") is None
    _agents_done(node)


FIRST_SAVE = """
import os, torch
d = os.environ["BOOTSEER_CKPT_DIR"]
assert not os.listdir(d), os.listdir(d)
torch.save({"step": 1, "w": torch.zeros(64, 1024)}, os.path.join(d, "ckpt.pt"))
torch.save({"x": torch.ones(%d)}, os.path.join(d, "extra.pt"))
print(d)
"""


def test_first_start_save_is_pushed_as_the_first_tag(tmp_path: Path) -> None:
    """Before: with no tag in the store yet the stage gave the job no `$BOOTSEER_CKPT_DIR` and no write-back,
    so the first save never reached the store and a fresh node had nothing to resume from."""
    store = file_store(tmp_path)
    node = _node(tmp_path, "a")
    script = tmp_path / "first.py"
    script.write_text(FIRST_SAVE % (3 * CELL // 4))
    cfg = _config(tmp_path, store, "mount")
    r = run_cli("exec", "--config", str(cfg), "--", sys.executable, str(script), env=node)
    assert r.returncode == 0, r.stdout + r.stderr
    _agents_done(node)
    [ev] = _events(node, "checkpoint")
    assert ev["outcome"] == "new", ev
    m = load_manifest(store, "job")
    assert sorted(f.path for f in m.files) == ["ckpt.pt", "extra.pt"]
    [wb] = _events(node, "ckpt-writeback")
    assert wb["outcome"] == "pushed" and wb["detail"] == f"job:{m.tag}", wb
    assert (Path(r.stdout.split()[0]) / "ckpt.pt").exists()  # nothing the job wrote is deleted by the push
    _resumes_on_a_fresh_node(tmp_path, store, "mount", 2)
