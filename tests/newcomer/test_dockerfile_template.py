"""The Dockerfile template installs bootseer from a wheel the user names, never from the package index
(where no bootseer exists), and `init --list` shows the `--set` values of each template (issue 29 item 7)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.templates import render
from tests.support import images, pkgindex

KNOBS = ("BASE_IMAGE", "SOURCE", "BOOTSEER_SPEC", "PIP_ARGS", "VENV_ARGS")


def test_init_list_shows_each_templates_set_values() -> None:
    r = subprocess.run([sys.executable, "-m", "bootseer_cli", "init", "--list"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("Dockerfile.bootseer "))
    knobs = lines[i + 1]
    assert "--set BASE_IMAGE (required)" in knobs, knobs
    for name in KNOBS:
        assert name in knobs, knobs
    k8s = lines[next(n for n, line in enumerate(lines) if line.startswith("k8s-job.yaml ")) + 1]
    assert "IMAGE, STORE (required)" in k8s and "NODES" in k8s, k8s
    toml = lines[next(n for n, line in enumerate(lines) if line.startswith("bootseer.toml ")) + 1]
    assert toml.strip() == "--set: nothing"


def test_the_template_documents_its_knobs_and_names_no_index_package() -> None:
    text = render("Dockerfile.bootseer", {"BASE_IMAGE": "registry.example/train:1.0"})
    header = text.split("\nFROM ", 1)[0]
    for name in KNOBS:
        assert f"#   {name} " in header, f"{name} is not documented in the template's header"
    install = next(line for line in text.splitlines() if "-m pip install" in line and not line.startswith("#"))
    assert install.rstrip(" \\").split()[-1] == "/tmp/bootseer-dist/bootseer-*.whl", install
    assert "COPY bootseer-dist /tmp/bootseer-dist" in text
    readme = (images.REPO_ROOT / "README.md").read_text()
    for name in KNOBS:
        assert f"`{name}`" in readme, f"the README does not name {name}"


def _bootseer_wheel(dest: Path) -> Path:
    """bootseer's wheel, built from this working tree as a user builds it from a checkout."""
    with tempfile.TemporaryDirectory(prefix="bootseer-src-") as tmp:
        src = Path(tmp) / "src"
        for p in images._source_files():
            target = src / p.relative_to(images.REPO_ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)
        (src / "src/bootseer_cli/templates").symlink_to("../../templates")
        argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest)]
        subprocess.run([*argv, str(src)], check=True, capture_output=True, timeout=300, env=pkgindex.clean_env())
    (wheel,) = dest.glob("bootseer-*.whl")
    return wheel


@pytest.fixture(scope="module")
def docker_client() -> Iterator[Any]:
    from tests.containers.conftest import _engine

    client = _engine()
    yield client
    client.close()


@pytest.mark.integration
def test_the_rendered_dockerfile_builds_from_a_wheel_of_this_tree(docker_client: Any, tmp_path: Path) -> None:
    """Rendered with its defaults for where bootseer comes from (bootseer-dist/ in the build context); the
    base already holds bootseer's dependencies, so the build needs no network and takes seconds."""
    import docker.errors

    base = images.ensure_base(docker_client)
    dockerfile = render(
        "Dockerfile.bootseer",
        {"BASE_IMAGE": base, "VENV_ARGS": "--system-site-packages --without-pip", "PIP_ARGS": "--no-index"},
    )
    ctx = tmp_path / "ctx"
    _bootseer_wheel(ctx / "bootseer-dist")
    (ctx / "Dockerfile").write_text(dockerfile)
    tag = f"bootseer-test-wheel:{tmp_path.name.lower()}"
    try:
        docker_client.images.build(path=str(ctx), tag=tag, network_mode="none", rm=True, forcerm=True)
    except docker.errors.BuildError as e:
        log = "".join(str(x.get("stream", x.get("error", ""))) for x in e.build_log)
        pytest.fail(f"the rendered Dockerfile does not build from the wheel:\n{log[-3000:]}")
    try:
        out = docker_client.containers.run(
            tag, ["sh", "-c", "bootseer --version && readlink /usr/local/bin/bootseer"], entrypoint=[], remove=True
        ).decode()
        assert "0.1.0" in out and "/opt/bootseer/bin/bootseer" in out, out
        where = docker_client.containers.run(
            tag,
            ["/opt/bootseer/bin/python", "-c", "import bootseer_cli; print(bootseer_cli.__file__)"],
            entrypoint=[],
            remove=True,
        ).decode()
        assert where.startswith("/opt/bootseer/lib/"), where  # from the wheel, into bootseer's own venv
    finally:
        docker_client.images.remove(tag, force=True)


@pytest.mark.parametrize("name", ["github-actions-prewarm.yml", "gitlab-ci-prewarm.yml"])
def test_the_ci_templates_install_a_named_wheel_not_the_index(name: str) -> None:
    text = render(name, {"IMAGE": "registry.example/team/train"})
    install = next(line for line in text.splitlines() if "python3 -m pip install" in line and "docker" not in line)
    assert install.split()[-1] == "./bootseer-dist/bootseer-*.whl", install
    assert "BOOTSEER_SPEC" in text.split("\nname:", 1)[0] or "--set BOOTSEER_SPEC" in text, "the knob is documented"
