"""`ArchiveEntry` (issue 28): a NamedTuple built once per entry on both sides of a snapshot. It must
stay immutable and typed, write itself as its on-disk row, and `from_row` must refuse exactly what
it refused as a frozen dataclass."""

from __future__ import annotations

import json

import pytest

from bootseer_cli.envsnap.format import ArchiveEntry, UnsafeArchive, entries_of_rows
from bootseer_cli.envsnap.reader import entries_from_rows


def test_a_good_row_becomes_the_typed_entry_and_writes_back_as_the_row() -> None:
    row = ["/v/lib/a.py", "f", 0o644, 12, 1_700_000_000, ""]
    e = ArchiveEntry.from_row(row)
    assert type(e) is ArchiveEntry
    assert (e.path, e.kind, e.mode, e.size, e.mtime, e.extra) == tuple(row)
    assert e == ArchiveEntry("/v/lib/a.py", "f", 0o644, 12, 1_700_000_000)
    assert e.row() == row and json.dumps(e) == json.dumps(row)
    assert json.loads(json.dumps([e, e])) == [row, row]
    assert entries_of_rows([row]) == [e] and type(entries_of_rows([row])[0]) is ArchiveEntry
    assert hash(e) == hash(ArchiveEntry(*row)) and len({e, ArchiveEntry(*row)}) == 1


def test_an_entry_cannot_be_changed() -> None:
    e = ArchiveEntry("/v/a", "f", 0o644, 1, 2, "")
    with pytest.raises(AttributeError):
        e.size = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        e.other = 1  # type: ignore[attr-defined]
    assert e._replace(extra="x").extra == "x" and e.extra == ""


@pytest.mark.parametrize(
    "row",
    [
        ("/a", "f", 1, 2, 3, ""),  # a tuple is not what JSON yields
        ["/a", "f", 1, 2, 3],
        ["/a", "f", 1, 2, 3, "", 7],
        ["/a", "f", True, 2, 3, ""],
        ["/a", "f", 1, False, 3, ""],
        ["/a", "f", 1, 2, 3.0, ""],
        ["/a", "f", 1, -1, 3, ""],
        ["/a", "f", "1", 2, 3, ""],
        [1, "f", 1, 2, 3, ""],
        ["/a", None, 1, 2, 3, ""],
        ["/a", "f", 1, 2, 3, None],
        "/a",
        None,
        {"path": "/a"},
    ],
)
def test_a_malformed_row_is_refused(row: object) -> None:
    with pytest.raises(UnsafeArchive, match="malformed snapshot entry"):
        ArchiveEntry.from_row(row)
    # the metadata's rows are checked column by column, all at once: the same refusal, wherever it sits
    good = [[f"/v/{i}", "f", 0o644, i, 1_700_000_000, ""] for i in range(50)]
    with pytest.raises(UnsafeArchive, match="malformed snapshot entry") as e:
        entries_from_rows([*good[:20], row, *good[20:]])
    assert str(row)[:200] in str(e.value)


def test_the_metadata_rows_become_the_entries_one_row_would() -> None:
    rows = [["/v", "d", 0o755, 0, 5, ""], ["/v/a", "f", 0o644, 3, 6, ""], ["/v/l", "l", 0o777, 0, 7, "a"]]
    got = entries_from_rows(rows)
    assert got == tuple(ArchiveEntry.from_row(r) for r in rows)
    assert all(type(e) is ArchiveEntry for e in got)
    assert entries_from_rows([]) == ()
