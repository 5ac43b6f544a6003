"""Trust domains (issue 25): nothing one job writes can run in another job unless its owner signed it.

Each case of the issue, tried as an attacker would: a store writer without the signing key, and a
tenant whose training code writes into its own compile cache. Domains and keys are real (Ed25519
through `cryptography`), the store is a real directory or a loopback S3 server, the restores are the
stages' own."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.compilecache.index import Entry, write_index
from bootseer_cli.compilecache.key import current_compile_key
from bootseer_cli.compilecache.stage import run_stage
from bootseer_cli.compilecache.tasks import PublishTask, publish_task
from bootseer_cli.settings import CompileSettings, ExecSettings, Settings, StoreSettings, TrustSettings
from bootseer_cli.stage import StageContext
from bootseer_cli.store.core import Store, open_store, open_store_for
from bootseer_cli.trust import keygen
from bootseer_cli.unverified import say
from tests.compilecache.conftest import TEST_KEYS, FakeAgent, new_run, usual_job

PAYLOAD = b"import os; os.system('touch /tmp/pwned')  # unpickled or imported by torch.compile"


@dataclasses.dataclass
class Tenant:
    name: str
    key: str
    pub: str


@pytest.fixture
def tenants(tmp_path: Path) -> dict[str, Tenant]:
    out = {}
    for name in ("tenant-a", "tenant-b"):
        keygen(str(tmp_path / f"{name}.key"), str(tmp_path / f"{name}.pub"), name)
        out[name] = Tenant(name, str(tmp_path / f"{name}.key"), str(tmp_path / f"{name}.pub"))
    return out


def settings_for(root: Path, store_uri: str, t: Tenant, *, trusts: list[Tenant] = (), node: str = "n") -> Settings:
    """A node of tenant `t`: its own domain and key, verifying its own key and those of `trusts`."""
    return Settings(
        store=StoreSettings(uri=store_uri, cache_dir=root / f"blobs-{t.name}-{node}", domain=t.name),
        exec=ExecSettings(agent=True),
        compile=CompileSettings(enabled=True, cache_dir=root / f"compile-{t.name}-{node}"),
        trust=TrustSettings(
            read_from=tuple(o.name for o in trusts),
            signing_key=Path(t.key),
            verify_keys=(t.pub, *(o.pub for o in trusts)),
        ),
    )


def ctx_for(root: Path, settings: Settings, node: str) -> StageContext:
    ctx = StageContext(settings=settings, run=new_run(root, node), command=[sys.executable], quiet=True)
    ctx._keys = TEST_KEYS
    return ctx


def publish_as_agent(ctx: StageContext) -> None:
    (task,) = [t for t in ctx.agent_tasks if isinstance(t, PublishTask)]
    publish_task(task, FakeAgent(store=open_store_for(ctx.settings), run=ctx.run))


def payloads(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.read_bytes() == PAYLOAD]


def test_a_store_writer_cannot_add_a_compile_cache_entry(
    tmp_path: Path, tenants: dict[str, Tenant], capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 1b: one index shard, written by whoever can write the store, pointing at a payload."""
    a = tenants["tenant-a"]
    uri = (tmp_path / "store").as_uri()
    ck = current_compile_key(TEST_KEYS, usual_job())
    assert ck is not None
    forger = open_store(uri).use_trust(dataclasses.replace(open_store(uri).trust, domain=a.name))  # no key
    digest = forger.put_blob_bytes(PAYLOAD)
    write_index(
        forger, ck.digest, "evil", {"inductor/fxgraph/ab/0000pwn": Entry(digest, len(PAYLOAD), time.time())}, []
    )
    ctx = ctx_for(tmp_path, settings_for(tmp_path, uri, a), "victim")
    res = run_stage(ctx)
    assert res.extra.get("files", 0) == 0 and not payloads(tmp_path / f"compile-{a.name}-n")
    say()  # what exec does after its stages: one line for every unsigned ref they refused (issue 46)
    assert "1 unsigned ref in" in capsys.readouterr().err


def test_tenant_a_cannot_put_code_into_tenant_b_through_the_agents_publish(
    tmp_path: Path, tenants: dict[str, Tenant]
) -> None:
    """Case 1a: A's training code drops a payload into its own cache; root's agent publishes A's run.
    B runs the same image, env and torch, and restores the key: nothing of A's reaches B."""
    a, b = tenants["tenant-a"], tenants["tenant-b"]
    uri = (tmp_path / "store").as_uri()
    ctx_a = ctx_for(tmp_path, settings_for(tmp_path, uri, a), "a1")
    run_stage(ctx_a)
    inductor = Path(ctx_a.exports["TORCHINDUCTOR_CACHE_DIR"])
    (inductor / "fxgraph" / "ab").mkdir(parents=True)
    (inductor / "fxgraph" / "ab" / "0000pwn").write_bytes(PAYLOAD)
    publish_as_agent(ctx_a)
    ctx_a2 = ctx_for(tmp_path, settings_for(tmp_path, uri, a, node="a2"), "a2")
    assert run_stage(ctx_a2).extra["files"] == 1  # premise: A's own next start gets A's cache
    ctx_b = ctx_for(tmp_path, settings_for(tmp_path, uri, b), "b1")
    res = run_stage(ctx_b)
    assert res.extra.get("files", 0) == 0 and res.outcome == "miss"
    assert not payloads(tmp_path / f"compile-{b.name}-n")
    # Even trusting A's key for reading other refs, a compile cache is never read across domains.
    ctx_b2 = ctx_for(tmp_path, settings_for(tmp_path, uri, b, trusts=[a], node="b2"), "b2")
    assert run_stage(ctx_b2).extra.get("files", 0) == 0


def test_a_forged_env_ref_is_a_miss_with_a_warning(
    tmp_path: Path, tenants: dict[str, Tenant], capsys: pytest.CaptureFixture[str]
) -> None:
    """Case 2: `refs/env/<key>.json` written by a job (no key) naming a venv with a sitecustomize.py."""
    a = tenants["tenant-a"]
    uri = (tmp_path / "store").as_uri()
    settings = settings_for(tmp_path, uri, a)
    forger = open_store(uri)
    forger.domain = a.name  # the same prefix, without the key
    digest = forger.put_blob_bytes(b"sitecustomize payload")
    forger.write_ref("env", "e" * 64, {"blob": digest, "size": 21, "files": 1})
    store = open_store_for(settings)
    assert store.read_ref("env", "e" * 64) is None
    say()
    assert "1 unsigned ref in" in capsys.readouterr().err
    store.write_ref("env", "e" * 64, {"blob": digest, "size": 21, "files": 1})  # the owner's own, signed
    assert store.read_ref("env", "e" * 64) == {"blob": digest, "size": 21, "files": 1}
    raw = json.loads((tmp_path / "store" / a.name / "refs" / "env" / f"{'e' * 64}.json").read_text())
    raw["blob"] = "f" * 64  # a writer edits a signed ref
    (tmp_path / "store" / a.name / "refs" / "env" / f"{'e' * 64}.json").write_text(json.dumps(raw))
    assert store.read_ref("env", "e" * 64) is None and "bad signature" in capsys.readouterr().err


def test_a_forged_swarm_entry_is_no_peer(tmp_path: Path, tenants: dict[str, Tenant]) -> None:
    from bootseer_cli.p2p.discovery import Announcer, swarm_peers

    a = tenants["tenant-a"]
    store = open_store_for(settings_for(tmp_path, (tmp_path / "store").as_uri(), a))
    Announcer(store, "d" * 64, "127.0.0.1", 7001).write("seed")
    forged = store.path(f"swarm/{'d' * 64}/evil.json")
    Path(forged).write_text(json.dumps({"host": "10.6.6.6", "port": 6666, "state": "seed", "updated": time.time()}))
    assert [(p.host, p.port) for p in swarm_peers(store, "d" * 64)] == [("127.0.0.1", 7001)]


def test_a_forged_lease_holds_nobody_back(tmp_path: Path, tenants: dict[str, Tenant]) -> None:
    a = tenants["tenant-a"]
    store = open_store_for(settings_for(tmp_path, (tmp_path / "store").as_uri(), a))
    path = Path(store.path("leases/env-" + "e" * 64))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"owner": "evil", "expires": time.time() + 4e9, "ttl": 4e9}))
    lease = store.try_lease("env-" + "e" * 64, 60)
    assert lease is not None  # taken over at once: a lease that does not verify is a stale one
    assert store.read_lease("env-" + "e" * 64)["owner"] == lease.owner


def test_two_domains_share_a_store_only_when_trusted(tmp_path: Path, tenants: dict[str, Tenant]) -> None:
    """A's snapshots are invisible to B until B trusts A's key (read_from + verify_keys); then B uses them."""
    a, b = tenants["tenant-a"], tenants["tenant-b"]
    uri = (tmp_path / "store").as_uri()
    sa = open_store_for(settings_for(tmp_path, uri, a))
    digest = sa.put_blob_bytes(b"an env snapshot")
    sa.write_ref("env", "k" * 64, {"blob": digest, "size": 15})
    alone = open_store_for(settings_for(tmp_path, uri, b))
    assert alone.read_ref("env", "k" * 64) is None and alone.list_refs("env") == []
    reading = open_store_for(settings_for(tmp_path, uri, b, trusts=[a]))
    assert reading.read_ref("env", "k" * 64) == {"blob": digest, "size": 15}
    assert reading.list_refs("env") == ["k" * 64]
    # B's own ref of the same key wins over A's; B never writes into A's domain.
    reading.write_ref("env", "k" * 64, {"blob": digest, "size": 15, "by": "b"})
    assert reading.read_ref("env", "k" * 64)["by"] == "b" and "by" not in sa.read_ref("env", "k" * 64)
    assert os.path.exists(tmp_path / "store" / b.name / "refs" / "env" / f"{'k' * 64}.json")


def test_a_key_rotation_retires_what_the_old_key_signed(tmp_path: Path, tenants: dict[str, Tenant]) -> None:
    a = tenants["tenant-a"]
    uri = (tmp_path / "store").as_uri()
    old = open_store_for(settings_for(tmp_path, uri, a))
    old.write_ref("hot", "h" * 64, {"blob": "0" * 64})
    keygen(str(tmp_path / "new.key"), str(tmp_path / "new.pub"), a.name)
    rotated = dataclasses.replace(a, key=str(tmp_path / "new.key"), pub=str(tmp_path / "new.pub"))
    both = settings_for(tmp_path, uri, rotated)
    both = dataclasses.replace(both, trust=dataclasses.replace(both.trust, verify_keys=(a.pub, rotated.pub)))
    assert open_store_for(both).read_ref("hot", "h" * 64) is not None  # during the rotation: both trusted
    assert open_store_for(settings_for(tmp_path, uri, rotated)).read_ref("hot", "h" * 64) is None


def test_without_keys_a_user_reads_only_their_own_domain(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    alice = open_store(uri).use_trust(dataclasses.replace(open_store(uri).trust, domain="alice"))
    alice.write_ref("env", "k" * 64, {"blob": "0" * 64})
    bob_settings = Settings(store=StoreSettings(uri=uri, domain="bob"), trust=TrustSettings(read_from=("alice",)))
    assert open_store_for(bob_settings).read_ref("env", "k" * 64) is None  # unsigned: never across domains
    assert isinstance(alice, Store)


def test_b_restores_a_snapshot_of_a_only_once_it_trusts_a(tmp_path: Path, tenants: dict[str, Tenant]) -> None:
    """The whole flow through the CLI: A's start builds and publishes its env (signed, in A's domain); B, on
    a fresh node, misses it until its config reads A's domain with A's key, then restores it."""
    from tests.envsnap.conftest import run_cli

    a, b = tenants["tenant-a"], tenants["tenant-b"]
    tree = tmp_path / "venv"
    tree.mkdir()
    store = (tmp_path / "store").as_uri()
    setup = f"mkdir -p {tree}/pkg && echo 'X = 1' > {tree}/pkg/mod.py && echo run >> {tmp_path}/runs"
    env_section = f'[env]\nroots = ["{tree}"]\nwait_s = 20\nsetup = {json.dumps([setup])}\n'

    def config(t: Tenant, reads: list[Tenant]) -> None:
        keys = [t.pub, *(r.pub for r in reads)]
        (tmp_path / "bootseer.toml").write_text(
            f'[store]\nuri = "{store}"\ndomain = "{t.name}"\n[exec]\nagent = false\n{env_section}'
            f'[trust]\nsigning_key = "{t.key}"\nverify_keys = {json.dumps(keys)}\n'
            f"read_from = {json.dumps([r.name for r in reads])}\n"
        )

    config(a, [])
    r = run_cli(["exec", "--", "true"], tmp_path, tmp_path / "node-a")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runs").read_text().count("run") == 1
    assert list((tmp_path / "store" / a.name / "refs" / "env").glob("*.json"))
    import shutil

    shutil.rmtree(tree)
    tree.mkdir()  # B's fresh node: the image's empty tree
    config(b, [])
    r = run_cli(["restore"], tmp_path, tmp_path / "node-b")
    assert r.returncode == 3, r.stderr  # no snapshot B may use
    config(b, [a])
    r = run_cli(["restore"], tmp_path, tmp_path / "node-b")
    assert r.returncode == 0, r.stderr
    assert (tree / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert (tmp_path / "runs").read_text().count("run") == 1  # restored, not set up again


def test_gc_keeps_what_any_domain_names_and_deletes_only_its_own(tmp_path: Path) -> None:
    """Blobs are shared: one domain's gc must not take another's blobs, nor delete its refs."""
    from bootseer_cli import gc

    uri = (tmp_path / "store").as_uri()
    alice = open_store(uri).use_trust(dataclasses.replace(open_store(uri).trust, domain="alice"))
    bob = open_store(uri).use_trust(dataclasses.replace(open_store(uri).trust, domain="bob"))
    shared = bob.put_blob_bytes(b"bob's snapshot")
    bob.write_ref("env", "b" * 64, {"blob": shared, "created": 1e9})
    alice.write_ref("env", "a" * 64, {"blob": alice.put_blob_bytes(b"alice's old one"), "created": 1e9})
    later = gc.Policy(keep_days=1, grace_s=0, now=time.time() + 10 * 86400)  # both refs unused for 10 days
    done = gc.apply(alice, gc.plan(alice, later))
    assert ("env", "a" * 64) in {(d.kind, d.name) for d in done.doomed}  # alice's own old ref goes
    assert bob.read_ref("env", "b" * 64) is not None and bob.has_blob(shared)  # bob's stays, and its blob
