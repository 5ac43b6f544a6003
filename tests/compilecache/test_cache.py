"""The compile cache without torch compiling: index merging and pruning, concurrent publishers, the
trust rules on untrusted index paths, the fallbacks, the key's facts and the stage's own cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bootseer_cli.compilecache import key as keymod
from bootseer_cli.compilecache import publish as publish_mod
from bootseer_cli.compilecache.index import Entry, merge, prune, read_index, write_index
from bootseer_cli.compilecache.publish import publish
from bootseer_cli.compilecache.stage import run_stage
from bootseer_cli.compilecache.tree import Baseline, cache_roots, header_dir, take_baseline
from bootseer_cli.store.core import open_store

from .conftest import TEST_KEYS, make_venv, node_ctx, node_env, publish_as_agent, usual_job

D = "ab" * 32


def _roots(root: Path) -> dict[str, Path]:
    roots = {"inductor": root / "inductor", "triton": root / "triton", "extensions": root / "ext"}
    for p in roots.values():
        p.mkdir(parents=True, exist_ok=True)
    return roots


def test_merge_keeps_the_newest_entry_per_path_and_prune_the_most_recent() -> None:
    a = {"inductor/x": Entry(D, 10, 1.0), "inductor/y": Entry(D, 10, 5.0)}
    b = {"inductor/x": Entry("cd" * 32, 20, 3.0), "inductor/z": Entry(D, 10, 2.0)}
    m = merge(a, b)
    assert m["inductor/x"].digest == "cd" * 32 and set(m) == {"inductor/x", "inductor/y", "inductor/z"}
    assert set(prune(m, 30)) == {"inductor/y", "inductor/x"}  # 10 + 20: z (least recently used) goes
    assert set(prune(m, 9)) == set()


def test_concurrent_publishers_end_with_the_union(tmp_path: Path) -> None:
    store_uri = (tmp_path / "store").as_uri()
    nodes, rounds = 4, 3
    barrier = threading.Barrier(nodes)
    errors: list[BaseException] = []

    def node(i: int) -> None:
        try:
            store = open_store(store_uri)
            roots = _roots(tmp_path / f"n{i}")
            base = take_baseline(roots, {}, [])
            for r in range(rounds):
                (roots["inductor"] / f"n{i}-r{r}.so").write_bytes(os.urandom(100))
                (roots["inductor"] / "shared.py").write_bytes(b"same on every node")
                barrier.wait()
                publish(store, "k" * 64, f"n{i}", roots, base, 1 << 30)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    index = read_index(open_store(store_uri), "k" * 64)
    expected = {f"inductor/n{i}-r{r}.so" for i in range(nodes) for r in range(rounds)} | {"inductor/shared.py"}
    assert set(index.entries) == expected
    final = publish(open_store(store_uri), "k" * 64, "n9", _roots(tmp_path / "n9"), Baseline(roots={}), 1 << 30)
    assert final.shard == ""  # nothing new: no shard written


def test_publish_sends_only_what_changed_and_prunes_least_recently_used(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri())
    roots = _roots(tmp_path / "node")
    (roots["inductor"] / "old.so").write_bytes(b"o" * 600)
    (roots["inductor"] / "locks").mkdir()
    (roots["inductor"] / "locks" / "x.lock").write_bytes(b"")
    (roots["inductor"] / ".123.456.tmp").write_bytes(b"partial")
    base = Baseline(roots={k: str(v) for k, v in roots.items()})
    first = publish(store, D, "a", roots, base, 1000)
    assert (first.files, first.entries) == (1, 1)
    assert publish(store, D, "a", roots, base, 1000).shard == ""  # unchanged: nothing sent
    time.sleep(0.01)
    (roots["triton"] / "new.bin").write_bytes(b"n" * 600)
    second = publish(store, D, "a", roots, base, 1000)
    assert (second.files, second.pruned) == (1, 1)  # 600 + 600 > 1000: the older entry goes
    index = read_index(store, D)
    assert set(index.entries) == {"triton/new.bin"} and len(index.shards) == 1  # compacted to one shard


def test_untrusted_index_paths_are_never_written_outside_the_caches(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri())
    digest = store.put_blob_bytes(b"payload")
    ctx = node_ctx(tmp_path, "n", store.uri)
    from bootseer_cli.compilecache.key import current_compile_key

    ck = current_compile_key(TEST_KEYS, usual_job())
    assert ck is not None
    bad = ["../evil", "inductor/../../evil", "inductor//x", "/etc/evil", "inductor/a/../../evil", "other/x"]
    entries = {rel: Entry(digest, 7, time.time()) for rel in [*bad, "inductor/ok/file.py"]}
    entries["inductor/liar.py"] = Entry(digest, 3, time.time())  # wrong size: refused after the fetch
    write_index(store, ck.digest, "evil", entries, [])
    res = run_stage(ctx)
    assert res.extra["files"] == 1 and res.extra["dropped"] == len(bad) + 1
    assert not list(tmp_path.rglob("evil"))
    inductor = Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"])
    assert (inductor / "ok" / "file.py").read_bytes() == b"payload" and not (inductor / "liar.py").exists()


def test_no_torch_does_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A launcher whose interpreter has no torch (a venv of its own, whatever bootseer's has): nothing to
    carry, and the stage says which interpreter it read."""
    python = make_venv(tmp_path / "venv")
    ctx = node_ctx(tmp_path, "n", (tmp_path / "store").as_uri(), command=[str(python), "train.py"])
    ctx.quiet = False
    res = run_stage(ctx)
    assert (res.outcome, res.summary) == ("skipped", "no torch") and not ctx.exports and not ctx.agent_tasks
    assert res.reason == f"torch is not installed in {python}, the launcher {python}"
    assert res.reason in capsys.readouterr().err


def test_no_store_warns_and_starts_with_an_empty_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = node_ctx(tmp_path, "n", "bogus://nowhere")
    res = run_stage(ctx)
    assert res.outcome == "fallback" and "TORCHINDUCTOR_CACHE_DIR" in ctx.exports
    assert "cannot read the compile cache index" in capsys.readouterr().err


def test_user_set_cache_dir_is_kept_and_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    roots, exports = cache_roots(tmp_path / "base", D, os.environ)
    assert roots["inductor"] == tmp_path / "mine" and "TORCHINDUCTOR_CACHE_DIR" not in exports
    assert exports["TRITON_CACHE_DIR"] == str(tmp_path / "base" / D[:16] / "triton")


def test_no_agent_restores_but_does_not_publish(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = node_ctx(tmp_path, "n", (tmp_path / "store").as_uri(), agent=False)
    res = run_stage(ctx)
    assert res.outcome == "miss" and not ctx.agent_tasks and "needs the agent" in capsys.readouterr().err


def test_agent_task_publishes_and_logs(tmp_path: Path) -> None:
    ctx = node_ctx(tmp_path, "n", (tmp_path / "store").as_uri())
    run_stage(ctx)
    Path(ctx.exports["TORCH_EXTENSIONS_DIR"], "ext.so").write_bytes(b"x" * 10)
    agent = publish_as_agent(ctx)
    assert any("1 file(s), 10 B published" in line for line in agent.lines), agent.lines
    events = [json.loads(line) for line in ctx.run.events_file.read_text().splitlines()]
    assert [e["stage"] for e in events] == ["compile-publish"]


def test_cpu_and_gpu_kinds(tmp_path: Path) -> None:
    cpu = keymod.cpu_kind(
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse4_2 avx2 avx512f amx_tile\n\nprocessor\t: 1\n"
    )
    assert cpu == {
        "kind": "cpu",
        "vendor_id": "GenuineIntel",
        "cpu family": "6",
        "model": "143",
        "isa": ["amx_tile", "avx2", "avx512f", "sse4_2"],
    }
    proc = tmp_path / "nvidia"
    (proc / "gpus" / "0000:07:00.0").mkdir(parents=True)
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 2023\n")
    (proc / "gpus" / "0000:07:00.0" / "information").write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\n")
    gpu = keymod.gpu_kind(proc, {"CUDA_VERSION": "12.4.1"})
    assert gpu == {"kind": "gpu", "models": ["NVIDIA H100 80GB HBM3"], "driver": "535.104.05", "cuda": "12.4.1"}
    assert keymod.gpu_kind(proc, {"CUDA_VISIBLE_DEVICES": ""}) is None
    assert keymod.gpu_kind(tmp_path / "none", {}) is None
    doc = keymod.compile_key_doc("i", "e", cpu, "2.13.0+cpu")
    assert keymod.compile_key(TEST_KEYS, cpu, "2.13.0+cpu") != keymod.compile_key(TEST_KEYS, cpu, "2.14.0+cpu")
    assert doc["torch"] == "2.13.0+cpu" and doc["device"] == cpu


COST = """
import time, sys
t0 = time.perf_counter()
from pathlib import Path
from bootseer_cli.compilecache.stage import run_stage
from tests.compilecache.conftest import node_ctx
ctx = node_ctx(Path(sys.argv[1]), "n", Path(sys.argv[1], "store").as_uri())
t1 = time.perf_counter()
res = run_stage(ctx)
t2 = time.perf_counter()
assert res.outcome == "miss", res
print(t1 - t0, t2 - t1)
"""


def test_stage_cost_with_nothing_to_restore(tmp_path: Path) -> None:
    """≤ 0.2 s for the stage (the keys aside, computed by then for the other stages), in a fresh process
    so that the imports it needs (pyarrow for the store) are counted."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    out = subprocess.run([sys.executable, "-c", COST, str(tmp_path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    _setup, stage = map(float, out.stdout.split())
    assert stage <= 0.2, f"the compile stage took {stage:.3f} s with nothing to restore"


def test_files_an_earlier_run_never_published_are_published(tmp_path: Path) -> None:
    ctx = node_ctx(tmp_path, "n", (tmp_path / "store").as_uri(), agent=False)
    run_stage(ctx)  # a run without the agent: what it compiles stays on the node only
    Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"], "early.so").write_bytes(b"e" * 5)
    ctx = node_ctx(tmp_path, "n", (tmp_path / "store").as_uri())
    run_stage(ctx)
    agent = publish_as_agent(ctx)
    assert any("1 file(s), 5 B published" in line for line in agent.lines), agent.lines


def _on(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)


def test_precompiled_headers_travel_from_tmpdir_to_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's headers live in `$TMPDIR/torchinductor_<user>/precompiled_headers`: node A publishes
    the one its run built (not one another key left there), node B restores it into its own TMPDIR,
    for another user name; a run that reads the other restored files refreshes the header's entry."""
    store_uri = (tmp_path / "store").as_uri()
    a_env = node_env(tmp_path, "a") | {"LOGNAME": "alice"}
    _on(a_env, monkeypatch)
    a_headers = header_dir(a_env)
    assert a_headers == Path(a_env["TMPDIR"]) / "torchinductor_alice" / "precompiled_headers"
    a_headers.mkdir(parents=True)
    (a_headers / "other-torch.h.gch").write_bytes(b"o" * 7)  # left by another key: not this key's
    ctx = node_ctx(tmp_path, "a", store_uri)
    res = run_stage(ctx)
    assert res.outcome == "miss" and "TMPDIR" not in ctx.exports
    (a_headers / "mine.h").write_bytes(b"#include <x>\n")
    (a_headers / "mine.h.gch").write_bytes(b"g" * 50)
    (a_headers / "locks").mkdir()
    (a_headers / "locks" / "mine.lock").write_bytes(b"")
    Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"], "k.so").write_bytes(b"k" * 5)
    publish_as_agent(ctx)
    index = read_index(open_store(store_uri), res.extra["compile_key"])
    assert set(index.entries) == {"headers/mine.h", "headers/mine.h.gch", "inductor/k.so"}

    b_env = node_env(tmp_path, "b") | {"LOGNAME": "bob"}
    _on(b_env, monkeypatch)
    ctx = node_ctx(tmp_path, "b", store_uri)
    res = run_stage(ctx)
    assert res.outcome == "hit" and res.extra["files"] == 3, res
    b_headers = Path(b_env["TMPDIR"]) / "torchinductor_bob" / "precompiled_headers"
    assert (b_headers / "mine.h.gch").read_bytes() == b"g" * 50

    publish_as_agent(ctx)  # nothing read: nothing refreshed
    assert read_index(open_store(store_uri), res.extra["compile_key"]).entries == index.entries
    ctx = node_ctx(tmp_path, "b", store_uri)
    run_stage(ctx)
    Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"], "k.so").read_bytes()  # a hit reads the kernel, not the header
    old = time.time() - 2 * publish_mod.REFRESH_S
    store = open_store(store_uri)
    aged = {r: Entry(e.digest, e.size, old) for r, e in index.entries.items()}
    write_index(store, res.extra["compile_key"], "x", aged, [])
    publish_as_agent(ctx)
    after = read_index(store, res.extra["compile_key"]).entries
    assert after["headers/mine.h.gch"].used > old and after["inductor/k.so"].used > old, after


def test_headers_are_restored_only_when_the_last_run_compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46 finding 8: a job started without `torch.compile` still restored the ~150 MB precompiled
    header. The index now records whether its last run compiled (read or wrote Inductor's files): after
    a run that did not, a fresh node leaves the headers in the store; a run that compiles again builds
    its header, and the node after it gets the header restored again."""
    store_uri = (tmp_path / "store").as_uri()

    def node(name: str) -> tuple[Path, Path]:
        env = node_env(tmp_path, name)
        _on(env, monkeypatch)
        return header_dir(env), Path(env["TMPDIR"])

    a_headers, _ = node("a")
    a = node_ctx(tmp_path, "a", store_uri)
    key = run_stage(a).extra["compile_key"]
    (a_headers / "mine.h").write_bytes(b"#include <x>\n")
    (a_headers / "mine.h.gch").write_bytes(b"g" * 50)
    Path(a.exports["TORCHINDUCTOR_CACHE_DIR"], "k.so").write_bytes(b"k" * 5)
    publish_as_agent(a)  # a compiling run
    assert read_index(open_store(store_uri), key).compiled is True

    b_headers, _ = node("b")
    b = node_ctx(tmp_path, "b", store_uri)
    res = run_stage(b)
    assert res.extra["files"] == 3 and (b_headers / "mine.h.gch").exists()  # the last run compiled
    publish_as_agent(b)  # a run without torch.compile: it neither reads nor writes Inductor's files
    index = read_index(open_store(store_uri), key)
    assert index.compiled is False and set(index.entries) == {"headers/mine.h", "headers/mine.h.gch", "inductor/k.so"}

    c_headers, _ = node("c")
    c = node_ctx(tmp_path, "c", store_uri)
    res = run_stage(c)
    assert res.outcome == "hit" and res.extra["files"] == 1 and res.extra["not_fetched"] == 2, res
    assert not (c_headers / "mine.h.gch").exists() and "headers not fetched (63 B" in res.summary, res.summary
    Path(c.exports["TORCHINDUCTOR_CACHE_DIR"], "k.so").read_bytes()  # this run compiles: a hit reads the kernel
    # and Inductor builds the missing header
    (c_headers / "mine.h").write_bytes(b"#include <x>\n")
    (c_headers / "mine.h.gch").write_bytes(b"g" * 50)
    publish_as_agent(c)
    assert read_index(open_store(store_uri), key).compiled is True

    d_headers, _ = node("d")
    res = run_stage(node_ctx(tmp_path, "d", store_uri))
    assert res.extra["files"] == 3 and res.extra["not_fetched"] == 0
    assert (d_headers / "mine.h.gch").read_bytes() == b"g" * 50


def test_header_dir_not_ours_or_inside_the_users_cache_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = node_env(tmp_path, "n") | {"LOGNAME": "carol"}
    _on(env, monkeypatch)
    (tmp_path / "elsewhere").mkdir()
    Path(env["TMPDIR"], "torchinductor_carol").symlink_to(tmp_path / "elsewhere")  # planted in a shared /tmp
    ctx = node_ctx(tmp_path, "n", (tmp_path / "store").as_uri())
    res = run_stage(ctx)
    assert res.outcome == "miss" and "headers" not in Baseline.load(Path(ctx.agent_tasks[0].baseline)).roots
    assert "Inductor's headers are not carried" in capsys.readouterr().err
    assert not any((tmp_path / "elsewhere").iterdir())

    default = Path(env["TMPDIR"]) / "torchinductor_carol"
    roots, _ = cache_roots(tmp_path / "base", D, {**env, "TORCHINDUCTOR_CACHE_DIR": str(default)})
    assert "headers" not in roots and roots["inductor"] == default  # the headers are inside it already


def test_the_cuda_jit_cache_travels_like_the_others(tmp_path: Path) -> None:
    """The CUDA driver JIT-compiles PTX into CUDA_CACHE_PATH (by default ~/.nv/ComputeCache, which a
    fresh container lacks): node A's run writes it under the directory the stage exported, the agent
    publishes it, node B's stage restores it into its own; a directory the user set is kept."""
    store_uri = (tmp_path / "store").as_uri()
    ctx = node_ctx(tmp_path, "a", store_uri)
    run_stage(ctx)
    a_jit = Path(ctx.exports["CUDA_CACHE_PATH"])
    assert a_jit.is_dir() and a_jit.name == "cuda"
    (a_jit / "5" / "0").mkdir(parents=True)
    (a_jit / "index").write_bytes(b"i" * 8)
    (a_jit / "5" / "0" / "74d689a2796b69").write_bytes(b"s" * 20)
    publish_as_agent(ctx)

    ctx = node_ctx(tmp_path, "b", store_uri)
    res = run_stage(ctx)
    b_jit = Path(ctx.exports["CUDA_CACHE_PATH"])
    assert res.outcome == "hit" and b_jit != a_jit, res
    assert (b_jit / "index").read_bytes() == b"i" * 8
    assert (b_jit / "5" / "0" / "74d689a2796b69").read_bytes() == b"s" * 20

    roots, exports = cache_roots(tmp_path / "base", D, {"CUDA_CACHE_PATH": str(tmp_path / "mine")})
    assert roots["cuda"] == tmp_path / "mine" and "CUDA_CACHE_PATH" not in exports


def test_a_header_in_tmpdir_before_the_stage_is_published_when_the_run_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier run on this node (one the stage did not engage for) built Inductor's header in TMPDIR:
    this run reads it (GCC does, for every kernel it compiles), so it is this key's and is published with
    its `.h`; a header of another torch that this run does not read stays unpublished (issue 44)."""
    env = node_env(tmp_path, "n") | {"LOGNAME": "dave"}
    _on(env, monkeypatch)
    headers = header_dir(env)
    headers.mkdir(parents=True)
    for name, data in (("mine.h", b"#include <x>\n"), ("mine.h.gch", b"g" * 50), ("other.h.gch", b"o" * 7)):
        (headers / name).write_bytes(data)
    ctx = node_ctx(tmp_path, "n", (tmp_path / "store").as_uri())
    res = run_stage(ctx)
    assert res.outcome == "miss", res
    assert (headers / "mine.h.gch").read_bytes() == b"g" * 50  # the compiler reads the header
    Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"], "k.so").write_bytes(b"k" * 5)
    publish_as_agent(ctx)
    index = read_index(open_store(ctx.settings.store.uri), res.extra["compile_key"])
    assert set(index.entries) == {"headers/mine.h", "headers/mine.h.gch", "inductor/k.so"}


def test_a_restored_entry_used_after_an_hour_is_refreshed(tmp_path: Path) -> None:
    """A warm restart reads a restored kernel whose index entry was last used over REFRESH_S ago: the
    agent's publish writes its new use time (it raised KeyError here before, losing the publish)."""
    store_uri = (tmp_path / "store").as_uri()
    ctx = node_ctx(tmp_path, "a", store_uri)
    res = run_stage(ctx)
    Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"], "k.so").write_bytes(b"k" * 5)
    publish_as_agent(ctx)
    store = open_store(store_uri)
    key = res.extra["compile_key"]
    index = read_index(store, key)
    entry = index.entries["inductor/k.so"]
    old = time.time() - 2 * publish_mod.REFRESH_S
    write_index(store, key, "old", {"inductor/k.so": Entry(entry.digest, entry.size, old)}, index.shards)
    ctx = node_ctx(tmp_path, "b", store_uri)
    assert run_stage(ctx).outcome == "hit"
    Path(ctx.exports["TORCHINDUCTOR_CACHE_DIR"], "k.so").read_bytes()
    agent = publish_as_agent(ctx)
    assert any("1 refreshed" in line for line in agent.lines), agent.lines
    assert read_index(store, key).entries["inductor/k.so"].used > old + publish_mod.REFRESH_S


def test_the_interpreter_of_each_kind_of_launcher(tmp_path: Path) -> None:
    """Which interpreter each launcher runs, found as exec finds the launcher (its PATH), and why none."""
    from bootseer_cli.compilecache.jobpython import find_interpreter

    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    py = Path(sys.executable).name
    assert find_interpreter([py, "-m", "torch.distributed.run"], env) == (
        sys.executable,
        f"the launcher {py}, at {sys.executable}",
    )
    assert find_interpreter(["env", "-u", "X", "A=1", sys.executable, "t.py"], env)[0] == sys.executable
    assert find_interpreter(["torchrun"], env) == (sys.executable, "resolved from torchrun's shebang")
    perl = tmp_path / "tool"
    perl.write_text("#!/usr/bin/perl\n")
    perl.chmod(0o755)
    python, why = find_interpreter([str(perl)], env)
    assert python is None and why == f"the launcher {perl} runs /usr/bin/perl (#!/usr/bin/perl), not a Python program"
    python, why = find_interpreter(["true"], env)
    assert python is None and why.endswith("is a binary, not a Python program"), why
    python, why = find_interpreter(["no-such-launcher"], env)
    assert python is None and "no-such-launcher: command not found" in why
    assert find_interpreter(["sh", "-c", "torchrun x"], env, Path("/opt/py")) == ("/opt/py", "set by [compile] python")
