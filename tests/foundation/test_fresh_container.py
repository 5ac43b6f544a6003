"""What a fresh container does to a start (issue 20): the files its runtime writes a moment before the
setup, and a hostname that does not resolve. Each case is reproduced in namespaces this test creates
(a private mount namespace with the runtime's bind mounts, a UTS namespace with its own hostname), so
nothing on the machine changes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.foundation.test_exec import _env_setup_config

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1) for namespaces"
)

BOOTSEER = f"{shlex.quote(sys.executable)} -m bootseer_cli"


def _in_namespaces(flags: list[str], script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", *flags, "sh", "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def test_capture_ignores_the_files_the_runtime_writes(tmp_path: Path) -> None:
    """As Docker does: fresh /etc/hosts, /etc/hostname, /etc/resolv.conf bind-mounted just before the setup.

    They are not reported as the setup's changes outside the roots; a file the setup really writes outside
    the roots still is. As root the capture knows the setup's own writes (envsnap/setupwrites.py: fanotify
    in the setup's mount namespace), so the runtime's files are not even candidates: no line names them
    (before issue 46, an info line said they were ignored by their timing)."""
    venv, env = _env_setup_config(tmp_path)
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    opt = tmp_path / "opt"
    opt.mkdir()
    future = time.time() + 120  # "just written", whatever the machine's load makes the start take
    binds = []
    for name in ("hosts", "hostname", "resolv.conf"):
        f = runtime / name
        f.write_bytes(Path("/etc", name).read_bytes() if Path("/etc", name).exists() else b"")
        os.utime(f, (future, future))
        binds.append(f"mount --bind {f} /etc/{name}")
    cfg = (tmp_path / "bootseer.toml").read_text()
    (tmp_path / "bootseer.toml").write_text(cfg.replace("setup = [", 'setup = ["touch /opt/setup-wrote-this", '))
    script = " && ".join(
        ["mount --make-rprivate /", f"mount --bind {opt} /opt", *binds, f"exec {BOOTSEER} exec -- true"]
    )
    r = _in_namespaces(["--mount"], script, tmp_path, env)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("bootseer: warning:")]
    assert len(warnings) == 1 and "/opt/setup-wrote-this" in warnings[0], r.stderr
    assert "/etc/" not in warnings[0]
    for name in ("hosts", "hostname", "resolv.conf"):
        assert f"/etc/{name}" not in r.stderr, r.stderr
    assert (venv / "bin" / "tool").exists()


def test_doctor_warns_when_the_hostname_does_not_resolve(tmp_path: Path) -> None:
    """torchrun's rendezvous would hang on it: doctor says so, with the fix, within its time bound."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    t0 = time.monotonic()
    r = _in_namespaces(["--uts"], f"hostname nosuchhost-xyz && exec {BOOTSEER} doctor --json", tmp_path, env)
    took = time.monotonic() - t0
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    check = checks["hostname"]
    assert check["status"] == "warn", check
    assert "nosuchhost-xyz" in check["detail"] and "--add-host" in check["fix"] and "rendezvous" in check["fix"]
    assert took < 60
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert {c["name"]: c for c in json.loads(r.stdout)}["hostname"]["status"] == "ok"


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs ip(8) to bring up the namespace's loopback")
def test_doctor_hostname_check_is_bounded_when_the_resolver_never_answers(tmp_path: Path) -> None:
    """A resolver that swallows queries (timeout 5 s × 2 attempts in resolv.conf): the check gives up at 2 s.

    In a network namespace of its own, a UDP socket on 127.0.0.1:53 reads queries and never replies."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:2\n")
    sink = (
        "import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.bind(('127.0.0.1', 53)); time.sleep(60)"
    )
    probe = (
        "import json, time; from bootseer_cli.doctor import check_hostname; "
        "t = time.monotonic(); c = check_hostname(); print(json.dumps({'took': time.monotonic() - t, **c.__dict__}))"
    )
    py = shlex.quote(sys.executable)
    script = (
        "ip link set lo up && hostname nosuchhost-xyz && mount --make-rprivate / && "
        f"mount --bind {resolv} /etc/resolv.conf && {{ {py} -c {shlex.quote(sink)} & }} && sleep 0.5 && "
        f"{py} -c {shlex.quote(probe)}; kill $!"
    )
    r = _in_namespaces(["--net", "--uts", "--mount"], script, tmp_path, dict(os.environ))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "warn" and "no answer within 2 s" in out["detail"], out
    assert 1.9 <= out["took"] < 3.5, out
