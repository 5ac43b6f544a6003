"""No node outlives its test: a failed assertion must not leave `bootseer p2p fetch` processes behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.p2p.nodes import STARTED


@pytest.fixture(autouse=True)
def _kill_nodes() -> Iterator[None]:
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
