"""The Docker engine side: digests, missing images and engines, leftover containers."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.containers import engine
from bootseer_cli.errors import BootseerError
from tests.support import images

from .conftest import write_project


def test_split_ref() -> None:
    assert engine.split_ref("127.0.0.1:5000/a/b:1.0") == ("127.0.0.1:5000/a/b", "1.0", None)
    assert engine.split_ref("127.0.0.1:5000/a/b") == ("127.0.0.1:5000/a/b", None, None)
    assert engine.split_ref("repo:t@sha256:ab") == ("repo", "t", "sha256:ab")
    assert engine.split_ref("ubuntu") == ("ubuntu", None, None)


def test_digest_prefers_the_named_registry() -> None:
    attrs = {"Id": "sha256:id", "RepoDigests": ["a.example/x@sha256:aaa", "b.example/x@sha256:bbb"]}
    assert engine.digest_of(attrs, "b.example/x:1") == ("sha256:bbb", "b.example/x@sha256:bbb", "registry digest")
    assert engine.digest_of(attrs, "c.example/x:1")[0] == "sha256:aaa"  # same image, pushed elsewhere
    assert engine.digest_of({"Id": "sha256:id", "RepoDigests": []}, "x:1") == ("sha256:id", "sha256:id", "image id")
    assert engine.digest_of({"Id": "sha256:id"}, "x@sha256:pin")[0] == "sha256:pin"
    hub = {"Id": "sha256:id", "RepoDigests": ["ubuntu@sha256:u"]}
    assert engine.digest_of(hub, "docker.io/library/ubuntu:22.04")[1] == "ubuntu@sha256:u"


def test_leftover_rule() -> None:
    me = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert engine.is_leftover({engine.LABEL: f"{me}:{dead.pid}"})
    assert not engine.is_leftover({engine.LABEL: f"{me}:{os.getppid()}"})  # its prewarm still runs
    old = {engine.LABEL: "other-host:1", engine.LABEL_CREATED: str(time.time() - 7 * 3600)}
    assert engine.is_leftover(old)
    assert not engine.is_leftover({engine.LABEL: "other-host:1", engine.LABEL_CREATED: str(time.time())})


def test_no_engine_names_the_socket(tmp_path: Path) -> None:
    cfg = write_project(tmp_path, ["true"])
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/docker.sock")
    r = subprocess.run(
        ["bootseer", "prewarm", "--image", "x:1", "-c", str(cfg), "--store", (tmp_path / "s").as_uri()],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode != 0
    assert f"{tmp_path}/docker.sock" in r.stderr and "Traceback" not in r.stderr
    # An address that exists but answers nothing is named too.
    (tmp_path / "docker.sock").write_text("")
    with pytest.raises(BootseerError, match=r"cannot reach the Docker engine at unix://.*docker\.sock"):
        os.environ["DOCKER_HOST"] = env["DOCKER_HOST"]
        try:
            engine.connect(timeout=2)
        finally:
            del os.environ["DOCKER_HOST"]
    assert engine.resolve_local_digest("x:1") is None  # keys.compute never fails for want of an engine


@pytest.mark.integration
def test_registry_digest_and_local_id(docker_client: Any, test_image: images.TestImage) -> None:
    by_tag = engine.resolve_image(docker_client, test_image.ref, pull=False)
    assert by_tag.digest == test_image.digest and by_tag.source == "registry digest"
    assert by_tag.pinned == test_image.pinned
    by_digest = engine.resolve_image(docker_client, test_image.pinned, pull=False)
    assert by_digest.digest == test_image.digest and by_digest.image_id == test_image.image_id
    assert engine.resolve_local_digest(test_image.ref) == test_image.digest
    local = images.variant(docker_client, test_image.ref, "local-only")
    resolved = engine.resolve_image(docker_client, local, pull=False)
    assert resolved.source == "image id" and resolved.digest == docker_client.images.get(local).id


@pytest.mark.integration
def test_missing_image_is_one_line(registry: images.Registry, tmp_path: Path, docker_client: Any) -> None:
    cfg = write_project(tmp_path, ["true"])
    for ref in (f"{registry.host}/does-not-exist:1", "127.0.0.1:9/nothing-listens-here:1"):
        r = subprocess.run(
            ["bootseer", "prewarm", "--image", ref, "-c", str(cfg), "--store", (tmp_path / "s").as_uri()],
            capture_output=True, text=True,
        )  # fmt: skip
        assert r.returncode == 1, r.stderr
        assert f"image {ref} is not on this engine and cannot be pulled" in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_leftover_container_is_removed_next_time(
    docker_client: Any, test_image: images.TestImage, tmp_path: Path
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = socket.gethostname()
    leftover = docker_client.containers.create(
        test_image.pinned, ["sleep", "600"], network_mode="none", labels={engine.LABEL: f"{me}:{dead.pid}"}
    )
    leftover.start()
    alive = docker_client.containers.create(
        test_image.pinned, ["sleep", "600"], network_mode="none", labels={engine.LABEL: f"{me}:{os.getpid()}"}
    )
    try:
        cfg = write_project(tmp_path, ["true"])
        # Any prewarm cleans up first, even one that then fails on its image.
        r = subprocess.run(
            ["bootseer", "prewarm", "--image", "127.0.0.1:9/none:1", "-c", str(cfg),
             "--store", (tmp_path / "s").as_uri()],
            capture_output=True, text=True,
        )  # fmt: skip
        assert r.returncode == 1
        assert f"removed container {leftover.name} left behind by an interrupted prewarm" in r.stderr
        names = {c.name for c in docker_client.containers.list(all=True)}
        assert leftover.name not in names
        assert alive.name in names  # the test process (its owner) is alive: not a leftover
    finally:
        for c in (leftover, alive):
            with contextlib.suppress(Exception):
                c.remove(force=True)


@pytest.mark.integration
def test_a_leftover_removed_by_someone_else_while_listed_is_no_error(
    docker_client: Any, test_image: images.TestImage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK lists the containers, then inspects each: a leftover another cleanup removes in between
    (seen in CI as a prewarm's traceback, `No such container`) is simply not there to remove."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = docker_client.containers.create(
        test_image.pinned, ["true"], network_mode="none", labels={engine.LABEL: f"{socket.gethostname()}:{dead.pid}"}
    )
    real = docker_client.api.inspect_container

    def someone_else_removes_it_first(cid: str) -> Any:
        if gone.id.startswith(cid) or cid.startswith(gone.id):
            docker_client.api.remove_container(gone.id, force=True)  # the real engine, just before
        return real(cid)

    monkeypatch.setattr(docker_client.api, "inspect_container", someone_else_removes_it_first)
    try:
        assert gone.name not in engine.remove_leftovers(docker_client)
    finally:
        with contextlib.suppress(Exception):
            gone.remove(force=True)


def test_killed_prewarm_leaves_a_container_the_next_one_removes(
    docker_client: Any, test_image: images.TestImage, tmp_path: Path
) -> None:
    cfg = write_project(tmp_path, ["sleep 120"])
    store = (tmp_path / "s").as_uri()
    proc = subprocess.Popen(
        ["bootseer", "prewarm", "--image", test_image.ref, "-c", str(cfg), "--store", store],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    owner = f"{socket.gethostname()}:{proc.pid}"
    try:
        deadline = time.time() + 120
        found: list[Any] = []
        # not the short `keys` container that comes first: the prewarm may remove it between this
        # list and the kill, and then nothing is left behind (CI, stop 36)
        while time.time() < deadline and not found:
            found = [
                c
                for c in docker_client.containers.list(filters={"label": f"{engine.LABEL}={owner}"})
                if not c.name.startswith("bootseer-prewarm-keys-")
            ]
            time.sleep(0.5)
        assert found, "the prewarm's setup container never started"
    finally:
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait()
    (left,) = docker_client.containers.list(all=True, filters={"label": f"{engine.LABEL}={owner}"})
    r = subprocess.run(
        ["bootseer", "prewarm", "--image", "127.0.0.1:9/none:1", "-c", str(cfg), "--store", store],
        capture_output=True, text=True,
    )  # fmt: skip
    assert f"removed container {left.name} left behind by an interrupted prewarm" in r.stderr, r.stderr
    assert not docker_client.containers.list(all=True, filters={"label": f"{engine.LABEL}={owner}"})


@pytest.mark.integration
def test_image_without_bootseer(docker_client: Any, test_image: images.TestImage, tmp_path: Path) -> None:
    base = images.ensure_base(docker_client)  # the test image before bootseer was installed on it
    cfg = write_project(tmp_path, ["true"])
    r = subprocess.run(
        ["bootseer", "prewarm", "--image", base, "-c", str(cfg), "--store", (tmp_path / "s").as_uri()],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 127
    assert f"bootseer is not installed in {base}" in r.stderr and "Traceback" not in r.stderr
    assert not docker_client.containers.list(all=True, filters={"label": engine.LABEL})
