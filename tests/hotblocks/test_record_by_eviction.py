"""The eviction fallback of the image stage, called as a start without fanotify calls it (issue 47 item 5).

`_record_by_eviction` read the frozen `RecordTask` as a dict (`base["roots"]`), a TypeError on every start
that records by eviction (a plain user's: fanotify needs root), which only a root-run test through
`runuser` reached. mypy now flags such an index ("RecordTask" is not indexable); this reaches the line
as any user, without an agent or a store."""

from __future__ import annotations

import json
from pathlib import Path

from bootseer_cli.events import RunInfo
from bootseer_cli.hotblocks.agent_tasks import RecordTask
from bootseer_cli.hotblocks.stage import _record_by_eviction
from bootseer_cli.settings import Settings
from bootseer_cli.stage import StageContext


def test_recording_by_eviction_hands_the_agent_the_files_it_covered(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "a.py").write_bytes(b"a" * 8192)
    (tree / "b.so").write_bytes(b"b" * 4096)
    ctx = StageContext(settings=Settings(), run=RunInfo.new(), command=["true"], quiet=True)
    base = RecordTask(image_key="k" * 64, roots=[str(tree)])

    r = _record_by_eviction(ctx, base, [], "no record yet", False, "fanotify is not available here")

    assert (r.outcome, r.cache) == ("miss", "miss"), r
    assert r.extra["roots"] == [str(tree)] and r.extra["files"] == 2 and r.extra["walk_complete"] is True
    (task,) = ctx.agent_tasks
    assert isinstance(task, RecordTask) and task.roots == base.roots and task.fan_fd is None and task.started > 0
    assert task.covered is not None
    assert sorted(json.loads(Path(task.covered).read_text())) == [str(tree / "b.so"), str(tree / "pkg" / "a.py")]


def test_a_stale_record_is_not_walked_again(tmp_path: Path) -> None:
    ctx = StageContext(settings=Settings(), run=RunInfo.new(), command=["true"], quiet=True)
    base = RecordTask(image_key="k" * 64, roots=[str(tmp_path)])

    r = _record_by_eviction(ctx, base, [], "stale", True, "fanotify is not available here")

    assert r.outcome != "miss" and ctx.agent_tasks == [], r
