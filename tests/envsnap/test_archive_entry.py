"""`ArchiveEntry` (issue 28): a NamedTuple built once per entry on both sides of a snapshot. It must
stay immutable and typed, write itself as its on-disk row, and `from_row` must refuse exactly what
it refused as a frozen dataclass."""

from __future__ import annotations

import json

import pytest

from bootseer_cli.envsnap.format import ArchiveEntry, UnsafeArchive, entries_of_rows


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
