"""Integration with real torch: a compiled model restarts on a second "node" and compiles nothing new.

Two compiles in this file (each ~20 s cold on a 2-core machine): node A compiles cold and publishes;
node B (own cache directory, own empty TMPDIR and HOME, same store) restores and must hit PyTorch's
FX graph cache only, and must not build Inductor's precompiled header again (it is kept under
`$TMPDIR/torchinductor_<user>/`, outside TORCHINDUCTOR_CACHE_DIR: seconds on every fresh node).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootseer_cli.compilecache.index import read_index
from bootseer_cli.compilecache.tree import header_dir
from bootseer_cli.stage import StageContext
from bootseer_cli.store.core import blob_path, open_store

from .conftest import node_ctx, publish_as_agent, run_model, run_stage_on, venv_with_torch_version

pytest.importorskip("torch")


@dataclass
class NodeA:
    root: Path
    store_uri: str
    ctx: StageContext
    counters: dict[str, object]
    published: int
    key: str
    headers: list[str]  # index paths of the precompiled headers published


def _files(root: Path) -> dict[str, int]:
    """Relative path -> mtime of every file under `root`."""
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def node_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeA]:
    """Node A: empty store, cold compile, then the agent's publish."""
    root = tmp_path_factory.mktemp("compile")
    store_uri = (root / "store").as_uri()
    ctx = node_ctx(root, "node-a", store_uri)
    res, env = run_stage_on(ctx)
    assert res.outcome == "miss", res
    assert set(ctx.exports) == {
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "TORCH_EXTENSIONS_DIR",
        "CUDA_CACHE_PATH",
    }
    counters = run_model(ctx.exports, env)
    agent = publish_as_agent(ctx)
    index = read_index(open_store(store_uri), res.extra["compile_key"])
    assert index.entries, agent.lines
    headers = sorted(rel for rel in index.entries if rel.startswith("headers/") and rel.endswith(".gch"))
    yield NodeA(root, store_uri, ctx, counters, len(index.entries), res.extra["compile_key"], headers)


def test_second_node_restores_and_compiles_nothing_new(node_a: NodeA) -> None:
    assert node_a.counters["inductor"].get("fxgraph_cache_miss", 0) >= 1  # type: ignore[union-attr]
    assert node_a.headers, "node A published no precompiled header (Inductor's, in its TMPDIR)"
    ctx = node_ctx(node_a.root, "node-b", node_a.store_uri)
    res, env = run_stage_on(ctx)
    assert res.outcome == "hit" and res.extra["files"] == node_a.published and res.extra["compile_key"] == node_a.key, (
        res
    )
    assert ctx.exports["TORCHINDUCTOR_CACHE_DIR"] != node_a.ctx.exports["TORCHINDUCTOR_CACHE_DIR"]
    tmp = Path(env["TMPDIR"])
    headers = header_dir(env)
    assert tmp in headers.parents
    before = _files(tmp)
    assert {f"headers/{p}" for p in _files(headers) if p.endswith(".gch")} == set(node_a.headers)
    counters = run_model(ctx.exports, env)
    inductor = counters["inductor"]
    assert inductor.get("fxgraph_cache_hit", 0) > 0 and inductor.get("fxgraph_cache_miss", 0) == 0, counters  # type: ignore[union-attr]
    after = _files(tmp)
    rebuilt = sorted(p for p, mtime in after.items() if before.get(p) != mtime and "/locks/" not in p)
    assert not rebuilt, f"node B wrote {rebuilt} to its TMPDIR: a precompiled header was built again"
    print(f"first compiled call: cold {node_a.counters['first_s']:.1f} s, restored {counters['first_s']:.1f} s")
    publish_as_agent(ctx)
    after = read_index(open_store(node_a.store_uri), node_a.key)
    assert len(after.entries) == node_a.published  # nothing new was compiled, so no new path


def test_other_torch_version_or_device_restores_nothing(node_a: NodeA, tmp_path: Path) -> None:
    ctx = node_ctx(node_a.root, "node-c", node_a.store_uri, device="NVIDIA H100 80GB HBM3")
    res, _ = run_stage_on(ctx)
    assert res.outcome == "miss" and res.extra["files"] == 0 and res.extra["compile_key"] != node_a.key
    other = venv_with_torch_version(tmp_path / "other", "2.99.0+cpu")
    ctx = node_ctx(node_a.root, "node-d", node_a.store_uri, command=[str(other), "train.py"])
    res, _ = run_stage_on(ctx)
    assert res.outcome == "miss" and res.extra["files"] == 0 and res.extra["compile_key"] != node_a.key
    assert res.extra["torch"] == "2.99.0+cpu", res
    assert not any(Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.so"))


def test_corrupt_blob_is_dropped_and_repaired_by_the_next_publish(
    node_a: NodeA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir = tmp_path / "store"
    shutil.copytree(Path(node_a.root / "store"), store_dir)
    store = open_store(store_dir.as_uri())
    index = read_index(store, node_a.key)
    victim_rel, victim = sorted((r, e) for r, e in index.entries.items() if not r.startswith("headers/"))[0]
    blob = Path(store.path(blob_path(victim.digest)))
    good = blob.read_bytes()
    blob.write_bytes(bytes(b ^ 0xFF for b in good))  # same size, other bytes

    sharing = sum(1 for e in index.entries.values() if e.digest == victim.digest)  # equal files, one blob

    ctx = node_ctx(tmp_path, "node-e", store.uri)
    res, _ = run_stage_on(ctx)
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


EAGER = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
with torch.no_grad():
    print(float(model(torch.randn(4, 16)).sum()))
"""


def test_a_run_without_torch_compile_leaves_the_header_in_the_store(node_a: NodeA, tmp_path: Path) -> None:
    """Issue 46 finding 8: the same model run eagerly (a job started without its `--compile`) was given
    Inductor's precompiled header, and every later start too. Its run reads and writes nothing of
    Inductor's, so the index records that the key's last run did not compile, and the next node
    leaves the headers in the store."""
    store_dir = tmp_path / "store"
    shutil.copytree(Path(node_a.root / "store"), store_dir)
    ctx = node_ctx(tmp_path, "node-f", store_dir.as_uri())
    res, env = run_stage_on(ctx)
    assert res.extra["files"] == node_a.published and res.extra["not_fetched"] == 0, res  # the last run compiled
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_EXT"))}
    out = subprocess.run(
        [sys.executable, "-c", EAGER],
        env={**run_env, **env, **ctx.exports},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    publish_as_agent(ctx)
    index = read_index(open_store(store_dir.as_uri()), node_a.key)
    assert index.compiled is False and len(index.entries) == node_a.published
    headers = [rel for rel in index.entries if rel.startswith("headers/")]
    ctx = node_ctx(tmp_path, "node-g", store_dir.as_uri())
    res, env = run_stage_on(ctx)
    assert res.extra["not_fetched"] == len(headers) and res.extra["files"] == node_a.published - len(headers), res
    assert not list(header_dir(env).rglob("*.gch"))  # not fetched: ~150 MB a start that does not compile saves


HEADER_DIR = "import sys, torch._inductor.codecache as c; print(c._HEADER_DIR)"


def test_header_dir_is_where_inductor_keeps_its_headers(tmp_path: Path) -> None:
    """The stage computes Inductor's header directory without importing torch: it must match torch's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "LOGNAME", "USER", "LNAME"))}
    env.update({"TMPDIR": str(tmp_path), "LOGNAME": "build:er"})
    out = subprocess.run([sys.executable, "-c", HEADER_DIR], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = tmp_path / "torchinductor_build_er" / "precompiled_headers"
    assert out.stdout.strip() == str(header_dir(env)) == str(expected)
