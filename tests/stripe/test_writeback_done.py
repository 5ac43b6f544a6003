"""A finished write-back's staging copy leaves the push's way: renamed aside, removed by the agent after.

Issue 44 (the write-back push at >= 90 % of `ckpt push`'s speed): unlinking the upper directory's
fsync-ed checkpoint (~0.3 s per GB on ext4) was part of every push, and of every start that finished an
earlier run's write-back before resolving `latest`. The tag is in the store before the copy goes, so the
copy is renamed aside (one rename) and `discard_done` removes it once the agent has recorded the push.
"""

from __future__ import annotations

import os
from pathlib import Path

from bootseer_cli.settings import CheckpointSettings
from bootseer_cli.store.core import Store
from bootseer_cli.stripe.catalog import load_manifest
from bootseer_cli.stripe.overlay import write_dirs, write_root
from bootseer_cli.stripe.push import push
from bootseer_cli.stripe.rundirs import owner_stamp
from bootseer_cli.stripe.writeback import DONE_PREFIX, Journal, begin, discard_done, finish, pending


def test_the_staging_copy_is_set_aside_then_discarded(tmp_path: Path, isolated_cache: Path) -> None:
    """With `keep_local = false`; kept (the default) it becomes the node's copy (test_kept.py)."""
    store = Store((tmp_path / "store").as_uri())
    src = tmp_path / "src"
    src.mkdir()
    (src / "ckpt.pt").write_bytes(os.urandom(3000))
    push(store, src, "job", "v1", stripes=2, cell_size=512)
    dirs = write_dirs("r1")
    (dirs.upper / "ckpt-2.pt").write_bytes(b"saved by the job")
    dead_owner = owner_stamp(1)  # a launcher that is not this one: the journal is pending once it ends
    begin(dirs.root, Journal("overlay", "job", "v1", "v2", str(dirs.upper), owner=dead_owner))

    m = finish(store, CheckpointSettings(stripes=2, cell_size=512, keep_local=False), dirs.root, print)

    assert m is not None and load_manifest(store, "job", "v2").tag == "v2"  # in the store first
    assert not dirs.root.exists()
    [aside] = [p for p in write_root().iterdir() if p.name.startswith(DONE_PREFIX)]
    assert (aside / "upper" / "ckpt-2.pt").read_bytes() == b"saved by the job"
    assert not (aside / "journal.json").exists()  # done: never taken for a write-back still pending
    assert pending("job") == []
    assert discard_done() == 1
    assert list(write_root().iterdir()) == []
