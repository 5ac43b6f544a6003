"""Session fixtures for the container tests: a real engine, a local registry, and a cached test image.

The image is built from this machine's own files (no Docker Hub here), pushed to the registry and
pulled back by digest, exactly the path a CI pre-warm job takes; see tests/support/images.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
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
def test_image(docker_client: Any, registry: images.Registry) -> images.TestImage:
    """bootseer's test image, as pulled from the registry by digest."""
    base = images.ensure_base(docker_client)
    app = images.ensure_app(docker_client, base)
    return images.publish(docker_client, registry, app, "bootseer-test")


@pytest.fixture(scope="session")
def other_image(docker_client: Any, registry: images.Registry, test_image: images.TestImage) -> images.TestImage:
    """A second image (the test image plus a label): a different digest."""
    return images.publish(docker_client, registry, images.variant(docker_client, test_image.ref, "b"), "bootseer-b")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d
