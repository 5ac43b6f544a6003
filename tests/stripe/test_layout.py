"""The layout arithmetic and the manifest's validation (manifests are untrusted input)."""

from __future__ import annotations

import json

import pytest

from bootseer_cli.commands.ckpt import parse_size
from bootseer_cli.errors import ConfigError, IntegrityError
from bootseer_cli.stripe.layout import (
    FileEntry,
    Manifest,
    StripeRef,
    cell_count,
    check_relpath,
    parse_ref,
    stripe_size,
)

H = "0" * 64


@pytest.mark.parametrize(("total", "cell", "k"), [(0, 512, 3), (1, 512, 4), (512 * 7, 512, 3), (512 * 7 + 5, 512, 4)])
def test_cells_are_dealt_round_robin_and_cover_the_stream(total: int, cell: int, k: int) -> None:
    files = [FileEntry("f", 0, total, H)] if total else []
    refs = [StripeRef("", H, stripe_size(total, cell, k, s)) for s in range(k)]
    m = Manifest("n", "t", cell, refs, files, [H] * cell_count(total, cell))
    assert sum(r.size for r in refs) == total
    seen: dict[int, list[tuple[int, int]]] = {s: [] for s in range(k)}
    covered = 0
    for c in range(m.n_cells):
        s, off, n = m.cell_location(c)
        assert s == c % k
        seen[s].append((off, n))
        covered += n
    assert covered == total
    for s, spans in seen.items():  # each stripe is its cells end to end
        pos = 0
        for off, n in spans:
            assert off == pos
            pos += n
        assert pos == refs[s].size
    assert list(m.cells_in(0, total)) == list(range(m.n_cells))
    if total > cell:
        assert list(m.cells_in(cell - 1, cell + 1)) == [0, 1]


def _doc(**over: object) -> dict:
    m = Manifest("n", "t", 512, [StripeRef("", H, 600), StripeRef("", H, 512)], [FileEntry("a/b", 0, 1112, H)], [H] * 3)
    doc = m.to_doc()
    doc.update(over)
    return doc


def test_a_valid_manifest_round_trips() -> None:
    m = Manifest.from_json(json.dumps(_doc()).encode())
    assert m.total_size == 1112 and m.k == 2 and m.n_cells == 3
    assert Manifest.from_json(m.to_json()).to_doc() == m.to_doc()


@pytest.mark.parametrize(
    "over",
    [
        {"files": [{"path": "../evil", "offset": 0, "size": 1112, "sha256": H}]},
        {"files": [{"path": "/etc/passwd", "offset": 0, "size": 1112, "sha256": H}]},
        {"files": [{"path": "a/./b", "offset": 0, "size": 1112, "sha256": H}]},
        {"files": [{"path": "a", "offset": 3, "size": 1112, "sha256": H}]},
        {"files": [{"path": "a", "offset": 0, "size": 1112, "sha256": "zz"}]},
        {"dirs": ["../x"]},
        {"cells": [H] * 2},
        {"cell_size": 7},
        {"format": 99},
        {"stripes": [{"target": "", "digest": H, "size": 1}, {"target": "", "digest": H, "size": 512}]},
        {"stripes": []},
        {"total_size": 5},
    ],
)
def test_bad_manifests_are_rejected(over: dict) -> None:
    with pytest.raises(IntegrityError):
        Manifest.from_json(json.dumps(_doc(**over)).encode())


def test_truncated_manifest_is_a_clear_error() -> None:
    data = json.dumps(_doc()).encode()
    with pytest.raises(IntegrityError, match="not valid JSON"):
        Manifest.from_json(data[: len(data) // 2])


def test_files_under_a_file_are_rejected() -> None:
    files = [
        {"path": "a", "offset": 0, "size": 556, "sha256": H},
        {"path": "a/b", "offset": 556, "size": 556, "sha256": H},
    ]
    with pytest.raises(IntegrityError, match="under a file"):
        Manifest.from_json(json.dumps(_doc(files=files)).encode())


def test_paths_refs_and_sizes() -> None:
    assert check_relpath("a/b.pt") == "a/b.pt"
    assert parse_ref("m") == ("m", "latest")
    assert parse_ref("m:v1") == ("m", "v1")
    for bad in ("", "m:../x", "../m", "m:a/b"):
        with pytest.raises(ConfigError):
            parse_ref(bad)
    assert parse_size("1MiB") == 1 << 20
    assert parse_size("64KiB") == 64 << 10
    assert parse_size("4096") == 4096
    with pytest.raises(ConfigError):
        parse_size("1 parsec")
