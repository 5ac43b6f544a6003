"""Issue 44 item 3: the report's advice fits the job, and a detected first step counts like ready().

From events as exec, the agent and the launcher's hook write them (no bootseer_cli.report code in the
expectations): P2P is advised only where several nodes read from a remote store with no peers yet;
a node's explicit ready() wins over its detected first optimizer step."""

from __future__ import annotations

import pytest

from bootseer_cli.report import analysis, findings
from bootseer_cli.report.text import job_text


def _ev(node: str, stage: str, start: float, end: float, **kw: object) -> dict[str, object]:
    base = {"job": "j", "run": f"run-{node}", "node": node, "rank": 0, "stage": stage, "start": start, "end": end}
    base.update({"outcome": "ok", "cache": "", "bytes": 0, "bytes_from_store": 0, "bytes_from_peers": 0})
    base.update({"reason": "", "detail": "", "extra": ""})
    base.update(kw)
    return base


def _slow_restore(nodes: int, peers: int = 0) -> list[dict[str, object]]:
    """Every node restores its env snapshot (a hit) slowly, then hands over to the launcher."""
    evs = []
    for k in range(nodes):
        node = f"n{k}"
        evs.append(_ev(node, "env", 0.0, 30.0 + k, outcome="restored", cache="hit", bytes=3 << 30,
                       bytes_from_store=(3 << 30) - peers, bytes_from_peers=peers))  # fmt: skip
        evs.append(_ev(node, "bootseer", 0.0, 31.0 + k))
    return evs


def _texts(r: analysis.JobReport) -> str:
    return " ".join(f.text for f in findings.findings(r)) + " " + r.verdict


def test_one_node_gets_no_p2p_advice() -> None:
    """The issue's job: one node, a local store, a slow restore. It has no peer to fetch from."""
    r = analysis.analyze_job(_slow_restore(1), "j")
    assert r.verdict.startswith("Fix first: env takes")
    assert "[p2p]" not in _texts(r)
    r = analysis.analyze_job(_slow_restore(1), "j", store_uri="s3://bucket/prefix")
    assert "[p2p]" not in _texts(r)


def test_p2p_advice_needs_several_nodes_a_remote_store_and_no_peers_yet() -> None:
    local = analysis.analyze_job(_slow_restore(4), "j", store_uri="file:///srv/store")
    assert "[p2p]" not in _texts(local)
    remote = analysis.analyze_job(_slow_restore(4), "j", store_uri="s3://bucket/prefix")
    assert remote.store_remote and "enable [p2p]" in remote.verdict
    already = analysis.analyze_job(_slow_restore(4, peers=1 << 30), "j", store_uri="s3://bucket/prefix")
    assert "[p2p]" not in _texts(already)  # peers already served bytes: P2P is on


def test_first_step_counts_as_ready_and_ready_wins() -> None:
    evs = [
        _ev("n0", "bootseer", 0.0, 2.0),
        _ev("n0", "first_step", 2.0, 40.0, extra='{"local_rank": "0"}'),
        _ev("n0", "first_step", 2.0, 42.0, extra='{"local_rank": "1"}'),
        _ev("n1", "bootseer", 0.0, 3.0),
        _ev("n1", "first_step", 3.0, 50.0, extra='{"local_rank": "0"}'),
        _ev("n1", "ready", 3.0, 45.0, extra='{"local_rank": "0"}'),  # the program's own ready(): it wins
        _ev("n2", "bootseer", 0.0, 4.0),  # no torch trainer: ready at the hand-over
    ]
    r = analysis.analyze_job(evs, "j")
    assert {row.node: row.ready for row in r.rows} == {"n0": 42.0, "n1": 45.0, "n2": 4.0}
    assert r.startup_s == pytest.approx(45.0) and r.slowest_node == "n1"
    assert (r.ready_called, r.first_step_detected) == (1, 1)
    assert [s.stage for s in r.stages] == ["bootseer", "first_step", "ready"]
    assert not any(s.behind for s in r.stages)
    launcher = [f for f in findings.findings(r) if f.kind == "launcher"]
    assert {f.stage for f in launcher} == {"first_step", "ready"}
    assert "compile, data loading" in next(f.text for f in launcher if f.stage == "first_step")
    assert "[compile] enabled = true" in launcher[0].text  # no compile stage ran
    text = job_text(r)
    assert "1 node(s) ready at their first optimizer step" in text
    assert "1 node(s) neither called bootseer_cli.ready() nor made an optimizer step" in text
    assert "launcher → first step" in text


def test_page_and_timeline_name_the_first_step() -> None:
    from bootseer_cli.report.page import job_html
    from bootseer_cli.report.svg import timeline_svg

    evs = [_ev("n0", "bootseer", 0.0, 2.0), _ev("n0", "first_step", 2.0, 40.0, extra='{"local_rank": "0"}')]
    r = analysis.analyze_job(evs, "j")
    html, svg = job_html(r), timeline_svg(r)
    assert "launcher → first step" in svg and "launcher → ready()" not in svg
    assert "<th>to first step</th>" in html and "nodes ready at their first optimizer step" in html
    assert "measured only to exec" not in html
