"""What an extraction plans to create before its first change (`undo.plan_changes`), and what the journal
lists of it: the fast path for restores that replace nothing must agree with the general walk.

The new paths are what an interrupted restore's recovery removes, so a path missing from them is left
behind after a crash and one too many removes what was there before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer_cli.envsnap import apply, plan, undo
from bootseer_cli.envsnap.format import ArchiveEntry, Meta


def _meta(root: Path, rows: list[tuple[str, str]]) -> Meta:
    entries = tuple(ArchiveEntry(f"{root}{rel}" if rel else str(root), kind, 0o755, 0, 0, "") for rel, kind in rows)
    return Meta((str(root),), (), entries, ())


def _expected(root: Path, m: Meta) -> tuple[set[str], list[str]]:
    """By definition: every entry, and every directory above one up to the root, that does not exist
    (a root is never new); the maximal ones are those whose parent is not new."""
    new: set[str] = set()
    for e in m.entries:
        p = e.path
        while p != str(root) and not os.path.lexists(p):
            new.add(p)
            p = os.path.dirname(p)
    return new, sorted(p for p in new if os.path.dirname(p) not in new)


def _planned(root: Path, m: Meta) -> tuple[set[str], list[str], bool]:
    st = apply.State(plan.plan(m, [str(root)]))
    u = undo.Undo([str(root)])
    undo.plan_changes(st, u)
    return st.new, undo.journal_doc(st, u)["new"], st.new_tops is not None


ROWS = [
    ("", "d"),
    ("/bin", "d"),
    ("/bin/python", "f"),
    ("/lib", "d"),
    ("/lib/site", "d"),
    ("/lib/site/a.py", "f"),
    ("/lib/site/pkg", "d"),
    ("/lib/site/pkg/__init__.py", "f"),
    ("/lib/site/deep/er/x.py", "f"),  # its directories are not listed
    ("/lib/site/deep/er/y.py", "f"),
    ("/share/z", "f"),
]


@pytest.mark.parametrize(
    "present",
    [
        [],  # a first restore into an empty root
        ["/lib", "/lib/site"],  # some directories are there already
        ["/lib", "/lib/site", "/lib/site/deep"],  # an unlisted directory is there, the one below it is not
        ["/bin", "/lib", "/lib/site", "/lib/site/pkg", "/share"],
    ],
)
def test_a_restore_that_replaces_nothing_plans_exactly_the_missing_paths(tmp_path: Path, present: list[str]) -> None:
    root = tmp_path / "venv"
    root.mkdir()
    for rel in present:
        (root / rel.lstrip("/")).mkdir(parents=True, exist_ok=True)
    m = _meta(root, ROWS)
    new, journal_new, fast = _planned(root, m)
    want_new, want_tops = _expected(root, m)
    assert fast  # this case takes the fast path
    assert new == want_new
    assert journal_new == want_tops


def test_a_missing_root_and_a_replaced_file_take_the_general_walk(tmp_path: Path) -> None:
    root = tmp_path / "venv"  # absent: the restore makes it, and a root is never new
    m = _meta(root, ROWS)
    new, journal_new, fast = _planned(root, m)
    assert not fast
    assert str(root) not in new
    assert journal_new == sorted(f"{root}/{top}" for top in ("bin", "lib", "share"))

    root.mkdir()
    (root / "bin").mkdir()
    (root / "bin" / "python").write_text("an old interpreter")  # replaced: moved aside, not new
    new, journal_new, fast = _planned(root, m)
    assert not fast
    assert f"{root}/bin/python" not in new
    assert f"{root}/lib/site/deep/er/x.py" in new
    assert journal_new == sorted(f"{root}/{top}" for top in ("lib", "share"))
