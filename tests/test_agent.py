"""The agent sidecar: started detached by exec, never waited for, gone when the launcher is.

The launcher here is given a real task (a hot-block record that waits for `ready()`), so the agent
has a thread to stop; the tests look for any process still carrying the run directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hotblocks.conftest import bootseer, wait_for, write_config
from tests.support.slowdown import scaled

pytestmark = pytest.mark.integration


def _run_dir(cache: Path) -> Path:
    runs = list((cache / "bootseer" / "runs").iterdir())
    assert len(runs) == 1
    return runs[0]


def _agent_processes(run_dir: Path) -> list[int]:
    """Pids whose command line names this run directory (the agent, and anything it left behind)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run_dir).encode() in cmd:
            try:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                pids.append(int(entry))
    return pids


def _assert_agent_gone(run_dir: Path) -> str:
    wait_for(lambda: not _agent_processes(run_dir), timeout=20, what="the agent to exit")
    log = (run_dir / "agent.log").read_text()
    assert "agent done" in log, log
    assert not (run_dir / "agent.pid").exists()
    return log


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "a.bin").write_bytes(os.urandom(1 << 16))
    return write_config(tmp_path / "bootseer.toml", [roots], ready="call")


LAUNCHER = (
    "import os, sys, time\n"
    "d = os.environ['BOOTSEER_RUN_DIR']\n"
    "open(os.path.join(d, 'launcher.pid'), 'w').write(str(os.getpid()))\n"
    "for _ in range(100):\n"  # the agent is up while the launcher runs: exec did not wait for it
    "    if os.path.exists(os.path.join(d, 'agent.pid')): break\n"
    "    time.sleep(0.1)\n"
    "pid = int(open(os.path.join(d, 'agent.pid')).read())\n"
    "os.kill(pid, 0)\n"
    "print('agent', pid, 'alive', flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
    "sys.exit(int(sys.argv[2]))\n"
)


def test_exec_does_not_wait_for_the_agent_and_it_exits_after_a_normal_end(cfg: Path, isolated_cache: Path) -> None:
    t0 = time.time()
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, "-c", LAUNCHER, "0.2", "0")
    assert r.returncode == 0, r.stderr
    assert "alive" in r.stdout
    run_dir = _run_dir(isolated_cache)
    # exec became the launcher (same pid), so nothing of bootseer sat between the launcher and the job
    launcher_pid = json.loads((run_dir / "agent.json").read_text())["launcher_pid"]
    assert (run_dir / "launcher.pid").read_text() == str(launcher_pid)
    log = _assert_agent_gone(run_dir)
    assert "launcher ended" in log
    assert time.time() - t0 < 60


def test_agent_exits_when_the_launcher_fails(cfg: Path, isolated_cache: Path) -> None:
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, "-c", LAUNCHER, "0", "3")
    assert r.returncode == 3
    _assert_agent_gone(_run_dir(isolated_cache))


def test_agent_exits_when_the_launcher_is_killed(cfg: Path, isolated_cache: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bootseer_cli", "exec", "-c", str(cfg), "--", sys.executable, "-c", LAUNCHER, "60", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "alive" in proc.stdout.readline()
        run_dir = _run_dir(isolated_cache)
        assert _agent_processes(run_dir)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = _assert_agent_gone(run_dir)
    assert "launcher ended" in log


def test_agent_uploads_the_run_events(cfg: Path, isolated_cache: Path) -> None:
    r = bootseer("exec", "-c", str(cfg), "--", sys.executable, "-c", "pass")
    assert r.returncode == 0, r.stderr
    run_dir = _run_dir(isolated_cache)
    _assert_agent_gone(run_dir)
    store = isolated_cache / "bootseer" / "store"
    assert list(store.rglob("events/*/*.parquet"))


QUIET_UNTIL_READY = (
    "import glob, os, sys, time\n"
    "import bootseer_cli\n"
    "d, store, limit = os.environ['BOOTSEER_RUN_DIR'], sys.argv[1], float(sys.argv[2])\n"
    "uploaded = lambda: glob.glob(os.path.join(store, '**', 'events', '*', '*.parquet'), recursive=True)\n"
    "deadline = time.time() + limit\n"
    "while not os.path.exists(os.path.join(d, 'agent.pid')) and time.time() < deadline:\n"
    "    time.sleep(0.05)\n"
    "time.sleep(2.0)\n"  # the agent's tasks are running: it used to upload here, beside the import
    "print('before ready:', len(uploaded()), 'upload(s)', flush=True)\n"
    "bootseer_cli.ready()\n"
    "while not uploaded() and time.time() < deadline:\n"
    "    time.sleep(0.1)\n"
    "print('after ready:', len(uploaded()), 'upload(s)', flush=True)\n"
)


def test_the_agent_uploads_nothing_until_the_first_step(cfg: Path, isolated_cache: Path) -> None:
    """Issue 44 (a restart no slower than without bootseer): while the launcher imports its framework,
    the agent does not upload (pyarrow, the store, Parquet cost ~0.15 s of CPU on the job's cores); it
    uploads once the start is over, and again when the launcher ends."""
    store = isolated_cache / "bootseer" / "store"
    limit = scaled(30.0)
    program = [sys.executable, "-c", QUIET_UNTIL_READY, str(store), str(limit)]
    r = bootseer("exec", "-c", str(cfg), "--", *program, timeout=limit + 60)
    assert r.returncode == 0, r.stderr
    assert "before ready: 0 upload(s)" in r.stdout, r.stdout + r.stderr
    assert "after ready: 1 upload(s)" in r.stdout, r.stdout + r.stderr
    _assert_agent_gone(_run_dir(isolated_cache))


def test_agent_settings_come_from_its_spec(tmp_path: Path) -> None:
    """The agent reads the settings exec ran with: the config file and the store URI of agent.json."""
    from bootseer_cli.agent import Agent

    (tmp_path / "bootseer.toml").write_text('[p2p]\nseed_s = 12.5\n[store]\nuri = "file:///from-file"\n')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"job": "j", "node": "n", "rank": 0, "run": "r"}))
    spec = {"launcher_pid": os.getpid(), "store_uri": "file:///from-exec", "tasks": []}
    (run_dir / "agent.json").write_text(json.dumps({**spec, "config_file": str(tmp_path / "bootseer.toml")}))
    settings = Agent(run_dir).settings
    assert settings.p2p.seed_s == 12.5
    assert settings.store.uri == "file:///from-exec"  # exec's flags and environment won over the file
    assert settings.config_path == tmp_path / "bootseer.toml"


def _spec_dir(tmp_path: Path, spec: dict[str, object]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"job": "j", "node": "n", "rank": 0, "run": "r"}))
    (run_dir / "agent.json").write_text(json.dumps(spec))
    return run_dir


def test_agent_gets_the_settings_exec_ran_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """agent.json carries the settings (not the store URI: that comes through BOOTSEER_STORE); no config
    file is read again, so a file changed or gone since exec does not matter."""
    from bootseer_cli.agent import Agent
    from bootseer_cli.settings import P2PSettings, Settings, StoreSettings, settings_doc

    settings = Settings(
        store=StoreSettings(uri="s3://key:secret@bucket/p", cache_dir=tmp_path / "c"),
        p2p=P2PSettings(seed_s=12.5, peers=("a:1", "b:2")),
        config_path=tmp_path / "gone.toml",
    )
    doc = settings_doc(settings)
    assert "secret" not in json.dumps(doc)
    run_dir = _spec_dir(tmp_path, {"launcher_pid": os.getpid(), "settings": doc, "tasks": []})
    monkeypatch.setenv("BOOTSEER_STORE", "s3://key:secret@bucket/p")
    assert Agent(run_dir).settings == settings


def _samples() -> list[object]:
    """One spec of every task kind, as a stage would hand it over."""
    from bootseer_cli.compilecache.tasks import PublishTask as CompilePublish
    from bootseer_cli.envmount.stage import MountTask
    from bootseer_cli.envsnap.agent_tasks import PublishTask as EnvPublish
    from bootseer_cli.envsnap.squash import SquashTask
    from bootseer_cli.hotblocks.agent_tasks import JudgeTask, PrefetchTask, RecordTask
    from bootseer_cli.p2p.seed import SeedTask
    from bootseer_cli.stripe.agent_tasks import UnmountTask, WritebackTask

    return [
        RecordTask(image_key="k", roots=["/a", "/b"], ready=2.5, started=1.0, fan_fd=7),
        RecordTask(image_key="k", roots=["/a"], covered="/run/covered.json"),
        PrefetchTask(file="/run/remaining.json", threads=4, mbps=10.0),
        JudgeTask(image_key="k", record="b" * 64, replayed=True, started=3.0, ready="call"),
        EnvPublish(
            env_key="e",
            roots=["/venv"],
            upload={"blob": "/c/pending/x.tar.zst", "digest": "d", "size": 1},
            lease_key="leases/env/e",
            lease_owner="n-1",
            lease_expires=5.0,
            lease_ttl_s=60.0,
        ),
        SquashTask(env_key="e", roots=["/venv"], layer="b" * 64, ref_extra={"inputs": ["pip install x==1"]}),
        UnmountTask(mountpoint="/mnt/ckpt", pid=42),
        MountTask(root="/c/env-mount/r1"),
        WritebackTask(root="/c/ckpt-write/r1", mountpoint="/run/ckpt-r1", dev="0:99"),
        CompilePublish(key="c", baseline="/run/baseline.json", max_bytes=10, ready="quiet", started=2.0),
        SeedTask(blobs=[{"digest": "d", "torrent": "t"}], fetches=[{"digest": "d", "origin": True}]),
    ]


def test_every_task_kind_goes_through_agent_json_and_back() -> None:
    """Each kind of the capability table: its spec is a frozen dataclass, its handler resolves, and a
    spec written as exec writes it (JSON) is read back by the agent as the same spec."""
    import dataclasses

    from bootseer_cli.agent import task_from_doc
    from bootseer_cli.capabilities import agent_tasks, resolve
    from bootseer_cli.stage import agent_task_doc

    table = agent_tasks()
    seen = set()
    for spec in _samples():
        doc = json.loads(json.dumps(agent_task_doc(spec)))
        found = task_from_doc(doc)
        assert found is not None, doc
        decl, back = found
        assert back == spec and type(back) is type(spec)
        assert callable(resolve(decl.handler))
        seen.add(decl.kind)
    assert seen == set(table)
    for decl in table.values():
        cls = resolve(decl.spec)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, decl.spec  # type: ignore[attr-defined]
    # Only the env upload, the squash of a long chain and the checkpoint write-back are waited for
    # after the launcher ends.
    finishing = [decl.kind for decl in table.values() if getattr(resolve(decl.spec), "finish", False)]
    assert finishing == ["env-publish", "env-squash", "ckpt-writeback"]


def test_a_spec_class_outside_the_table_is_refused(tmp_path: Path) -> None:
    @dataclasses.dataclass(frozen=True)
    class Stray:
        x: int = 1

    from bootseer_cli.stage import agent_task_kind

    with pytest.raises(TypeError, match="not the spec of any agent task"):
        agent_task_kind(Stray())


def test_unknown_and_malformed_tasks_are_logged_and_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent.json from another version: a kind nobody declares, a task missing a field. The agent
    logs each, runs the rest, and ends with its launcher as always."""
    from bootseer_cli import agent as agent_mod

    dead = subprocess.Popen(["true"])
    dead.wait()
    tasks = [{"kind": "teleport", "to": "mars"}, {"kind": "ckpt-umount"}, {"kind": "hot-prefetch", "file": "/nope"}]
    run_dir = _spec_dir(tmp_path, {"launcher_pid": dead.pid, "tasks": tasks})
    monkeypatch.setenv("BOOTSEER_STORE", (tmp_path / "store").as_uri())
    monkeypatch.setattr(agent_mod.Agent, "upload_events", lambda self: None)
    assert agent_mod.main(run_dir) == 0
    out = capsys.readouterr().out
    assert "unknown task kind 'teleport': ignored" in out
    assert "task ckpt-umount not started" in out and "mountpoint" in out
    assert "task hot-prefetch failed" in out  # it started: its file is missing
    assert "agent done" in out
