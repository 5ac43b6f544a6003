"""The plan's checks made on whole columns at once (`plan._plan_columns`, `plan._paths_ok`) must accept
exactly what the entry-by-entry checks accept, and leave every refusal to them (which say why)."""

from __future__ import annotations

import pytest

from bootseer_cli.envsnap import plan
from bootseer_cli.envsnap.format import ArchiveEntry, Frame, Meta

R = "/r/venv"


def _meta(rows: list[tuple[str, str, int, str]], raw: int = 2048) -> Meta:
    entries = tuple(ArchiveEntry(p, k, 0o644, size, 5, extra) for p, k, size, extra in rows)
    return Meta((R,), (), entries, (Frame(0, 10, raw),))


GOOD = [(R, "d", 0, ""), (f"{R}/lib", "d", 0, ""), (f"{R}/lib/a.py", "f", 700, ""), (f"{R}/bin", "d", 0, "")]
CASES = {
    "good": GOOD,
    "good with symlinks": [*GOOD, (f"{R}/bin/py", "l", 0, "python3"), (f"{R}/lib64", "l", 0, "lib")],
    "good with a hardlink": [*GOOD, (f"{R}/lib/b.py", "h", 0, f"{R}/lib/a.py")],
    "a hardlink to nothing": [*GOOD, (f"{R}/lib/b.py", "h", 0, f"{R}/lib/zz.py")],
    "a duplicate": [*GOOD, (f"{R}/lib/a.py", "f", 1, "")],
    "the root as a file": [(R, "f", 3, ""), *GOOD[1:]],
    "a symlink without a target": [*GOOD, (f"{R}/bin/py", "l", 0, "")],
    "a symlink target with a NUL": [*GOOD, (f"{R}/bin/py", "l", 0, "py\0thon")],
    "a device node": [*GOOD, (f"{R}/dev0", "c", 0, "")],
    "a double slash": [*GOOD, (f"{R}/lib//c.py", "f", 1, "")],
    "a dot": [*GOOD, (f"{R}/lib/./c.py", "f", 1, "")],
    "a dot dot": [*GOOD, (f"{R}/lib/../../etc/passwd", "f", 1, "")],
    "a trailing dot dot": [*GOOD, (f"{R}/lib/..", "f", 1, "")],
    "a trailing slash": [*GOOD, (f"{R}/lib/c/", "f", 1, "")],
    "a relative path": [*GOOD, ("lib/c.py", "f", 1, "")],
    "a NUL in a path": [*GOOD, (f"{R}/lib/c\0.py", "f", 1, "")],
    "outside the root": [*GOOD, ("/r/venv2/c.py", "f", 1, "")],
    "the root's parent": [*GOOD, ("/r", "d", 0, "")],
    "below a symlink of its own": [*GOOD, (f"{R}/l", "l", 0, "/etc"), (f"{R}/l/x", "f", 1, "")],
    "frames beyond what the entries take": GOOD,
    "a dotted name is fine": [*GOOD, (f"{R}/lib/.hidden", "d", 0, ""), (f"{R}/lib/.hidden/..x", "f", 2, "")],
}


def _outcome(meta: Meta) -> object:
    try:
        p = plan.plan(meta, [R])
    except Exception as e:  # the outcome compared: the exception's type and message
        return (type(e), str(e))
    return (list(p.entries.items()), p.files, p.raw_bytes, p.deletions, p.roots)


@pytest.mark.parametrize("case", list(CASES))
def test_the_column_checks_and_the_entry_checks_agree(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = _meta(CASES[case], raw=1 << 20 if case.startswith("frames beyond") else 2048)
    fast = _outcome(meta)
    # the column checks pass these (the rest is the plan's, after them, for both ways)
    passed = ("good", "good with symlinks", "a dotted name is fine", "below a symlink of its own")
    assert (plan._plan_columns(meta, [R]) is not None) == (case in passed or case.startswith("frames beyond"))
    monkeypatch.setattr(plan, "_plan_columns", lambda m, roots: None)  # every entry one at a time
    assert fast == _outcome(meta)
    if case.startswith("good") or case.endswith("fine"):
        assert not isinstance(fast[0], type)
    else:
        assert isinstance(fast[0], type)  # refused, with the entry-by-entry check's reason


def test_paths_ok_agrees_with_the_check_of_each_path() -> None:
    for rows in CASES.values():
        paths = [p for p, _, _, _ in rows]
        each = True
        for p in paths:
            try:
                plan._check_path(p, [R])
            except plan.UnsafeArchive:
                each = False
        assert plan._paths_ok(paths, [R]) == each, paths
