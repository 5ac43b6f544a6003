"""Fixtures of the real-trainer tests: one store and one image for the session (both jobs share the env
their identical [env] sections key), and nodes of a job made on demand."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster, image_ref
from tests.trainers.harness import VENV_AT, TrainerNode
from tests.trainers.scenario import Scenario, run_scenario


class TrainerStore:
    """The session's store (file://) and image reference: the second job's first start finds the env."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = (root / "store").as_uri()
        self.image = image_ref()


@pytest.fixture(scope="session")
def trainer_store(tmp_path_factory: pytest.TempPathFactory) -> TrainerStore:
    return TrainerStore(tmp_path_factory.mktemp("trainers"))


def make_nodes(store: TrainerStore, trainer: str) -> tuple[Cluster, Callable[[str], TrainerNode]]:
    cluster = Cluster(store.root / f"{trainer}-nodes", index=None, image=store.image)  # type: ignore[arg-type]
    job_id = f"{trainer}-{uuid.uuid4().hex[:8]}"

    def node(name: str) -> TrainerNode:
        n = TrainerNode(
            cluster.root / name,
            name,
            store.uri,
            job_id,
            venv_at=VENV_AT,
            env_extra={"BOOTSEER_IMAGE": store.image},
        )
        n.trainer = trainer
        cluster.nodes.append(n.create())
        return n

    return cluster, node


@pytest.fixture(scope="module", params=["hf", "lightning"])
def scenario(request: pytest.FixtureRequest, trainer_store: TrainerStore) -> Iterator[Scenario]:
    """The scenario of one trainer's job (scenario.py), run once; its nodes are cleaned up after."""
    cluster, node = make_nodes(trainer_store, request.param)
    try:
        yield run_scenario(node)
    finally:
        cluster.close()
        shutil.rmtree(cluster.root, ignore_errors=True)  # two 1.2 GB venvs
