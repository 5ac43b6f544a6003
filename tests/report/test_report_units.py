"""The small pieces: percentiles, cache classes, GPUs per node, durations, how a job's starts are found."""

from __future__ import annotations

import random
import re
import statistics

import pytest

from bootseer_cli.errors import ConfigError
from bootseer_cli.launcher import gpus_hint
from bootseer_cli.report import analysis, findings
from bootseer_cli.report.load import parse_since
from bootseer_cli.report.starts import cache_class, node_starts, percentile


def test_percentile_is_linear_between_order_statistics() -> None:
    rng = random.Random(5)
    for n in (2, 3, 10, 101):
        values = [rng.uniform(0, 100) for _ in range(n)]
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        assert percentile(values, 50) == pytest.approx(cuts[49])
        assert percentile(values, 90) == pytest.approx(cuts[89])
    assert percentile([4.0], 90) == 4.0
    assert percentile([], 50) == 0.0


def test_cache_class() -> None:
    assert cache_class({"cache": "hit", "outcome": "ok"}) == "hit"
    assert cache_class({"cache": "miss", "outcome": "skipped"}) == "miss"
    assert cache_class({"cache": "", "outcome": "restored"}) == "hit"
    assert cache_class({"cache": "", "outcome": "built"}) == "miss"
    assert cache_class({"cache": "", "outcome": "done"}) is None


@pytest.mark.parametrize(
    ("command", "env", "want"),
    [
        (["torchrun", "--nnodes=2", "--nproc-per-node", "8", "train.py"], {}, (8, "command line")),
        (["torchrun", "--nproc_per_node=4", "train.py"], {}, (4, "command line")),
        (["deepspeed", "--num_gpus", "2", "train.py"], {}, (2, "command line")),
        (["accelerate", "launch", "--num_processes=16", "--num_machines=2", "t.py"], {}, (8, "command line")),
        (["torchrun", "--nproc-per-node=gpu", "t.py"], {"CUDA_VISIBLE_DEVICES": "0,1,2"}, (3, "$CUDA_VISIBLE_DEVICES")),
        (["python", "t.py"], {"SLURM_GPUS_ON_NODE": "8(x2)"}, (8, "$SLURM_GPUS_ON_NODE")),
        (["python", "t.py"], {"LOCAL_WORLD_SIZE": "6", "CUDA_VISIBLE_DEVICES": "0"}, (6, "$LOCAL_WORLD_SIZE")),
        (["python", "t.py"], {"NVIDIA_VISIBLE_DEVICES": "all"}, None),
        (["python", "t.py"], {}, None),
    ],
)
def test_gpus_hint(command: list[str], env: dict[str, str], want: tuple[int, str] | None) -> None:
    assert gpus_hint(command, env) == want


def test_parse_since() -> None:
    assert parse_since("7d") == 7 * 86400
    assert parse_since("12h") == 12 * 3600
    assert parse_since("1.5w") == 1.5 * 7 * 86400
    for bad in ("7", "d", "7x", "-1d", ""):
        with pytest.raises(ConfigError, match="--since"):
            parse_since(bad)


def _ev(node: str, run: str, stage: str, start: float, end: float, **kw: object) -> dict[str, object]:
    base = {"job": "j", "run": run, "node": node, "rank": 0, "stage": stage, "start": start, "end": end}
    base.update({"outcome": "ok", "cache": "", "bytes": 0, "bytes_from_store": 0, "bytes_from_peers": 0})
    base.update({"reason": "", "detail": "", "extra": ""})
    base.update(kw)
    return base


def test_job_starts_are_clustered_and_gpus_chosen() -> None:
    evs = []
    for k, t in ((0, 0.0), (1, 1.0), (2, 2.0)):  # first start of three nodes
        evs += [_ev(f"n{k}", "a", "bootseer", t, t + 5), _ev(f"n{k}", "a", "ready", t + 5, t + 9)]
    for k, t in ((0, 500.0), (1, 501.0)):  # 8 minutes later two of them restart
        extra = '{"gpus": 4, "gpus_from": "$LOCAL_WORLD_SIZE"}'
        evs += [_ev(f"n{k}", "b", "bootseer", t, t + 2, extra=extra), _ev(f"n{k}", "b", "ready", t + 2, t + 3)]
    starts = node_starts(evs)
    assert sorted((s.node, s.attempt) for s in starts) == [("n0", 1), ("n0", 2), ("n1", 1), ("n1", 2), ("n2", 1)]
    first = analysis.analyze_job(evs, "j", attempt=1)
    assert first.nodes == 3 and first.startup_s == pytest.approx(11.0) and first.slowest_node == "n2"
    assert first.gpus_per_node == 8 and first.gpus_source == "default"
    second = analysis.analyze_job(evs, "j", attempt=2)
    assert second.nodes == 2 and second.startup_s == pytest.approx(4.0)
    assert (second.gpus_per_node, second.gpus_source) == (4, "launcher ($LOCAL_WORLD_SIZE)")
    assert analysis.analyze_job(evs, "j", attempt=2, gpus_configured=2).gpus_per_node == 2
    assert analysis.analyze_job(evs, "j", attempt=2, gpus_flag=1, gpus_configured=2).gpus_per_node == 1
    latest = analysis.analyze_job(evs, "j")  # the latest start of each node: n2 from the first start
    assert {r.node: r.attempt for r in latest.rows} == {"n0": 2, "n1": 2, "n2": 1}


def test_node_without_ready_is_ready_at_exec_and_verdicts() -> None:
    evs = [
        _ev("n0", "a", "env", 0.0, 40.0, cache="miss", outcome="built"),
        _ev("n0", "a", "bootseer", 0.0, 41.0),
        _ev("n1", "a", "env", 0.0, 42.0, cache="miss", outcome="built"),
        _ev("n1", "a", "bootseer", 0.0, 42.5),
    ]
    r = analysis.analyze_job(evs, "j")
    assert r.ready_called == 0 and r.startup_s == pytest.approx(42.5) and r.slowest_node == "n1"
    assert r.verdict.startswith("Fix first: env takes") and "prewarm" in r.verdict
    fast = analysis.analyze_job([_ev("n0", "a", "bootseer", 0.0, 0.2)], "j")
    assert "already fast" in fast.verdict
    failed = [*evs, _ev("n1", "a", "checkpoint", 0.0, 0.0, outcome="failed", reason="store unreachable")]
    assert "env" in analysis.analyze_job(failed, "j").verdict


def test_verdict_names_the_slow_tail() -> None:
    """Two slow nodes in different stages: no single one explains the wait, so the verdict names both."""
    evs = []
    for k in range(6):
        env = 30.0 if k == 1 else 3.0
        ckpt = 25.0 if k == 4 else 4.0
        cache = "miss" if k == 1 else "hit"
        evs += [
            _ev(f"n{k}", "a", "env", 0.0, env, cache=cache),
            _ev(f"n{k}", "a", "checkpoint", env, env + ckpt),
            _ev(f"n{k}", "a", "bootseer", 0.0, env + ckpt),
            _ev(f"n{k}", "a", "ready", env + ckpt, env + ckpt + 5.0),
        ]
    r = analysis.analyze_job(evs, "j")
    assert r.slowest_node == "n1" and r.startup_s == pytest.approx(39.0)
    assert r.straggler_wait_s == pytest.approx(39.0 - 12.0)
    assert r.verdict.startswith("Fix first: stragglers:")
    assert "n1 (env (snapshot) miss 30.0 s vs 3.0 s p50)" in r.verdict
    assert "n4 (checkpoint 25.0 s vs 4.0 s p50)" in r.verdict


def test_odd_jobs_render() -> None:
    """A crashed exec (no bootseer event), an agent-side stage, one node, 70 nodes: every view renders."""
    import xml.etree.ElementTree as ET

    from bootseer_cli.report import page, text
    from bootseer_cli.report.svg import timeline_svg

    odd = [
        _ev("n0", "a", "image", 0.0, 2.0, cache="hit"),  # exec died after the image stage
        _ev("n1", "a", "bootseer", 0.0, 3.0),
        _ev("n1", "a", "hot-prefetch", 3.0, 9.0),  # something the agent did behind the launcher
        _ev("n1", "a", "ready", 3.0, 6.0),
    ]
    r = analysis.analyze_job(odd, "j")
    assert [s.stage for s in r.stages] == ["image", "hot-prefetch", "bootseer", "ready"]
    assert r.slowest_node == "n1" and r.startup_s == pytest.approx(6.0)
    many = [
        e
        for k in range(70)
        for e in (
            _ev(f"n{k:02d}", "a", "bootseer", 0.0, 1.0 + k / 10),
            _ev(f"n{k:02d}", "a", "ready", 1.0 + k / 10, 5.0 + k),
        )
    ]
    for events in (odd, odd[1:2], many):
        report = analysis.analyze_job(events, "j")
        ET.fromstring(timeline_svg(report))
        assert "<svg" in page.job_html(report)
        assert text.job_text(report).splitlines()[0].startswith("job j")
    assert "n69" in timeline_svg(analysis.analyze_job(many, "j"))


def test_stages_behind_the_launcher_are_not_blamed() -> None:
    evs = []
    for k in range(3):
        evs += [
            _ev(f"n{k}", "a", "env", 0.0, 2.0, cache="hit"),
            _ev(f"n{k}", "a", "bootseer", 0.0, 2.1),
            _ev(f"n{k}", "a", "hot-prefetch", 2.1, 60.0),  # the agent reads on behind the program
            _ev(f"n{k}", "a", "ready", 2.1, 4.0 + k),
        ]
    r = analysis.analyze_job(evs, "j")
    prefetch = next(s for s in r.stages if s.stage == "hot-prefetch")
    assert prefetch.behind and not next(s for s in r.stages if s.stage == "env").behind
    assert "hot-prefetch" not in r.verdict


def test_node_rank_from_the_command_line() -> None:
    from bootseer_cli.launcher import node_rank_hint

    assert node_rank_hint(["torchrun", "--nnodes=2", "--node-rank", "1", "t.py"]) == 1
    assert node_rank_hint(["torchrun", "--node_rank=3", "t.py"]) == 3
    assert node_rank_hint(["python", "t.py"]) is None
    evs = [_ev("n1", "a", "bootseer", 0.0, 1.0, extra='{"node_rank": 1}'), _ev("n0", "a", "bootseer", 0.0, 1.0)]
    assert {r.node: r.rank for r in analysis.analyze_job(evs, "j").rows} == {"n0": 0, "n1": 1}


def test_findings_are_tagged_and_the_verdict_picks_by_tag() -> None:
    """The verdict ranks tagged findings; a straggler finding names its node and stage as data, not prose."""
    evs = []
    for k in range(4):
        env = 40.0 if k == 2 else 3.0
        evs += [
            _ev(f"n{k}", "a", "env", 0.0, env, cache="miss" if k == 2 else "hit"),
            _ev(f"n{k}", "a", "bootseer", 0.0, env + 0.5),
        ]
    r = analysis.analyze_job(evs, "j")
    found = findings.findings(r)
    assert {f.kind for f in found} == {"stage", "straggler"}
    straggler = next(f for f in found if f.kind == "straggler")
    assert (straggler.stage, straggler.node) == ("env", "n2")
    assert straggler.seconds == pytest.approx(37.0)
    assert r.verdict == f"Fix first: {straggler.text}."
    # a slow tail that no single stage explains becomes a finding of its own, ranked the same way
    tail = []
    for k in range(6):
        env = 30.0 if k == 1 else 3.0
        ckpt = 25.0 if k == 4 else 4.0
        tail += [
            _ev(f"n{k}", "a", "env", 0.0, env),
            _ev(f"n{k}", "a", "checkpoint", env, env + ckpt),
            _ev(f"n{k}", "a", "bootseer", 0.0, env + ckpt),
        ]
    r = analysis.analyze_job(tail, "j")
    best = max(findings.findings(r), key=lambda f: f.seconds)
    assert best.kind == "stragglers" and r.verdict == f"Fix first: {best.text}."


def test_stage_rows_are_built_once_for_text_and_html() -> None:
    from bootseer_cli.report import page, text

    evs = [
        _ev("n0", "a", "env", 0.0, 3.0, cache="hit", bytes=3_000_000, bytes_from_store=2_500_000),
        _ev("n0", "a", "bootseer", 0.0, 3.5),
        _ev("n1", "a", "env", 0.0, 150.0, cache="hit", bytes_from_peers=1_500),
        _ev("n1", "a", "bootseer", 0.0, 150.5),
    ]
    r = analysis.analyze_job(evs, "j")
    env = text.stage_cells(next(s for s in r.stages if s.stage == "env"))
    assert (env.from_store, env.from_peers, env.max) == ("2.5 MB", "1.5 kB", "150 s")  # decimal SI, units.py
    text_line = next(line for line in text.job_text(r).splitlines() if line.startswith("env"))
    assert re.split(r"\s{2,}", text_line) == [*env[:10], f"{env.straggler} (+{env.cost})"]
    html = page.job_html(r)
    assert "".join(f"<td>{c}</td>" for c in env[1:]) in html


def test_stage_table_follows_the_capability_table() -> None:
    """Stage order and labels come from `capabilities`: the compile stage is shown, after checkpoint,
    with its label, in the text table and on the page."""
    from bootseer_cli.capabilities import labels, stage_names
    from bootseer_cli.report import page, text

    evs = []
    for k in range(2):
        evs += [
            _ev(f"n{k}", "a", "compile", 5.0, 7.0, cache="hit"),
            _ev(f"n{k}", "a", "env", 0.0, 2.0, cache="hit"),
            _ev(f"n{k}", "a", "checkpoint", 2.0, 5.0),
            _ev(f"n{k}", "a", "bootseer", 0.0, 7.5),
            _ev(f"n{k}", "a", "ready", 7.5, 9.0 + k),
        ]
    r = analysis.analyze_job(evs, "j")
    shown = [s.stage for s in r.stages]
    assert shown == [*(s for s in stage_names() if s in shown), "bootseer", "ready"]
    assert shown.index("checkpoint") < shown.index("compile")
    compile_stats = next(s for s in r.stages if s.stage == "compile")
    assert compile_stats.label == labels()["compile"] != "compile"
    assert any(line.startswith(labels()["compile"]) for line in text.job_text(r).splitlines())
    assert labels()["compile"] in page.job_html(r)
