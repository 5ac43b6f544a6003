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
    env_kind,
    kill_node_processes,
    wait_all,
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
        from bootseer_cli.store.core import open_store

        uri = server.uri(f"seed-{uuid.uuid4().hex[:6]}")
        store = open_store(uri).in_domain("")  # the store's top level: every domain and the blobs, as they are
        for path in sorted(self.store_dir.rglob("*")):
            if path.is_file():
                store.put_bytes(path.relative_to(self.store_dir).as_posix(), path.read_bytes())
        return uri


class Cold:
    """The cold start of the example job on two nodes at once over an empty S3 store (both start
    together: one builds the env, the other waits for it and restores it; n1 pushes its checkpoint)."""

    def __init__(self, cluster: Cluster, store_uri: str, n1: Node, n2: Node, runs: list[Run]) -> None:
        self.cluster = cluster
        self.store_uri = store_uri
        self.n1 = n1
        self.n2 = n2
        self.runs = runs
        self.store_dir: Path | None = None  # the store as the cold start left it (a local copy)


def download_store(uri: str, dest: Path) -> Path:
    """Every object of the store at `uri` (all domains and the blobs) into a file:// store at `dest`,
    leaving out the S3-only `.keep` objects that keep a prefix alive on an object store."""
    from bootseer_cli.store.core import open_store
    from bootseer_cli.store.fs import KEEP_NAME

    store = open_store(uri).in_domain("")
    for rel in store.list("", recursive=True):
        if rel.rsplit("/", 1)[-1] == KEEP_NAME or rel.endswith("/"):
            continue
        data = store.get_bytes(rel)
        assert data is not None, rel
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return dest


@pytest.fixture(scope="session")
def cold(tmp_path_factory: pytest.TempPathFactory, pkg_index: PackageIndex, s3_server: S3Server) -> Iterator[Cold]:
    """test_job's cold start, run once per session: test_cold_start_then_restart asserts on it (and
    restarts its nodes); `seed` is a copy of the store it left, taken before anything else ran on it."""
    root = tmp_path_factory.mktemp("e2e-cold")
    c = Cluster(root / "nodes", pkg_index)
    try:
        store_uri = s3_server.uri(f"cold-{c.job_id}")
        n1 = c.node("n1", store_uri)
        n2 = c.node("n2", store_uri)
        runs = wait_all([n1.start(steps=3), n2.start(steps=3, train_args=["--no-push"])])
        cold = Cold(c, store_uri, n1, n2, runs)
        if all(r.rc == 0 for r in runs):
            cold.store_dir = download_store(store_uri, root / "store")
        yield cold
    finally:
        c.close()
        with contextlib.suppress(OSError):
            os.sync()


@pytest.fixture(scope="session")
def seed(cold: Cold) -> Seed:
    """A store where the job already ran once: the one the cold start left (env snapshot, hot-block
    record, n1's checkpoint), so the scenarios that start from it pay for no cold start of their own."""
    run = cold.runs[0]
    assert run.rc == 0 and cold.store_dir is not None, run.output[-4000:]
    saved = run.one("saved")
    assert run.train("pushed"), run.output[-4000:]
    builder = next(n for n, r in zip((cold.n1, cold.n2), cold.runs, strict=True) if env_kind(r) == "built")
    return Seed(cold.store_dir, cold.cluster.image, int(saved["step"]), saved["weights"], builder.pip_freeze())


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
