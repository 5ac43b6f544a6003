"""A record taken on the node that ran the setup must stay fresh on a node that restored the env
snapshot: tar restores mtimes to whole seconds, so staleness compares seconds, not nanoseconds."""

from __future__ import annotations

import os
from pathlib import Path

from bootseer_cli.hotblocks.record import Record, check


def test_restored_mtime_to_the_second_is_fresh_and_a_changed_second_is_stale(tmp_path: Path) -> None:
    f = tmp_path / "mod.py"
    f.write_bytes(b"x" * 5000)
    os.utime(f, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    st = f.stat()
    rec = Record(image_key="k", roots=[str(tmp_path)], files={str(f): (st.st_size, st.st_mtime_ns)})
    rec.extents = [(str(f), 0, 4096)]
    os.utime(f, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))  # as a tar restore leaves it
    staleness, fresh = check(rec)
    assert fresh == {str(f)} and staleness.stale_files == []
    os.utime(f, ns=(1_700_000_001_000_000_000, 1_700_000_001_000_000_000))
    staleness, fresh = check(rec)
    assert fresh == set() and staleness.stale_files == [str(f)]
