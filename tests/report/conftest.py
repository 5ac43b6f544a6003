"""A generated 1,000-node job (with two restarted nodes), written once per session through events.upload."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import pytest

from bootseer_cli.store.core import Store
from tests.report.support import node_events, write_run

BIG_NODES = 1000
STRAGGLER = "node-0613"
ENV_MISS_EVERY = 97
RESTARTED = ("node-0001", "node-0002")


@dataclass
class BigJob:
    uri: str
    job: str
    rows: list[dict[str, Any]]


@pytest.fixture(scope="session")
def big_job(tmp_path_factory: pytest.TempPathFactory) -> BigJob:
    tmp = tmp_path_factory.mktemp("big")
    store = Store((tmp / "store").as_uri())
    rng = random.Random(7)
    base = time.time() - 3600
    rows: list[dict[str, Any]] = []
    for node in RESTARTED:  # an earlier, slower start of two nodes: the report must show the latest
        evs = node_events(base - 600, rng, env_miss=True)
        rows += write_run(store, tmp, "big", node, int(node[-4:]), "20260101T000000-00000000", evs)
    for k in range(BIG_NODES):
        node = f"node-{k:04d}"
        evs = node_events(
            base + rng.uniform(0, 2),
            rng,
            env_miss=k % ENV_MISS_EVERY == 5,
            ckpt_s=60.0 if node == STRAGGLER else None,
        )
        rows += write_run(store, tmp, "big", node, k, "20260101T010000-11111111", evs)
    return BigJob(uri=store.uri, job="big", rows=rows)
