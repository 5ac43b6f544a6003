"""`bootseer gc` (issue 17, item 1): keep policies over every ref kind, orphan blobs, leases, dry runs.

Against a file:// store and the loopback S3 server (`store_uri`). Objects on S3 cannot be back-dated,
so the policies are evaluated at a `now` 40 days ahead: everything written by the test is then 40 days
old, and "recent" things carry a `used`/`created` time in that future.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bootseer_cli import gc
from bootseer_cli.store.core import Store, blob_path
from bootseer_cli.stripe.layout import manifest_rel
from bootseer_cli.stripe.push import push

DAY = 86400.0
LATER = time.time() + 40 * DAY  # the gc's clock in these tests


def _env(store: Store, key: str, data: bytes, **times: float) -> str:
    digest = store.put_blob_bytes(data)
    store.write_ref("env", key, {"blob": digest, "size": len(data), "created": time.time(), **times})
    return digest


def _ckpt(store: Store, tmp: Path, tag: str, created: float) -> list[str]:
    src = tmp / f"ckpt-{tag}"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(3000))
    m = push(store, src, "model", tag, stripes=2, cell_size=1024)
    doc = json.loads(store.get_bytes(manifest_rel("model", tag)) or b"{}")
    store.put_bytes(manifest_rel("model", tag), json.dumps(doc | {"created": created}).encode())
    return [s.digest for s in m.stripes]


def _populate(store: Store, tmp: Path) -> dict[str, object]:
    """One of each kind, old and recent (relative to LATER)."""
    f: dict[str, object] = {}
    f["old_env"] = _env(store, "a" * 64, os.urandom(2000))
    f["used_env"] = _env(store, "b" * 64, os.urandom(2000), used=LATER - DAY)
    f["shared"] = _env(store, "c" * 64, b"shared snapshot")  # old, but …
    _env(store, "d" * 64, b"shared snapshot", created=LATER)  # … a recent ref names the same blob
    f["leased_env"] = _env(store, "e" * 64, os.urandom(500))
    hot = store.put_blob_bytes(os.urandom(700))
    store.write_ref("hot", "f" * 64, {"blob": hot, "created": time.time()})
    f["hot"] = hot
    f["orphan"] = store.put_blob_bytes(os.urandom(1500))
    tor = store.put_blob_bytes(b"d8:announce0:e")
    store.write_ref("torrent", str(f["used_env"]), {"torrent": tor, "size": 2000})
    f["torrent"] = tor
    store.put_bytes("refs/compile/k1/0001-n-x.json", _shard(store, 800, used=time.time()))
    store.put_bytes("refs/compile/k2/0001-n-x.json", _shard(store, 900, used=LATER))
    f["tags"] = [_ckpt(store, tmp, t, LATER - 3 + i) for i, t in enumerate(("t1", "t2", "t3"))]
    store.put_bytes("events/job1/n-r.parquet", b"PAR1 not really")
    return f


def _shard(store: Store, size: int, used: float) -> bytes:
    digest = store.put_blob_bytes(os.urandom(size))
    return json.dumps({"v": 1, "entries": {"a.bin": {"digest": digest, "size": size, "used": used}}}).encode()


def test_gc_policies_dry_run_then_apply(store_uri: str, tmp_path: Path) -> None:
    store = Store(store_uri, settle_s=0.05)
    f = _populate(store, tmp_path)
    policy = gc.Policy(keep_days=30, keep_tags=2, now=LATER)
    blobs_before = {x.rel for x in store.list_info("blobs")}
    lease = store.try_lease(f"env-{'e' * 64}", ttl_s=41 * DAY)  # a build of env e… in progress
    assert lease is not None
    plan = gc.plan(store, policy)
    assert not any(d.kind == "blob" or d.name == "e" * 64 for d in plan.doomed), "a live build lease holds them"
    assert any("lease" in why for why in plan.held)
    lease.release()
    plan = gc.plan(store, policy)
    names = {(d.kind, d.name) for d in plan.doomed}
    assert names >= {("env", "a" * 64), ("env", "c" * 64), ("hot", "f" * 64), ("compile", "k1"), ("ckpt", "model:t1")}
    assert ("events", "job1/n-r.parquet") in names
    assert ("blob", f["old_env"]) in names and ("blob", f["orphan"]) in names and ("blob", f["hot"]) in names
    kept = {("env", "b" * 64), ("env", "d" * 64), ("compile", "k2"), ("ckpt", "model:t2"), ("ckpt", "model:t3")}
    assert not names & kept and ("env", "e" * 64) in names
    for digest in (f["shared"], f["used_env"], f["torrent"], *f["tags"][1], *f["tags"][2]):
        assert ("blob", digest) not in names, digest
    assert all(("blob", d) in names for d in f["tags"][0])  # the removed tag's stripes
    sizes = {x.rel: x.size for x in [*store.list_info(""), *store.list_info("blobs")]}  # the domain, the blobs
    assert plan.freed_bytes == sum(sizes[r] for d in plan.doomed for r in d.rels)
    assert {x.rel for x in store.list_info("blobs")} == blobs_before, "a dry run removes nothing"

    done = gc.apply(store, plan)
    assert done.freed_bytes == plan.freed_bytes
    assert store.read_ref("env", "a" * 64) is None and store.read_ref("hot", "f" * 64) is None
    assert not store.has_blob(str(f["old_env"])) and not store.has_blob(str(f["orphan"]))
    assert store.has_blob(str(f["shared"])) and store.has_blob(str(f["used_env"])) and store.has_blob(str(f["torrent"]))
    assert store.read_ref("env", "b" * 64) is not None and store.read_ref("env", "d" * 64) is not None
    assert not store.exists(manifest_rel("model", "t1")) and store.exists(manifest_rel("model", "t2"))
    assert store.list("events") == []
    assert gc.plan(store, policy).doomed == [], "a second gc finds nothing more"


def test_ref_published_during_gc_keeps_its_blob(tmp_path: Path) -> None:
    """apply() looks at the refs again before deleting blobs: a ref that reuses an orphan keeps it."""
    store = Store((tmp_path / "store").as_uri())
    orphan = store.put_blob_bytes(os.urandom(100))
    plan = gc.plan(store, gc.Policy(now=LATER))
    assert [d.name for d in plan.doomed] == [orphan]
    store.write_ref("env", "9" * 64, {"blob": orphan, "created": time.time()})  # published meanwhile
    assert gc.apply(store, plan).doomed == [] and store.has_blob(orphan)


def test_recent_orphans_and_live_fetch_leases_are_kept(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    young = store.put_blob_bytes(os.urandom(100))
    assert gc.plan(store, gc.Policy()).doomed == [], "an orphan younger than the grace may be a publication"
    fetching = store.put_blob_bytes(os.urandom(100))
    assert store.try_lease(f"p2p-{fetching}", ttl_s=41 * DAY) is not None
    assert [d.name for d in gc.plan(store, gc.Policy(now=LATER)).doomed] == [young]


def test_the_plan_counts_what_it_keeps_and_why(tmp_path: Path) -> None:
    """ "would free 0 B" comes with the space kept: blobs named by a ref, under a live lease, too young."""
    store = Store((tmp_path / "store").as_uri())
    _env(store, "c" * 64, os.urandom(300))
    fetching = store.put_blob_bytes(os.urandom(200))
    assert store.try_lease(f"p2p-{fetching}", ttl_s=3600) is not None
    store.put_blob_bytes(os.urandom(100))  # an orphan, younger than the grace
    plan = gc.plan(store, gc.Policy())
    assert plan.doomed == [] and plan.kept == {"ref": (1, 300), "lease": (1, 200), "grace": (1, 100)}
    assert plan.kept_bytes == 600


def test_touch_used_at_most_once_a_day(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    doc = {"blob": "0" * 64, "created": time.time() - 2 * DAY, "_source": "cache"}
    gc.touch_used(store, "env", "k", doc)
    written = store.read_ref("env", "k") or {}
    assert written["used"] > time.time() - 60 and "_source" not in written
    mtime = os.stat(store.path(store.ref_path("env", "k"))).st_mtime_ns
    gc.touch_used(store, "env", "k", written)
    assert os.stat(store.path(store.ref_path("env", "k"))).st_mtime_ns == mtime, "no second write the same day"


def _bootseer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bootseer_cli", *args], capture_output=True, text=True, timeout=60)


def test_gc_cli_on_the_default_store(isolated_cache: Path) -> None:
    """The verb: --dry-run shows the items and the space, --json, then removes; run dirs too; bad input."""
    from bootseer_cli.paths import default_store_uri, runs_dir

    store = Store(default_store_uri())
    old = time.time() - 40 * DAY
    digest = _env(store, "a" * 64, os.urandom(5000), created=old)
    live = _env(store, "b" * 64, os.urandom(100))
    for rel in (blob_path(digest), store.ref_path("env", "a" * 64)):
        os.utime(store.path(rel), (old, old))
    run = runs_dir() / "20201010T000000-aaaa"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    os.utime(run / "run.json", (old, old))
    os.utime(run, (old, old))
    r = _bootseer("gc", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would remove env" in r.stdout and "would free 5.1 kB" in r.stdout and store.has_blob(digest)
    assert "kept 1 blob(s), 100 B: 1 (100 B) named by a ref" in r.stdout, r.stdout
    doc = json.loads(_bootseer("gc", "--json").stdout)
    assert doc["kept"] == {"ref": {"blobs": 1, "bytes": 100}} and doc["kept_bytes"] == 100
    assert {(d["kind"], d["name"]) for d in doc["removed"]} == {("env", "a" * 64), ("blob", digest), ("run", run.name)}
    assert not store.has_blob(digest) and store.has_blob(live) and not run.exists()
    bad = _bootseer("gc", "--keep-tags", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--keep-tags" in bad.stderr
