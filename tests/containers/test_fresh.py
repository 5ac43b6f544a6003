"""Fresh containers are the real home (issue 20): bootseer installed as the README's Dockerfile snippet
installs it, on a plain Debian 12 base (PEP 668), and a job whose launcher lives in the env that the
[env] setup creates and a fresh container restores."""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.containers import engine
from bootseer_cli.templates import render
from tests.containers.conftest import make_wheel
from tests.support import images, pkgindex

pytestmark = pytest.mark.integration

RUNTIME = (
    "typer",
    "pyarrow",
    "zstandard",
    "platformdirs",
    "tqdm",
    "docker",
    "libtorrent",
    "mfusepy",
    "cryptography",
    "obstore",
)


def _wheelhouse(dest: Path) -> None:
    """bootseer's wheel (built from this checkout) and its dependencies at the versions tested here."""
    pkgindex.wheelhouse(dest, [f"{name}=={md.version(name)}" for name in RUNTIME])
    with tempfile.TemporaryDirectory(prefix="bootseer-src-") as tmp:
        src = Path(tmp) / "src"
        for p in images._source_files():
            target = src / p.relative_to(images.REPO_ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)
        (src / "src/bootseer_cli/templates").symlink_to("../../templates")
        argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest)]
        subprocess.run([*argv, str(src)], check=True, capture_output=True, timeout=300, env=pkgindex.clean_env())


@pytest.fixture(scope="module")
def debian_app(docker_client: Any, debian12_base: str) -> Iterator[str]:
    """The Dockerfile snippet rendered on the Debian base, as the README says, built without a network."""
    import docker.errors

    tag = f"bootseer-test-debian-app:{os.getpid()}"
    dockerfile = render(
        "Dockerfile.bootseer",
        {
            "BASE_IMAGE": debian12_base,
            "SOURCE": "COPY wheels /tmp/bootseer-dist",  # bootseer's wheel and its dependencies'
            "PIP_ARGS": "--no-index --find-links /tmp/bootseer-dist",
        },
    )
    with tempfile.TemporaryDirectory(prefix="bootseer-ctx-") as tmp:
        ctx = Path(tmp)
        _wheelhouse(ctx / "wheels")
        shutil.copytree(images.REPO_ROOT / "hooks", ctx / "hooks")
        (ctx / "Dockerfile").write_text(dockerfile)
        try:
            docker_client.images.build(path=str(ctx), tag=tag, network_mode="none", rm=True, forcerm=True)
        except docker.errors.BuildError as e:
            log = "".join(str(x.get("stream", x.get("error", ""))) for x in e.build_log)
            pytest.fail(f"the Dockerfile snippet does not build on Debian 12:\n{log[-4000:]}")
    yield tag
    docker_client.images.remove(tag, force=True)


def test_the_old_install_line_is_refused_on_debian12(docker_client: Any, debian12_base: str) -> None:
    """What the snippet used to do (`python3 -m pip install bootseer`): PEP 668 refuses it on this base."""
    res = engine.run_container(docker_client, debian12_base, ["python3", "-m", "pip", "install", "--no-index", "x"])
    assert res.exit_code != 0 and "externally-managed-environment" in res.output, res.output


def test_dockerfile_snippet_builds_on_debian12(docker_client: Any, debian_app: str) -> None:
    res = engine.run_container(docker_client, debian_app, ["bootseer", "--version"])
    assert res.exit_code == 0 and "0.1.0" in res.output, res.output
    res = engine.run_container(docker_client, debian_app, ["readlink", "/usr/local/bin/bootseer"])
    assert res.output.strip() == "/opt/bootseer/bin/bootseer"


TOOL = "#!/opt/venv/bin/python\nimport sys, tinypkg\nprint('tool', tinypkg.VERSION, *sys.argv[1:])\nsys.exit(7)\n"


def _job(d: Path) -> None:
    """The job's env is /opt/venv, made by the setup; its launcher `tool` is a script in the venv."""
    import json
    import shlex

    whl = make_wheel(d)
    setup = [
        "echo ran >> /job/setups.log",
        "python3 -m venv /opt/venv",
        f"/opt/venv/bin/pip install -q --no-cache-dir --no-index --no-deps /job/{whl.name}",
        f"printf %s {shlex.quote(TOOL)} > /opt/venv/bin/tool && chmod +x /opt/venv/bin/tool",
    ]
    (d / "bootseer.toml").write_text(
        '[env]\nroots = ["/opt/venv"]\nsetup = [' + ", ".join(json.dumps(s) for s in setup) + "]\n"
    )


def test_fresh_containers_restore_the_launchers_env(docker_client: Any, debian_app: str, tmp_path: Path) -> None:
    """A cold start builds /opt/venv and runs the launcher by its path in it; fresh containers on the warm
    store restore it and run the launcher by path, by name on PATH, and through the entrypoint hook."""
    job = tmp_path / "job"
    job.mkdir()
    _job(job)
    store = tmp_path / "store"
    store.mkdir()
    binds = {str(job): {"bind": "/job", "mode": "rw"}, str(store): {"bind": "/store", "mode": "rw"}}
    env = {"BOOTSEER_STORE": "file:///store", "BOOTSEER_EXEC_AGENT": "0"}

    def run(command: list[str], **kw: Any) -> engine.RunResult:
        return engine.run_container(
            docker_client, debian_app, command, environment=env, binds=binds, working_dir="/job", **kw
        )

    cold = run(["bootseer", "exec", "--", "/opt/venv/bin/tool", "a"])
    assert cold.exit_code == 7, cold.output
    assert "tool 1.0 a" in cold.output
    assert "warning" not in cold.output, "no false alarm about the files Docker wrote (/etc/hosts, …)"
    warm = run(["bootseer", "exec", "--", "/opt/venv/bin/tool", "b"])
    assert warm.exit_code == 7 and "tool 1.0 b" in warm.output, warm.output
    env["PATH"] = "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"
    by_name = run(["bootseer", "exec", "--", "tool", "c"])
    assert by_name.exit_code == 7 and "tool 1.0 c" in by_name.output, by_name.output
    hooked = run(["/opt/venv/bin/tool", "d"], entrypoint=["/usr/local/bin/bootseer-entrypoint"])
    assert hooked.exit_code == 7 and "tool 1.0 d" in hooked.output, hooked.output
    assert (job / "setups.log").read_text() == "ran\n", "the fresh containers restored, none ran the setup"
    missing = run(["bootseer", "exec", "--", "no-such-launcher"])
    assert missing.exit_code == 127
    assert f"bootseer: error: no-such-launcher: command not found (PATH={env['PATH']})" in missing.output
