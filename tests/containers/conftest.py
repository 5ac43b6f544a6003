"""Session fixtures for the container tests: a real engine, a local registry, and a cached test image.

The image is built from this machine's own files (no Docker Hub here), pushed to the registry and
pulled back by digest, exactly the path a CI pre-warm job takes; see tests/support/images.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import images


def _engine() -> Any:
    """The engine, started here if it is not running (dockerd is installed in CI)."""
    import docker

    try:
        client = docker.from_env(timeout=300)
        client.ping()
        return client
    except Exception:
        pass
    subprocess.Popen(["dockerd"], stdout=open("/tmp/dockerd.log", "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            client = docker.from_env(timeout=300)
            client.ping()
            return client
        except Exception:
            time.sleep(0.5)
    raise RuntimeError("no Docker engine and dockerd did not start (see /tmp/dockerd.log)")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    client = _engine()
    yield client
    client.close()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[images.Registry]:
    reg = images.Registry(tmp_path_factory.mktemp("registry"), storage=images.CACHE_DIR / "registry").start()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def test_image(docker_client: Any, registry: images.Registry) -> Iterator[images.TestImage]:
    """bootseer's test image, as pulled from the registry by digest."""
    base = images.ensure_base(docker_client)
    app = images.ensure_app(docker_client, base)
    yield images.publish(docker_client, registry, app, "bootseer-test")
    images.forget_registry(docker_client, registry)


@pytest.fixture(scope="session")
def other_image(docker_client: Any, registry: images.Registry, test_image: images.TestImage) -> images.TestImage:
    """A second image (the test image plus a label): a different digest."""
    return images.publish(docker_client, registry, images.variant(docker_client, test_image.ref, "b"), "bootseer-b")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


def write_project(d: Path, setup: list[str], requirements: str = "tinypkg==1.0\n", extra: str = "") -> Path:
    """A bootseer.toml and its requirements file in `d`; returns the config path."""
    (d / "requirements.txt").write_text(requirements)
    lines = ", ".join(f'"{s}"' for s in setup)
    cfg = d / "bootseer.toml"
    cfg.write_text(f'[env]\nroots = ["/usr/local"]\nsetup = [{lines}]\n{extra}')  # where pip installs
    return cfg


def make_wheel(d: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A pure-Python wheel written by hand (no index or build backend needed inside the image)."""
    import base64
    import hashlib
    import zipfile

    files = {
        f"{name}/__init__.py": f'VERSION = "{version}"\n'.encode(),
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    record += f"{name}-{version}.dist-info/RECORD,,\n"
    whl = d / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return whl


PROBE = "python3 -c 'import tinypkg'"


def project(d: Path, setup: list[str] | None = None) -> Path:
    """A job directory: bootseer.toml whose setup installs a wheel shipped next to it."""
    from bootseer_cli.containers.prewarm import WORKDIR

    whl = make_wheel(d)
    (d / "requirements.txt").write_text(f"{WORKDIR}/{whl.name}\n")
    setup = setup or ["pip install --no-index --no-deps -r requirements.txt"]
    (d / "bootseer.toml").write_text(
        '[env]\nroots = ["/usr/local"]\nsetup = [' + ", ".join(json.dumps(s) for s in setup) + "]\n"
        f'files = ["{whl.name}"]\n\n[image]\nenabled = true\n'
    )
    return d / "bootseer.toml"


@dataclass
class Prewarmed:
    job: Path  # the job's directory (bootseer.toml, requirements, wheel)
    store_dir: Path  # the file:// store prewarm published to
    out: dict[str, Any]  # prewarm --json
    stderr: str


@pytest.fixture(scope="session")
def prewarmed(test_image: images.TestImage, tmp_path_factory: pytest.TempPathFactory) -> Prewarmed:
    """One CI pre-warm of the test image, run as the GitHub Actions template's pre-warm step runs it."""
    import yaml

    from bootseer_cli.templates import render

    root = tmp_path_factory.mktemp("prewarmed")
    job = root / "job"
    job.mkdir()
    project(job)
    store_dir = root / "store"
    workflow = yaml.safe_load(render("github-actions-prewarm.yml", {"IMAGE": "unused", "PROBE": PROBE}))
    job_spec = workflow["jobs"]["prewarm"]
    step = next(s for s in job_spec["steps"] if s.get("id") == "prewarm")
    env = dict(os.environ, IMAGE=test_image.ref, PROBE=job_spec["env"]["PROBE"], BOOTSEER_STORE=store_dir.as_uri())
    env["GITHUB_OUTPUT"] = str(root / "github_output")
    r = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=job, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (root / "github_output").read_text().strip() == f"pinned={test_image.pinned}"
    return Prewarmed(job=job, store_dir=store_dir, out=json.loads((job / "prewarm.json").read_text()), stderr=r.stderr)


DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-pip")  # a plain Debian 12 with its Python
DEBIAN_MIRROR = os.environ.get("BOOTSEER_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@pytest.fixture(scope="session")
def debian12_base(docker_client: Any) -> str:
    """A plain Debian 12 image with its own python3 (PEP 668 marked), made without any registry.

    `debootstrap --variant=minbase` then `docker import`, cached in the engine by its inputs and the
    packages in images.CACHE_DIR/debootstrap, so only the first run on a machine pays (about a minute).
    Debian's mirror is the one network use: the packages a user's base image would hold anyway.
    """
    import hashlib
    import shutil
    import tempfile

    import docker.errors

    tag = "bootseer-test-debian12:" + hashlib.sha256(repr((DEBIAN_PACKAGES, "minbase")).encode()).hexdigest()[:12]
    try:
        docker_client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is not installed (apt-get install debootstrap)")
    debs = images.CACHE_DIR / "debootstrap"
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bootseer-debian-") as tmp:
        root = Path(tmp) / "rootfs"
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", f"--cache-dir={debs}"]
        r = subprocess.run([*argv, "bookworm", str(root), DEBIAN_MIRROR], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"debootstrap failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        archive = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(archive), "."], check=True, timeout=300)
        repo, _, version = tag.partition(":")
        docker_client.api.import_image(
            src=str(archive), repository=repo, tag=version, changes=["ENV PATH=/usr/local/bin:/usr/bin:/bin"]
        )
    docker_client.images.get(tag)
    return tag
