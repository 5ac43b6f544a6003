"""Integration with real torch: a compiled model restarts on a second "node" and compiles nothing new.

Two compiles in this file (each ~20 s cold on a 2-core machine): node A compiles cold and publishes;
node B (own cache directory, same store) restores and must hit PyTorch's FX graph cache only.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootseer_cli.compilecache import key as keymod
from bootseer_cli.compilecache.index import read_index
from bootseer_cli.compilecache.stage import run_stage
from bootseer_cli.stage import StageContext
from bootseer_cli.store import blob_path, open_store

from .conftest import node_ctx, publish_as_agent, run_model

pytest.importorskip("torch")


@dataclass
class NodeA:
    root: Path
    store_uri: str
    ctx: StageContext
    counters: dict[str, object]
    published: int
    key: str


@pytest.fixture(scope="module")
def node_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeA]:
    """Node A: empty store, cold compile, then the agent's publish."""
    root = tmp_path_factory.mktemp("compile")
    store_uri = (root / "store").as_uri()
    with pytest.MonkeyPatch.context() as mp:
        for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR"):
            mp.delenv(var, raising=False)
        ctx = node_ctx(root, "node-a", store_uri)
        res = run_stage(ctx)
    assert res.outcome == "miss", res
    assert set(ctx.exports) == {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR"}
    counters = run_model(ctx.exports)
    agent = publish_as_agent(ctx)
    index = read_index(open_store(store_uri), res.extra["compile_key"])
    assert index.entries, agent.lines
    yield NodeA(root, store_uri, ctx, counters, len(index.entries), res.extra["compile_key"])


def test_second_node_restores_and_compiles_nothing_new(node_a: NodeA) -> None:
    assert node_a.counters["inductor"].get("fxgraph_cache_miss", 0) >= 1  # type: ignore[union-attr]
    ctx = node_ctx(node_a.root, "node-b", node_a.store_uri)
    res = run_stage(ctx)
    assert res.outcome == "hit" and res.extra["files"] == node_a.published and res.extra["compile_key"] == node_a.key, (
        res
    )
    assert ctx.exports["TORCHINDUCTOR_CACHE_DIR"] != node_a.ctx.exports["TORCHINDUCTOR_CACHE_DIR"]
    counters = run_model(ctx.exports)
    inductor = counters["inductor"]
    assert inductor.get("fxgraph_cache_hit", 0) > 0 and inductor.get("fxgraph_cache_miss", 0) == 0, counters  # type: ignore[union-attr]
    print(f"first compiled call: cold {node_a.counters['first_s']:.1f} s, restored {counters['first_s']:.1f} s")
    publish_as_agent(ctx)
    after = read_index(open_store(node_a.store_uri), node_a.key)
    assert len(after.entries) == node_a.published  # nothing new was compiled, so no new path


def test_other_torch_version_or_device_restores_nothing(node_a: NodeA, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = node_ctx(node_a.root, "node-c", node_a.store_uri, device="NVIDIA H100 80GB HBM3")
    res = run_stage(ctx)
    assert res.outcome == "miss" and res.extra["files"] == 0 and res.extra["compile_key"] != node_a.key
    monkeypatch.setattr(keymod, "torch_version", lambda: "2.99.0+cpu")
    ctx = node_ctx(node_a.root, "node-d", node_a.store_uri)
    res = run_stage(ctx)
    assert res.outcome == "miss" and res.extra["files"] == 0 and res.extra["compile_key"] != node_a.key
    assert not any(Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.so"))


def test_corrupt_blob_is_dropped_and_repaired_by_the_next_publish(
    node_a: NodeA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir = tmp_path / "store"
    shutil.copytree(Path(node_a.root / "store"), store_dir)
    store = open_store(store_dir.as_uri())
    index = read_index(store, node_a.key)
    victim_rel, victim = sorted(index.entries.items())[0]
    blob = Path(store.path(blob_path(victim.digest)))
    good = blob.read_bytes()
    blob.write_bytes(bytes(b ^ 0xFF for b in good))  # same size, other bytes

    sharing = sum(1 for e in index.entries.values() if e.digest == victim.digest)  # equal files, one blob

    ctx = node_ctx(tmp_path, "node-e", store.uri)
    res = run_stage(ctx)
    assert res.outcome == "hit" and res.extra["files"] == len(index.entries) - sharing, res
    assert res.extra["dropped"] == sharing
    assert "does not match its digest" in capsys.readouterr().err
    name, _, inner = victim_rel.partition("/")
    restored = Path(ctx.exports[{"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}[name]]) / inner
    assert not restored.exists()
    restored.parent.mkdir(parents=True, exist_ok=True)
    restored.write_bytes(good)  # PyTorch compiles the missing file again
    publish_as_agent(ctx)
    assert store.get_blob_bytes(victim.digest) == good  # the corrupt blob was replaced, not trusted by its size
