"""A checkpoint keeps each file's mtime: trainers pick their newest checkpoint by it (Lightning's
`ckpt_path="last"` takes the newest `last*.ckpt`), so the mount and a pull must show the times the
files were saved at, not the mount's time, or two ranks may resume from different steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootseer_cli.stripe import catalog
from bootseer_cli.stripe.layout import Manifest, manifest_rel
from bootseer_cli.stripe.mount import mount_detached
from bootseer_cli.stripe.pull import pull
from bootseer_cli.stripe.push import push, push_files
from bootseer_cli.stripe.reader import open_reader
from bootseer_cli.stripe.writeback import overlay_view

from .conftest import CELL, file_store, write_random

pytestmark = pytest.mark.integration

OLDER = 1_700_000_000_123_456_789
NEWER = 1_700_000_500_987_654_321


def _ckpt(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_random(src / "last.ckpt", CELL + 5, 1)
    write_random(src / "sub" / "last-v1.ckpt", 3 * CELL, 2)
    os.utime(src / "last.ckpt", ns=(OLDER, OLDER))
    os.utime(src / "sub" / "last-v1.ckpt", ns=(NEWER, NEWER))
    return src


def test_mount_and_pull_keep_each_files_mtime(tmp_path: Path, mounts: Path) -> None:
    store = file_store(tmp_path)
    push(store, _ckpt(tmp_path), "m", "v1", stripes=2, cell_size=CELL)
    m = catalog.load_manifest(store, "m", "v1")
    assert [f.mtime_ns for f in m.files] == [OLDER, NEWER]
    mount_detached(m, mounts / "a", store.uri)
    for root in (mounts / "a", pull(m, catalog.Targets(store), tmp_path / "out").dest):
        assert (root / "last.ckpt").stat().st_mtime_ns // 10**9 == OLDER // 10**9
        assert (root / "sub" / "last-v1.ckpt").stat().st_mtime_ns // 10**9 == NEWER // 10**9
    assert (tmp_path / "out" / "last.ckpt").stat().st_mtime_ns == OLDER  # a pull keeps the nanoseconds
    assert (mounts / "a" / "sub").stat().st_mtime_ns // 10**9 == NEWER // 10**9  # a directory: its newest file


def test_manifest_without_mtimes_still_mounts(tmp_path: Path, mounts: Path) -> None:
    """A manifest from an older bootseer (or with a bad value) reads as before: the mount's own time."""
    store = file_store(tmp_path)
    m = push(store, _ckpt(tmp_path), "m", "v1", stripes=2, cell_size=CELL)
    doc = m.to_doc()
    for f in doc["files"]:
        f.pop("mtime_ns", None)
    doc["tag"] = "old"
    store.put_doc(manifest_rel("m", "old"), doc)
    old = catalog.load_manifest(store, "m", "old")
    assert [f.mtime_ns for f in old.files] == [None, None]
    assert Manifest.from_doc(doc).to_json() == old.to_json()  # an old manifest's digest is unchanged
    mount_detached(old, mounts / "a", store.uri)
    assert (mounts / "a" / "last.ckpt").stat().st_mtime_ns // 10**9 == int(old.created)
    assert (mounts / "a" / "sub" / "last-v1.ckpt").read_bytes() == (tmp_path / "src/sub/last-v1.ckpt").read_bytes()
    for bad in (-1, "1700000000", 1.5e18, True, 1 << 70):
        doc["files"][0]["mtime_ns"] = bad
        assert Manifest.from_doc(doc).files[0].mtime_ns is None


def test_write_back_records_saved_and_carried_mtimes(tmp_path: Path) -> None:
    """A job's new tag: a file it saved has its save time, an unchanged one carried from the parent keeps
    the parent's recorded mtime (it is re-pushed through the parent's reader, not from a local copy)."""
    store = file_store(tmp_path)
    parent = push(store, _ckpt(tmp_path), "m", "v1", stripes=2, cell_size=CELL)
    up = tmp_path / "up"
    write_random(up / "sub" / "last-v1.ckpt", 100, 3)
    saved = NEWER + 10**12
    os.utime(up / "sub" / "last-v1.ckpt", ns=(saved, saved))
    files, dirs, changed = overlay_view(parent, up, print)
    assert changed
    reader = open_reader(parent, catalog.Targets(store))
    try:
        child = push_files(store, files, dirs, "m", "v2", stripes=2, cell_size=CELL, lower=reader)
    finally:
        reader.close()
    assert [(f.path, f.mtime_ns) for f in child.files] == [("last.ckpt", OLDER), ("sub/last-v1.ckpt", saved)]
