"""Push and pull against real stores: file://, the loopback S3 server, and stripes spread over several
S3 servers (one per target); pull is verified and atomic; faults are clear errors, never wrong data."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from bootseer_cli.errors import BootseerError, ConfigError, IntegrityError, StoreError
from bootseer_cli.store.core import Store, blob_path
from bootseer_cli.stripe import catalog
from bootseer_cli.stripe.layout import latest_rel, manifest_rel
from bootseer_cli.stripe.pull import pull
from bootseer_cli.stripe.push import push
from bootseer_cli.stripe.reader import ReaderOptions

from .conftest import CELL, file_store, run_cli, stripe_file, write_random

pytestmark = pytest.mark.integration


def same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)

    def ok(c: filecmp.dircmp) -> bool:
        if c.left_only or c.right_only or c.funny_files:
            return False
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        return not mismatch and not errors and all(ok(s) for s in c.subdirs.values())

    return ok(cmp)


def test_push_pull_round_trip(store_uri: str, plain_ckpt: Path, tmp_path: Path) -> None:
    store = Store(store_uri)
    m = push(store, plain_ckpt, "model", "v1", stripes=3, cell_size=CELL)
    assert m.k == 3 and m.n_cells > 3 * 3
    assert {f.path for f in m.files} == {"model.bin", "optim/state.bin", "optim/tiny", "empty.txt"}
    assert "emptydir" in m.dirs
    got = catalog.load_manifest(store, "model", "latest")
    assert got.to_doc() == m.to_doc()
    r = pull(got, catalog.Targets(store), tmp_path / "out")
    assert r.bytes == m.total_size and not r.skipped
    assert same_tree(plain_ckpt, tmp_path / "out")
    assert pull(got, catalog.Targets(store), tmp_path / "out").skipped  # already current: nothing to do
    with pytest.raises(ConfigError, match="already exists"):
        push(store, plain_ckpt, "model", "v1", stripes=3, cell_size=CELL)


def test_stripes_spread_over_several_s3_targets(s3_factory, plain_ckpt: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    servers = [s3_factory() for _ in range(3)]
    main = Store(servers[0].uri("main"))
    targets = [Store(s.uri("stripes")) for s in servers]
    m = push(main, plain_ckpt, "model", "v1", stripes=4, cell_size=CELL, targets=targets)
    assert [r.target for r in m.stripes] == [targets[i % 3].uri for i in range(4)]
    for i, ref in enumerate(m.stripes):  # each stripe object is on its own server
        assert targets[i % 3].size(blob_path(ref.digest)) == ref.size
        assert not any(targets[j].has_blob(ref.digest) for j in range(3) if j != i % 3)
    r = pull(catalog.load_manifest(main, "model"), catalog.Targets(main, [t.uri for t in targets]), tmp_path / "out")
    assert r.bytes == m.total_size
    assert same_tree(plain_ckpt, tmp_path / "out")
    assert "secret" not in json.dumps(m.to_doc()).lower()


def test_latest_listing_and_rm_keep_shared_stripes(tmp_path: Path, plain_ckpt: Path) -> None:
    store = file_store(tmp_path)
    m1 = push(store, plain_ckpt, "model", "a", stripes=2, cell_size=CELL)
    m2 = push(store, plain_ckpt, "model", "b", stripes=2, cell_size=CELL)  # same bytes: same stripes
    write_random(plain_ckpt / "extra.bin", 5000, 9)
    m3 = push(store, plain_ckpt, "model", "c", stripes=2, cell_size=CELL)
    assert [e.tag for e in catalog.list_tags(store, "model")] == ["a", "b", "c"]
    assert catalog.load_manifest(store, "model").tag == "c"
    store.delete(latest_rel("model"))  # a lost hint costs a listing, not a wrong answer
    assert catalog.resolve_latest(store, "model") == "c"
    assert catalog.remove(store, "model", "a") == 0  # b still uses those stripes
    assert all(store.has_blob(s.digest) for s in m2.stripes)
    assert catalog.remove(store, "model", "c") == 2
    assert not any(store.has_blob(s.digest) for s in m3.stripes)
    assert catalog.load_manifest(store, "model").tag == "b"
    with pytest.raises(StoreError, match="not found"):
        catalog.load_manifest(store, "model", "a")
    assert m1.stripes == m2.stripes


def _pushed(tmp_path: Path, plain_ckpt: Path) -> tuple[Store, object]:
    store = file_store(tmp_path)
    m = push(store, plain_ckpt, "model", "v1", stripes=3, cell_size=CELL)
    return store, m


def _no_leftovers(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.bootseer-part")]


def test_flipped_byte_fails_pull_and_leaves_nothing(tmp_path: Path, plain_ckpt: Path) -> None:
    store, m = _pushed(tmp_path, plain_ckpt)
    f = stripe_file(Path(store.root), m.stripes[1].digest)  # type: ignore[attr-defined]
    data = bytearray(f.read_bytes())
    data[CELL + 100] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its checksum"):
        pull(m, catalog.Targets(store), tmp_path / "out")  # type: ignore[arg-type]
    _no_leftovers(tmp_path, "out")


def test_missing_and_truncated_stripes_fail_pull(tmp_path: Path, plain_ckpt: Path) -> None:
    store, m = _pushed(tmp_path, plain_ckpt)
    f = stripe_file(Path(store.root), m.stripes[2].digest)  # type: ignore[attr-defined]
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(StoreError, match=r"short read|truncated"):
        pull(m, catalog.Targets(store), tmp_path / "out", opts=ReaderOptions(retries=0))  # type: ignore[arg-type]
    _no_leftovers(tmp_path, "out")
    f.unlink()
    with pytest.raises(StoreError, match="missing"):
        pull(m, catalog.Targets(store), tmp_path / "out")  # type: ignore[arg-type]
    _no_leftovers(tmp_path, "out")


def test_pull_replaces_atomically_only_when_asked(tmp_path: Path, plain_ckpt: Path) -> None:
    store, m = _pushed(tmp_path, plain_ckpt)
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "old").write_text("keep me")
    with pytest.raises(BootseerError, match="already exists"):
        pull(m, catalog.Targets(store), dest)  # type: ignore[arg-type]
    assert (dest / "old").read_text() == "keep me"
    pull(m, catalog.Targets(store), dest, replace=True)  # type: ignore[arg-type]
    assert same_tree(plain_ckpt, dest)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.bootseer-")] == [".out.bootseer-ckpt.json"]


def test_cli_and_api(tmp_path: Path, plain_ckpt: Path) -> None:
    import bootseer_cli.ckpt

    uri = (tmp_path / "store").as_uri()
    tag = bootseer_cli.ckpt.push(plain_ckpt, "api", store=uri, stripes=2, cell_size=CELL)
    env = {"BOOTSEER_STORE": uri}
    r = run_cli("ckpt", "ls", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [(e["name"], e["tag"], e["stripes"]) for e in json.loads(r.stdout)] == [("api", tag, 2)]
    args = ["--name", "cli", "--tag", "t1", "-k", "3", "--cell-size", "64KiB"]
    r = run_cli("ckpt", "push", str(plain_ckpt), *args, env=env)
    assert r.returncode == 0 and "pushed cli:t1" in r.stdout, r.stderr
    r = run_cli("ckpt", "pull", "cli:latest", str(tmp_path / "dst"), env=env)
    assert r.returncode == 0, r.stderr
    assert same_tree(plain_ckpt, tmp_path / "dst")
    r = run_cli("ckpt", "pull", "cli", str(tmp_path / "dst2"), "--store", (tmp_path / "nostore").as_uri())
    assert r.returncode == 1 and r.stderr.startswith("bootseer: error: checkpoint cli: no tags")
    assert "Traceback" not in r.stderr
    # a truncated manifest: one clear line, not a traceback
    store = Store(uri)
    rel = manifest_rel("cli", "t1")
    store.put_bytes(rel, (store.get_bytes(rel) or b"")[:200])
    r = run_cli("ckpt", "pull", "cli:t1", str(tmp_path / "dst3"), env=env)
    assert r.returncode == 1 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "dst3").exists()
    r = run_cli("ckpt", "mount", "cli:t1", str(tmp_path / "mnt"), env=env)
    assert r.returncode == 1 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("ckpt", "rm", "api:" + tag, env=env)
    assert r.returncode == 0 and "removed" in r.stdout, r.stderr
    r = run_cli("ckpt", "push", str(tmp_path / "nope"), "--name", "x", env=env)
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_pull_of_whole_stripes_through_the_node_cache(tmp_path: Path, plain_ckpt: Path) -> None:
    """With [p2p] on, pull fetches whole stripes via delivery.fetch_blob (cache → swarm → store)."""
    from bootseer_cli.config import load
    from bootseer_cli.settings import Settings
    from bootseer_cli.store.cache import cache_for

    store, m = _pushed(tmp_path, plain_ckpt)
    settings = Settings.from_config(load(None))
    cache = cache_for(settings.store)
    r = pull(m, catalog.Targets(store), tmp_path / "out", p2p=settings.p2p, cache=cache, whole_stripes=True)  # type: ignore[arg-type]
    assert same_tree(plain_ckpt, tmp_path / "out")
    assert r.bytes_from_store == m.total_size  # type: ignore[attr-defined]
    assert all(cache.get(s.digest) is not None for s in m.stripes)  # type: ignore[attr-defined]
    r = pull(m, catalog.Targets(store), tmp_path / "again", p2p=settings.p2p, cache=cache, whole_stripes=True)  # type: ignore[arg-type]
    assert r.bytes_from_store == 0 and same_tree(plain_ckpt, tmp_path / "again")  # served by the node cache
