"""The stamp's draft (`stamp.StampDraft`): made on a thread while a restore's workers write, it must
give the very files `write_stamp` writes, and its sentinels must be read from the tree as it is at the
end (a file the workers wrote after the draft was made is stamped with its final size)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bootseer_cli.envsnap import stamp
from bootseer_cli.envsnap.format import ArchiveEntry
from bootseer_cli.envsnap.tree import EnvTree


def _tree(root: Path) -> list[ArchiveEntry]:
    (root / "lib" / "pkg-1.0.dist-info").mkdir(parents=True)
    (root / "lib" / "a.py").write_text("a")
    (root / "lib" / "b.py").write_text("bb")
    rec = root / "lib" / "pkg-1.0.dist-info" / "RECORD"
    rec.write_text("a.py,,\n")
    (root / "lib" / "link").symlink_to("a.py")
    (root / "lib" / "c.py").hardlink_to(root / "lib" / "b.py")
    for name, mtime in (("a.py", 6), ("b.py", 7), ("pkg-1.0.dist-info/RECORD", 8)):
        os.utime(root / "lib" / name, (mtime, mtime))
    return [
        ArchiveEntry(str(root / "lib"), "d", 0o755, 0, 5, ""),
        ArchiveEntry(str(root / "lib" / "a.py"), "f", 0o644, 1, 6, ""),
        ArchiveEntry(str(root / "lib" / "b.py"), "f", 0o644, 2, 7, ""),
        ArchiveEntry(str(root / "lib" / "c.py"), "h", 0o644, 0, 7, str(root / "lib" / "b.py")),
        ArchiveEntry(str(rec), "f", 0o644, 7, 8, ""),
        ArchiveEntry(str(root / "lib" / "link"), "l", 0o777, 0, 9, "a.py"),
    ]


def _files(root: Path) -> tuple[dict, dict]:
    doc = json.loads((root / ".bootseer-env.json").read_text())
    doc.pop("written")
    return doc, json.loads((root / ".bootseer-env.paths").read_text())


def test_a_draft_made_beside_the_workers_writes_what_write_stamp_writes(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        root.mkdir()
    ea, eb = _tree(a), _tree(b)
    stamp.write_stamp(EnvTree([str(a)]), ["k1", "k1", "k2"], "d" * 64, ea, [f"{a}/gone"])
    draft = stamp.StampDraft("d" * 64, eb, [f"{b}/gone"])
    draft.start()  # on its thread, as while a restore's workers run
    for root in (b, a):  # written after the draft was made
        (root / "lib" / "pkg-1.0.dist-info" / "RECORD").write_text("a.py,,\nb.py,,\n")
        os.utime(root / "lib" / "pkg-1.0.dist-info" / "RECORD", (9, 9))
    stamp.write_stamp(EnvTree([str(a)]), ["k1", "k1", "k2"], "d" * 64, ea, [f"{a}/gone"])
    stamp.write_drafted_stamp(EnvTree([str(b)]), ["k1", "k1", "k2"], draft)
    (sa, pa), (sb, pb) = _files(a), _files(b)
    assert json.dumps(pa).replace(str(a), "@") == json.dumps(pb).replace(str(b), "@")
    assert json.dumps(sa).replace(str(a), "@") == json.dumps(sb).replace(str(b), "@")
    assert sb["env_keys"] == ["k1", "k2"]
    rec = str(b / "lib" / "pkg-1.0.dist-info" / "RECORD")
    assert sb["sentinels"][rec][0] == len("a.py,,\nb.py,,\n")  # read at the end, not when drafted


def test_a_draft_never_started_is_made_when_the_stamp_is_written(tmp_path: Path) -> None:
    entries = _tree(tmp_path)
    draft = stamp.StampDraft("e" * 64, entries)
    stamp.write_drafted_stamp(EnvTree([str(tmp_path)]), ["k"], draft)
    assert stamp.stamped_blob(EnvTree([str(tmp_path)]), "k") == "e" * 64
    rows = json.loads((tmp_path / ".bootseer-env.paths").read_text())["entries"]
    assert [r[0] for r in rows] == [e.path for e in entries]
