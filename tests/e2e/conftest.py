"""Fixtures of the end-to-end suite: the loopback package index, clusters of nodes, a warm seed store.

Most scenarios start from a store where the job has already run once (its env snapshot and a
checkpoint published); building that state costs one cold start, so it is built once per session
(`seed`) and copied into each test's own store.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import (
    EXAMPLE,
    NEW_TABULATE,
    OLD_TABULATE,
    VENV_AT,
    Node,
    PackageIndex,
    Run,
    build_index,
    kill_node_processes,
)
from tests.support.s3server import S3Server


def image_ref() -> str:
    """A pinned image reference of our own, so each cluster's keys (and records) are its own."""
    return f"bootseer-e2e@sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def pkg_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    server = PackageIndex(build_index(tmp_path_factory.mktemp("e2e-index"))).start()
    yield server
    server.stop()


class Cluster:
    """Nodes of one (or several) jobs on this machine, sharing the stores a test gives them."""

    def __init__(self, root: Path, index: PackageIndex, image: str | None = None) -> None:
        self.root = root
        self.index = index
        self.image = image or image_ref()
        self.nodes: list[Node] = []
        self.job_id = f"e2e-{uuid.uuid4().hex[:8]}"

    def node(
        self,
        name: str,
        store_uri: str,
        job_id: str | None = None,
        requirements: str | None = None,
        isolated: bool = True,
        **env: str,
    ) -> Node:
        root = self.root / name
        venv_at = VENV_AT if isolated else root / "venv"
        node = Node(
            root,
            name,
            store_uri,
            job_id or self.job_id,
            index=self.index,
            venv_at=venv_at,
            # The hot-block record covers the venv (the default roots, the whole interpreter prefix and
            # the system libraries, would evict and re-read gigabytes of torch on every cold test).
            env_extra={"BOOTSEER_IMAGE": self.image, "BOOTSEER_IMAGE_ROOTS": str(venv_at), **env},
        )
        self.nodes.append(node.create(requirements))
        return node

    def close(self) -> list[int]:
        """Kill whatever a node left running (a test asserts there was nothing) and unmount leftovers."""
        left = [pid for n in self.nodes for pid in n.processes()]
        for n in self.nodes:
            kill_node_processes(n)
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f if str(self.root) in line.split()[1]]
        for mp in mounts:
            subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
        return left


@pytest.fixture
def cluster(tmp_path: Path, pkg_index: PackageIndex) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "nodes", pkg_index)
    yield c
    c.close()


class Seed:
    """A store in which the example job already ran once: its env snapshot and checkpoint published."""

    def __init__(self, store_dir: Path, image: str, saved_step: int, saved_weights: str, freeze: str) -> None:
        self.store_dir = store_dir
        self.image = image
        self.saved_step = saved_step
        self.saved_weights = saved_weights
        self.freeze = freeze

    def copy_to(self, dest: Path) -> Path:
        shutil.copytree(self.store_dir, dest)
        return dest

    def file_store(self, tmp_path: Path) -> str:
        return self.copy_to(tmp_path / f"store-{uuid.uuid4().hex[:6]}").as_uri()

    def s3_store(self, server: S3Server) -> str:
        """A copy of the seed store uploaded to `server` (under a prefix of its own)."""
        from bootseer_cli.store import open_store

        uri = server.uri(f"seed-{uuid.uuid4().hex[:6]}")
        store = open_store(uri).in_domain("")  # the store's top level: every domain and the blobs, as they are
        for path in sorted(self.store_dir.rglob("*")):
            if path.is_file():
                store.put_bytes(path.relative_to(self.store_dir).as_posix(), path.read_bytes())
        return uri


@pytest.fixture(scope="session")
def seed(tmp_path_factory: pytest.TempPathFactory, pkg_index: PackageIndex) -> Iterator[Seed]:
    root = tmp_path_factory.mktemp("e2e-seed")
    store = root / "store"
    c = Cluster(root / "nodes", pkg_index)
    try:
        node = c.node("seed", store.as_uri(), BOOTSEER_EXEC_SKIP="image")
        run = node.run_job(steps=2)
        assert run.rc == 0, run.output[-4000:]
        saved = run.one("saved")
        assert run.train("pushed"), run.output[-4000:]
        yield Seed(store, c.image, int(saved["step"]), saved["weights"], node.pip_freeze())
    finally:
        c.close()
        with contextlib.suppress(OSError):
            os.sync()


class Changed:
    """A copy of the seed store on which a node with a changed requirements file ran the job once."""

    def __init__(self, store: str, node: Node, built: Run) -> None:
        self.store = store
        self.node = node
        self.built = built


@pytest.fixture(scope="session")
def changed(tmp_path_factory: pytest.TempPathFactory, pkg_index: PackageIndex, seed: Seed) -> Iterator[Changed]:
    """The seed store after a node whose requirements file names another tabulate started the job: it
    built and published that second env. Built once for the tests that need a store holding both envs
    (test_job's changed-requirements test asserts on this start; test_env_switch switches a node
    carrying the old env to it); none of them writes to the store afterwards."""
    root = tmp_path_factory.mktemp("e2e-changed")
    c = Cluster(root / "nodes", pkg_index, image=seed.image)
    try:
        store = seed.file_store(root)
        changed = (EXAMPLE / "requirements.txt").read_text().replace(OLD_TABULATE, NEW_TABULATE)
        fresh = c.node("fresh", store, requirements=changed, BOOTSEER_EXEC_SKIP="image")
        built = fresh.run_job(steps=1, train_args=["--no-push"])
        yield Changed(store, fresh, built)
    finally:
        c.close()
