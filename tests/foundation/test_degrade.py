"""Issue 29: a node that cannot keep a cache, or cannot reach its store, still starts the job, with one
warning and no traceback; and Ctrl-C is honoured while the store does not answer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.settings import P2PSettings
from tests.support.s3server import S3Server
from tests.support.silentendpoint import SilentEndpoint, StallingProxy
from tests.support.slowdown import scaled

DEADLINE_S = P2PSettings().deadline_s  # the bound a start waits for anything (issue 29: + 5 s)
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update(XDG_CACHE_HOME=str(cache), PYTHONPATH=SRC, **extra)
    return env


def _read_only(directory: Path, argv: list[str]) -> list[str]:
    """`argv` run with `directory` read-only: a read-only bind mount in a private mount namespace for
    root (which ignores mode bits, as a container's root does), the mode bits for anyone else."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return argv
    if not shutil.which("unshare"):
        pytest.skip("root without unshare(1): cannot make a read-only mount")
    script = f'mount --bind -o ro "{directory}" "{directory}" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


EXEC_7 = [sys.executable, "-m", "bootseer_cli", "exec", "--", "sh", "-c", "exit 7"]


def _started_in_time(proj: Path, env: dict[str, str], argv: list[str] = EXEC_7) -> subprocess.CompletedProcess[str]:
    """`argv` (a start of `sh -c 'exit 7'`) run in `proj`: the job ran (its own exit status), within
    issue 29's bound, and nothing printed a traceback."""
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=proj, env=env, capture_output=True, text=True, timeout=DEADLINE_S + 60)
    took = time.monotonic() - t0
    assert r.returncode == 7, r.stderr
    assert took < DEADLINE_S + 5, f"{took:.1f} s: {r.stderr}"
    assert "Traceback" not in r.stderr
    return r


def _project(tmp_path: Path, store: str | None) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    root = tmp_path / "envroot"
    root.mkdir()
    lines = [f'[env]\nsetup = ["true"]\nroots = ["{root}"]\n']  # so the stages do run (and stamp no real env)
    if store:
        lines.insert(0, f'[store]\nuri = "{store}"\n')
    (proj / "bootseer.toml").write_text("".join(lines))
    return proj


@pytest.mark.parametrize("own_store", [True, False], ids=["store-elsewhere", "default-store"])
def test_exec_with_a_read_only_cache_starts_the_job(tmp_path: Path, own_store: bool) -> None:
    cache = tmp_path / "ro-cache"
    proj = _project(tmp_path, str(tmp_path / "store") if own_store else None)
    r = _started_in_time(proj, _env(cache), _read_only(cache, EXEC_7))
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert "read-only" in warnings[0] and "without it" in warnings[0]
    # the default store lies under the read-only cache: it is read, and a publish there is refused in a
    # line of its own (it was swapped for a temporary store, issue 46)
    assert len(warnings) == (1 if own_store else 2), r.stderr
    assert own_store or "no snapshot can be published there" in warnings[1]


def test_doctor_tells_a_read_only_cache_from_a_full_one(tmp_path: Path) -> None:
    cache = tmp_path / "ro-cache"
    argv = _read_only(cache, [sys.executable, "-m", "bootseer_cli", "doctor"])
    r = subprocess.run(argv, cwd=tmp_path, env=_env(cache), capture_output=True, text=True, timeout=60)
    line = next(x for x in r.stdout.splitlines() if x.split()[1:2] == ["cache"])
    assert "read-only" in line and "free" not in line, r.stdout
    assert "free space" not in r.stdout


def test_a_full_cache_counts_as_unusable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache on a disk with (almost) no space left is "full", and a start takes a scratch directory."""
    from bootseer_cli import nodedirs

    monkeypatch.setattr(nodedirs, "FULL_BELOW_BYTES", 1 << 62)
    monkeypatch.setattr(nodedirs, "_usable", {})
    assert nodedirs.why_unusable(tmp_path / "cache") == "full"
    monkeypatch.setattr(nodedirs, "FULL_BELOW_BYTES", 0)
    monkeypatch.setattr(nodedirs, "_usable", {})
    assert nodedirs.why_unusable(tmp_path / "cache") == ""
    assert not (tmp_path / "cache").exists(), "asking must create nothing"


def test_events_without_any_run_directory_stay_in_memory_and_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No writable directory anywhere: the events are kept in memory and go straight to the store."""
    from bootseer_cli import events, nodedirs
    from bootseer_cli.store.core import Store

    monkeypatch.setattr(events, "usable_or_scratch", lambda d, name: None)
    monkeypatch.setattr(nodedirs, "_warned", False)
    run = events.RunInfo.new()
    assert run.memory == [] and not run.run_dir.exists()
    events.record(run, "env", 1.0, 2.0, "done")
    store = Store((tmp_path / "store").as_uri())
    rel = events.upload(store, run)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(store.get_bytes(rel)))
    assert table.column("stage").to_pylist() == ["env"]
    assert capsys.readouterr().err.count("warning") == 1


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GS_URI = "gs://bucket/p"


def _gs_env(cache: Path) -> dict[str, str]:
    """The environment of a gs:// store at a closed loopback port (the client's emulator variable)."""
    return _env(cache, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{_closed_port()}")


@pytest.mark.parametrize("scheme", ["gs", "hdfs"])
def test_exec_with_an_unreachable_store_starts_the_job_within_the_deadline(tmp_path: Path, scheme: str) -> None:
    """gs:// retried for 15 minutes per request and hdfs:// for Hadoop's connect retries: the job never ran."""
    uri = GS_URI if scheme == "gs" else f"hdfs://127.0.0.1:{_closed_port()}/store"
    proj = _project(tmp_path, uri)
    env = _gs_env(tmp_path / "cache") if scheme == "gs" else _env(tmp_path / "cache")
    assert "warning" in _started_in_time(proj, env).stderr


@pytest.mark.parametrize("how", ["hung", "drops-syn"])
def test_exec_with_an_s3_store_that_never_answers_starts_the_job_within_the_deadline(
    tmp_path: Path, how: str, s3_env: dict[str, str]
) -> None:
    """Each request to a store that took the connection and never answered cost the SDK's 60 s low-speed
    timeout three times, and each stage paid again: the job started after 363 s (env and image stages),
    or 63 s where SYNs were dropped. Now small requests give up soon and the store is then taken for
    down: the second stage does not ask it again, even after a setup that outlasts `DOWN_S` (drops-syn:
    its first request ends sooner, so there is room for a 16 s setup within the bound). Without an agent
    (hung) the run's events are uploaded before exec, and that small write took another 180 s."""
    from bootseer_cli.store.guard import DOWN_S

    endpoint = SilentEndpoint(how)
    try:
        proj = _project(tmp_path, f"s3://bkt/p?endpoint_override=127.0.0.1:{endpoint.port}&scheme=http")
        config = proj / "bootseer.toml"
        if how == "drops-syn":
            config.write_text(config.read_text().replace('setup = ["true"]', f'setup = ["sleep {DOWN_S + 1:.0f}"]'))
        else:
            config.write_text("[exec]\nagent = false\n" + config.read_text())
        tree = tmp_path / "tree"
        tree.mkdir()
        (tree / "f.bin").write_bytes(b"x" * 4096)
        with config.open("a") as f:
            f.write(f'[image]\nroots = ["{tree}"]\nready = "quiet"\n')
        r = _started_in_time(proj, _env(tmp_path / "cache"))
    finally:
        endpoint.close()
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert "env: store unreachable" in warnings[0]
    assert "image: cannot read the hot-block record" in warnings[1]
    assert "did not answer an earlier request" in warnings[1]  # not asked again
    if how == "hung":
        assert "could not upload the stage events" in warnings[2] and "earlier request" in warnings[2]
    assert len(warnings) == (3 if how == "hung" else 2), r.stderr


def test_exec_with_a_store_that_stops_sending_the_blob_starts_the_job_within_the_deadline(
    tmp_path: Path, s3_server: S3Server
) -> None:
    """The store answered the ref, then sent 64 kB of the snapshot and nothing more: the restore waited the
    SDK's 60 s low-speed timeout three times, and the job started after 201 s. Now each read of a blob
    has `STALL_S`; the start gives the snapshot up, runs the setup and does not ask the store again."""
    proxy = StallingProxy(("127.0.0.1", s3_server.port))
    try:
        uri = f"s3://{s3_server.bucket}/t-{os.urandom(6).hex()}?endpoint_override=127.0.0.1:{proxy.port}&scheme=http"
        proj = _project(tmp_path, uri)
        root = tmp_path / "envroot"
        make = f"head -c 2000000 /dev/urandom > {root}/lib.so && echo built >> {tmp_path}/setups"
        config = proj / "bootseer.toml"
        config.write_text("[exec]\nagent = false\n" + config.read_text().replace('"true"', repr(make)))
        assert "published" in _started_in_time(proj, _env(tmp_path / "cache-a")).stderr
        shutil.rmtree(root)
        root.mkdir()
        proxy.stall()
        r = _started_in_time(proj, _env(tmp_path / "cache-b"))
    finally:
        proxy.close()
    assert "could not restore snapshot" in r.stderr and "the store sent nothing for 20 s" in r.stderr, r.stderr
    assert "did not answer an earlier request" in r.stderr  # the lease is not asked for: the store is down
    assert (tmp_path / "setups").read_text().count("built") == 2  # the second node set up itself
    assert (root / "lib.so").stat().st_size == 2_000_000


def test_a_blob_read_has_a_deadline_and_marks_the_store_down() -> None:
    """`within` and `Chunks` give up on a read that brings nothing in time, mark the store down, and pass
    data and the store's own errors through unchanged."""
    import threading

    from bootseer_cli.store import guard as storeguard

    breaker = storeguard.Breaker()
    assert storeguard.within(lambda: 42, breaker, "x", limit_s=1) == 42
    with pytest.raises(FileNotFoundError):
        storeguard.within(lambda: os.stat("/nonexistent/blob"), breaker, "x", limit_s=1)
    release = threading.Event()

    class Stream:
        def __init__(self, pieces: list[bytes]) -> None:
            self.pieces = pieces

        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read(self, n: int) -> bytes:
            if not self.pieces:
                release.wait(30)  # a store that went silent part way
                return b""
            return self.pieces.pop(0)

    with storeguard.Chunks(lambda: Stream([b"a", b"b", b""]), 1, breaker, "x", limit_s=1) as chunks:
        assert list(chunks) == [b"a", b"b"]
    t0 = time.monotonic()
    got: list[bytes] = []
    stalling = storeguard.Chunks(lambda: Stream([b"a"]), 1, breaker, "blob abc", limit_s=0.5)
    with pytest.raises(OSError, match=r"sent nothing for 0.5 s \(blob abc\)"), stalling as chunks:
        got.extend(chunks)
    assert got == [b"a"] and time.monotonic() - t0 < 5
    with pytest.raises(OSError, match="did not answer an earlier request"):  # down: not asked again
        storeguard.within(lambda: 42, breaker, "x", limit_s=1)
    assert storeguard.ABANDONED.is_set()
    release.set()
    storeguard.ABANDONED.clear()  # this process is pytest: nothing here may leave it early


def test_a_store_taken_for_down_is_asked_again_later_and_other_errors_do_not_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bootseer_cli.store import guard as storeguard

    calls: list[str] = []

    class Fs:
        type_name = "s3"

        def get_file_info(self, path: str) -> str:
            calls.append(path)
            if path == "gone":
                raise FileNotFoundError("gone: not found")
            if path == "silent":
                raise OSError("AWS Error NETWORK_CONNECTION during HeadObject: curlCode: 28, Timeout was reached")
            return "info"

    breaker = storeguard.Breaker()
    fs = storeguard.Guarded(Fs(), breaker)
    assert fs.type_name == "s3"
    with pytest.raises(FileNotFoundError):
        fs.get_file_info("gone")
    assert fs.get_file_info("a") == "info"  # "not found" says nothing of whether the store answers
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        fs.get_file_info("silent")
    with pytest.raises(OSError, match=r"did not answer an earlier request \(curlCode: 28, Timeout was reached\)"):
        fs.get_file_info("b")
    assert calls == ["gone", "a", "silent"]  # "b" never reached the store
    monkeypatch.setattr(breaker, "until", time.monotonic() - 1)  # DOWN_S later
    assert fs.get_file_info("c") == "info"


def test_ctrl_c_is_honoured_while_the_store_does_not_answer(tmp_path: Path) -> None:
    """`env ls` on an unreachable gs:// store ignored Ctrl-C for as long as the client retried."""
    import signal

    proj = _project(tmp_path, GS_URI)
    p = subprocess.Popen(
        [sys.executable, "-m", "bootseer_cli", "env", "ls"],
        cwd=proj,
        env=_gs_env(tmp_path / "cache"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The signal must land in the store call, not in the interpreter's start-up (where no handler of
        # ours is installed yet: a fixed sleep lost that race at load 11). pyarrow is loaded for the
        # store only after the command's handlers are in place; then 1 s in the call, as in the issue.
        deadline = time.monotonic() + 60
        while "libarrow" not in Path(f"/proc/{p.pid}/maps").read_text() and p.poll() is None:
            assert time.monotonic() < deadline, "env ls never reached the store call"
            time.sleep(0.05)
        time.sleep(1.0)
        assert p.poll() is None, "env ls returned before the signal: the store answered?"
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=scaled(30.0))  # the client alone retries for minutes
        took = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
    err = p.stderr.read() if p.stderr else ""
    # the watchdog's grace (errors.INTERRUPT_GRACE_S, 0.5 s) is the behaviour: its scale is the suite's knob
    assert rc == 130 and took < scaled(1.0), f"{took:.2f} s, rc {rc}: {err}"
    assert "interrupted" in err and "Traceback" not in err


def test_gcs_options_are_bounded_and_checked() -> None:
    from bootseer_cli.errors import StoreError
    from bootseer_cli.store.fs import _open_gcs

    fs, root = _open_gcs("gs://bucket/a/b?anonymous=true&retry_limit_seconds=3")
    assert root == "bucket/a/b" and fs.type_name == "gcs"
    with pytest.raises(StoreError, match="unknown GCS option 'nope'"):
        _open_gcs("gs://bucket/a?nope=1")
    with pytest.raises(StoreError, match="retry_limit_seconds must be a number"):
        _open_gcs("gs://bucket/a?retry_limit_seconds=soon")


def _init(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "init", *args],
        cwd=cwd,
        env=_env(cwd / "cache"),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_init_into_a_folder_and_over_it(tmp_path: Path) -> None:
    """`init .` wrote nothing (". exists"), and `init . --force` was a traceback (replacing a directory)."""
    r = _init(tmp_path, ".")
    assert r.returncode == 0 and (tmp_path / "bootseer.toml").is_file(), r.stderr
    r = _init(tmp_path, ".")
    assert r.returncode == 2 and "bootseer.toml exists (use --force" in r.stderr
    r = _init(tmp_path, ".", "--force")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    (tmp_path / "sub" / "bootseer.toml").mkdir(parents=True)
    r = _init(tmp_path, "sub", "--force")
    assert r.returncode == 2 and "is a directory" in r.stderr and "Traceback" not in r.stderr


def test_init_into_an_unwritable_or_missing_destination_is_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    argv = _read_only(ro, [sys.executable, "-m", "bootseer_cli", "init", str(ro / "bootseer.toml")])
    r = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bootseer: error: cannot write {ro / 'bootseer.toml'}: "), lines
    argv = _read_only(ro, [sys.executable, "-m", "bootseer_cli", "init", str(ro / "missing" / "bootseer.toml")])
    r = subprocess.run(argv, cwd=tmp_path, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot create" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_keys_in_a_fresh_init_folder_names_the_missing_file(tmp_path: Path) -> None:
    """The template's example setup names requirements.txt: `keys` said only that it was missing."""
    assert _init(tmp_path, ".").returncode == 0
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "keys"],
        cwd=tmp_path,
        env=_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "requirements.txt" in lines[0] and "create it, or change [env] setup" in lines[0]
    (tmp_path / "requirements.txt").write_text("numpy\n")
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "keys", "--json"],
        cwd=tmp_path,
        env=_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and '"env"' in r.stdout, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another uid")
def test_a_cache_dir_under_a_directory_the_user_cannot_enter_is_unusable_not_a_crash(tmp_path: Path) -> None:
    """An inherited XDG_CACHE_HOME under someone else's 0700 directory: a reason, never a traceback."""
    from bootseer_cli import nodedirs

    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, as nobody
        try:
            os.setgid(65534)
            os.setuid(65534)
            nodedirs._usable.clear()
            out = "ok:" + nodedirs.why_unusable(closed / "cache" / "bootseer")
        except BaseException as e:
            out = f"raised:{type(e).__name__}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = f.read()
    os.waitpid(pid, 0)
    assert got == "ok:not writable"
