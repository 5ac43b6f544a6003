"""A snapshot published to a local store is linked in, not copied (issue 48's `bootseer snapshot` figure).

On a file:// store the publish copied the blob it had just written (218 MB of torch: 2.5 s of the
7.4 s a `bootseer snapshot` took against tar's 4.6 s), and the node cache then linked the stored copy
and dropped its own: two writes of the bytes for one file on disk. Our own capture (and env image) is now
linked into the store where it lies on the same filesystem; a file a job can name (a checkpoint's,
`put_blob_file` without `own`) is still copied, and a store on another filesystem still gets a copy."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store, blob_path

pytestmark = pytest.mark.integration


def test_our_own_file_is_linked_into_a_local_store_and_a_jobs_file_is_copied(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri(), settle_s=1.0)
    ours, jobs = tmp_path / "capture.tar.zst", tmp_path / "ckpt.pt"
    ours.write_bytes(os.urandom(200_000))
    jobs.write_bytes(os.urandom(200_000))

    d_ours = store.put_blob_file(ours, own=True)
    d_jobs = store.put_blob_file(jobs)

    stored_ours = Path(store.path(blob_path(d_ours)))
    stored_jobs = Path(store.path(blob_path(d_jobs)))
    assert os.stat(stored_ours).st_ino == os.stat(ours).st_ino  # one file on disk, no second write
    assert os.stat(stored_jobs).st_ino != os.stat(jobs).st_ino  # the job may rewrite its file later
    assert hashlib.sha256(stored_ours.read_bytes()).hexdigest() == d_ours
    assert hashlib.sha256(stored_jobs.read_bytes()).hexdigest() == d_jobs
    assert not [p for p in stored_ours.parent.iterdir() if ".tmp-" in p.name]


def _tree(root: Path) -> dict[str, bytes]:
    """The tree's files and bytes, bootseer's per-tree stamp (`.bootseer-env.*`) aside."""
    files = (p for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".bootseer-env"))
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


@pytest.mark.parametrize("where", ["same filesystem", "a tmpfs store"])
def test_bootseer_snapshot_publishes_to_a_local_store_and_a_fresh_node_restores_it(tmp_path: Path, where: str) -> None:
    store, root = tmp_path / "store", tmp_path / "env"
    store.mkdir()
    wrap: list[str] = []
    if where == "a tmpfs store":  # another filesystem: no link can be made, the bytes are copied
        if os.geteuid() != 0 or not shutil.which("unshare"):
            pytest.fail("a tmpfs store needs root and unshare(1)")
        mount = f'mount -t tmpfs -o size=64m tmpfs "{store}" && exec "$@"'
        wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
    cfg = tmp_path / "bootseer.toml"
    cfg.write_text(f'[store]\nuri = "{store.as_uri()}"\n[env]\nroots = ["{root}"]\nsetup = ["true"]\n')
    builder, fresh = tmp_path / "builder", tmp_path / "fresh"
    bs = f"{sys.executable} -m bootseer_cli"
    # The baseline of an absent tree, the tree, the snapshot, the tree gone, a fresh node's restore: in
    # one mount namespace when the store is a tmpfs (it goes with the namespace), then the store's files.
    (root / "site" / "pkg").mkdir(parents=True)
    for i in range(20):
        (root / "site" / "pkg" / f"m{i}.py").write_bytes(os.urandom(5000 + i))
    want = _tree(root)
    shutil.move(root, tmp_path / "made")
    script = (
        f"{bs} baseline --config {cfg} >/dev/null && mv {tmp_path / 'made'} {root} && "
        f"{bs} snapshot --config {cfg} >/dev/null && rm -rf {root} && "
        f"XDG_CACHE_HOME={fresh} {bs} restore --config {cfg} >/dev/null && "
        f"find {store} -type f -printf '%n %i %p\\n' && find {builder} -type f -printf 'cache %i\\n'"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(builder), "BOOTSEER_TRUST_VERIFY": "off"})
    r = subprocess.run([*wrap, "sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)

    assert r.returncode == 0, r.stderr
    assert _tree(root) == want  # the fresh node restored what was published
    lines = r.stdout.splitlines()
    assert not [line for line in lines if ".tmp-" in line], r.stdout  # nothing half-written
    blobs = [line.split() for line in lines if "/blobs/" in line]
    assert len(blobs) == 1, r.stdout
    links, inode, _ = blobs[0]
    cached = {line.split()[1] for line in lines if line.startswith("cache ")}
    if where == "same filesystem":  # one file on disk: the store's, the builder's cache, the fresh node's
        assert links == "3" and inode in cached, r.stdout
    else:
        assert links == "1", r.stdout
