"""Layered snapshots with real pip installs from a loopback index: a bump builds over the published
parent and publishes only the difference; fresh nodes restore the chain to the builder's very tree.

The index holds real small wheels (six, idna, iniconfig, packaging) and a test project, `bslayer`, in
versions 1.0 and 1.1 built here as real wheels: 1.0 has a module `old.py` that 1.1 dropped (the
deletion a layer must carry), both have `core.py` with their version."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.envsnap.conftest import killed_restore, run_cli, tree_state
from tests.envsnap.test_cycle import PY, make_venv
from tests.support import pkgindex

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    from bootseer_cli.keys import Keys
    from bootseer_cli.store.core import Store


def write_wheel(dest: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A real py3-none-any wheel of `files` (path -> text), with METADATA, WHEEL and RECORD."""
    dist = f"{name}-{version}"
    out = dest / f"{dist}-py3-none-any.whl"
    body = {p: t.encode() for p, t in files.items()}
    body[f"{dist}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    body[f"{dist}.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    rows = []
    for p, data in body.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{p},sha256={h},{len(data)}")
    rows.append(f"{dist}.dist-info/RECORD,,")
    body[f"{dist}.dist-info/RECORD"] = ("\n".join(rows) + "\n").encode()
    with zipfile.ZipFile(out, "w") as z:
        for p, data in body.items():
            z.writestr(p, data)
    return out


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pkgindex.PackageIndex]:
    root = tmp_path_factory.mktemp("layers-index")
    pkgindex.wheelhouse(root, pkgindex.SMALL_WHEELS)
    for v in ("1.0", "1.1", "1.2", "1.3"):
        files = {"bslayer/__init__.py": f"VERSION = {v!r}\n", "bslayer/core.py": f"X = {v!r}\n"}
        if v == "1.0":
            files["bslayer/old.py"] = "OLD = True\n"
        write_wheel(root, "bslayer", v, files)
    with pkgindex.PackageIndex(root) as idx:
        yield idx


class Job:
    """A project dir with a bootseer.toml whose setup is `pip install -r reqs.txt` into one venv."""

    def __init__(self, tmp: Path, index: pkgindex.PackageIndex, extra: str = "") -> None:
        self.tmp = tmp
        self.venv = tmp / "venv"
        self.store = tmp / "store"
        self.marker = tmp / "setup-runs"
        self.env = index.pip_env()
        make_venv(self.venv)
        install = f"{sys.executable} -m pip --python {self.venv}/bin/python install -r reqs.txt"
        (tmp / "bootseer.toml").write_text(
            f'[store]\nuri = "{self.store.as_uri()}"\n[exec]\nagent = false\n'
            f'[env]\nroots = ["{self.venv}"]\nwait_s = 30\n{extra}'
            f'setup = ["echo run >> {self.marker}", "{install}"]\n'
        )

    @property
    def site(self) -> Path:
        return self.venv / "lib" / PY / "site-packages"

    def reqs(self, *lines: str) -> None:
        (self.tmp / "reqs.txt").write_text("\n".join(lines) + "\n")

    def exec(self, node: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        check = "import bslayer, six; print(bslayer.VERSION)"
        argv = ["exec", "--", str(self.venv / "bin" / "python"), "-c", check]
        r = run_cli(argv, self.tmp, self.tmp / f"{node}-cache", {**self.env, **(env or {})})
        assert r.returncode == 0, r.stderr
        return r

    def runs(self) -> int:
        return self.marker.read_text().count("run") if self.marker.exists() else 0

    def fresh_node(self) -> None:
        shutil.rmtree(self.venv)
        make_venv(self.venv)

    def built(self) -> dict[str, tuple]:
        """The tree as another node receives it (modes without group/other write, see test_cycle)."""
        return {p: (v[0], v[1] & 0o755, *v[2:]) if v[0] != "l" else v for p, v in tree_state(self.venv).items()}

    def ref(self, key: str | None = None) -> dict:
        refs = sorted((self.store).rglob("refs/env/*.json"), key=lambda p: p.stat().st_mtime)
        p = refs[-1] if key is None else next(r for r in refs if r.stem == key)
        doc = json.loads(p.read_text())
        return {"env_key": p.stem, **doc.get("doc", doc)}

    def blob_path(self, digest: str) -> Path:
        return next(self.store.rglob(f"blobs/sha256/*/{digest}"))


def test_a_bump_builds_a_layer_that_a_fresh_node_restores_exactly(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    job = Job(tmp_path, index)
    job.reqs("bslayer==1.0", "six==1.17.0")
    first = job.exec("n1")
    assert first.stdout.strip() == "1.0" and "published" in first.stderr
    base = job.ref()
    assert base["depth"] == 0 and "chain" not in base and "req bslayer==1.0" in base["inputs"]

    job.reqs("bslayer==1.1", "six==1.17.0", "idna==3.20")  # a patch bump and one new package
    second = job.exec("n1")
    assert second.stdout.strip() == "1.1"
    assert f"setup over {base['env_key'][:12]} (layer 1)" in second.stderr, second.stderr
    layer = job.ref()
    assert layer["depth"] == 1 and [c["key"] for c in layer["chain"]] == [base["env_key"]]
    assert layer["chain"][0]["blob"] == base["blob"] and layer["parent"]["key"] == base["env_key"]
    shown = run_cli(["env", "show", layer["env_key"][:16], "--files", "--json"], tmp_path, tmp_path / "n1-cache")
    assert shown.returncode == 0, shown.stderr
    listed = json.loads(shown.stdout)
    paths = [e[0] for e in listed["entries"]]
    assert not any("/six" in p for p in paths), "the layer holds only the difference"
    assert any("/idna/" in p for p in paths) and any(p.endswith("bslayer/core.py") for p in paths)
    assert any("bslayer-1.0.dist-info" in p or p.endswith("old.py") for p in listed["deletion_paths"]), listed
    assert [r["key"] for r in listed["layers"]] == [base["env_key"], layer["env_key"]]
    assert listed["layers"][1]["cumulative"] == base["size"] + layer["size"]
    text = run_cli(["env", "show", layer["env_key"][:16]], tmp_path, tmp_path / "n1-cache").stdout
    assert "layer 1" in text and "cumulative" in text, text
    assert not (job.site / "bslayer" / "old.py").exists()
    built = job.built()
    assert job.runs() == 2

    job.fresh_node()  # the same image, an empty cache
    third = job.exec("n2")
    assert third.stdout.strip() == "1.1" and "restored" in third.stderr and "(layer 1" in third.stderr, third.stderr
    assert job.runs() == 2, "the fresh node ran the setup"
    assert tree_state(job.venv) == built, "the restored chain differs from the builder's tree"
    assert not (job.site / "bslayer" / "old.py").exists(), "the layer's deletion was not applied"
    cached = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "n2-cache").rglob("sha256/*/*")}
    assert cached[base["blob"]] >= cached[layer["blob"]], "the node cache would evict the parent first"
    again = job.exec("n2")
    assert "env present" in again.stderr, again.stderr

    # a node that carries the parent env restores only the layer
    job.fresh_node()
    job.reqs("bslayer==1.0", "six==1.17.0")
    assert "restored" in job.exec("n3").stderr
    job.reqs("bslayer==1.1", "six==1.17.0", "idna==3.20")
    fourth = job.exec("n3")
    assert "1 link(s) already in the tree" in fourth.stderr, fourth.stderr
    assert tree_state(job.venv) == built

    keys = run_cli(["keys"], tmp_path, tmp_path / "n3-cache", job.env)
    assert keys.returncode == 0 and base["env_key"] in keys.stdout and "layer 1" in keys.stdout, keys.stdout


def test_layers_false_builds_from_the_image(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    job = Job(tmp_path, index, extra="layers = false\n")
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    job.reqs("bslayer==1.1", "six==1.17.0")
    r = job.exec("n1")
    assert "setup over" not in r.stderr and "published" in r.stderr, r.stderr
    ref = job.ref()
    assert ref["depth"] == 0 and "chain" not in ref


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_parent_blob_is_a_miss_and_the_setup_runs(
    tmp_path: Path, index: pkgindex.PackageIndex, damage: str
) -> None:
    job = Job(tmp_path, index)
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    base = job.ref()
    job.reqs("bslayer==1.1", "six==1.17.0")
    job.exec("n1")
    layer = job.ref()
    assert layer["depth"] == 1
    built = job.built()
    blob = job.blob_path(base["blob"])
    if damage == "missing":
        blob.unlink()
    else:
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.chmod(0o644)
        blob.write_bytes(bytes(data))

    job.fresh_node()  # restoring the chain fails on its first link: the setup runs instead
    r = job.exec("n2")
    assert r.stdout.strip() == "1.1" and "running the setup instead" in r.stderr, r.stderr
    assert job.runs() == 3
    assert tree_state(job.venv).keys() == built.keys()

    # a bump over the damaged parent, on a node without it, sets up from the image
    job.fresh_node()
    job.reqs("bslayer==1.0", "six==1.17.0", "idna==3.20")
    r = job.exec("n3")
    if damage == "missing":
        assert "could not be restored" in r.stderr or "setup over" not in r.stderr, r.stderr
    assert r.stdout.strip() == "1.0"


def test_a_killed_layered_restore_is_recovered_by_the_next_start(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    job = Job(tmp_path, index)
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    job.reqs("bslayer==1.1", "six==1.17.0", "idna==3.20")
    job.exec("n1")
    built = job.built()

    job.fresh_node()
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n2")  # this node carries the parent: the restore below applies only the layer
    job.reqs("bslayer==1.1", "six==1.17.0", "idna==3.20")
    killed_restore(tmp_path, tmp_path / "n2-cache", "member:3")
    assert (job.venv / ".bootseer-env.journal").exists()

    r = job.exec("n2")
    assert r.stdout.strip() == "1.1" and "restored" in r.stderr, r.stderr
    assert job.runs() == 2
    assert tree_state(job.venv) == built
    assert not [n for n in os.listdir(job.venv) if n.startswith(".bootseer-undo-") or n.endswith(".journal")]


def test_max_layers_squashes_and_gc_keeps_chains(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    from bootseer_cli import gc as gclib
    from bootseer_cli.store.core import Store
    from bootseer_cli.upkeep import Policy

    job = Job(tmp_path, index, extra="max_layers = 2\n")
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    v0 = job.ref()
    job.reqs("bslayer==1.1", "six==1.17.0")
    job.exec("n1")
    v1 = job.ref()
    assert v1["depth"] == 1
    job.reqs("bslayer==1.2", "six==1.17.0")
    r = job.exec("n1")
    assert "(layer 2)" in r.stderr and "squashed" in r.stderr, r.stderr
    v2 = job.ref()
    assert v2["depth"] == 0 and "chain" not in v2 and v2["squashed"], v2
    built = job.built()
    # the next bump builds over the squashed snapshot: a chain of one again, within max_layers
    job.reqs("bslayer==1.3", "six==1.17.0")
    r = job.exec("n1")
    v3 = job.ref()
    assert f"setup over {v2['env_key'][:12]} (layer 1)" in r.stderr, r.stderr
    assert [c["blob"] for c in v3["chain"]] == [v2["blob"]]

    job.fresh_node()
    job.reqs("bslayer==1.2", "six==1.17.0")
    r = job.exec("n2")
    assert "restored" in r.stderr and "(layer" not in r.stderr, r.stderr
    assert tree_state(job.venv) == built

    # gc: drop v0's ref; v1 (a live layer) still names v0's blob, so it stays. The squashed layer's blob
    # is named by no ref: an orphan, removed.
    store = Store(job.store.as_uri())
    store.delete_ref("env", v0["env_key"])
    assert list(job.store.rglob(f"blobs/sha256/*/{v2['squashed']}*")), "premise: the squashed layer's blob"
    plan = gclib.plan(store, Policy(keep_days=30, grace_s=0))
    gclib.apply(store, plan)
    assert job.blob_path(v0["blob"]).exists(), "gc removed a live chain's link"
    assert job.blob_path(v1["blob"]).exists()
    assert not list(job.store.rglob(f"blobs/sha256/*/{v2['squashed']}*")), "gc kept an orphan layer"


def test_two_jobs_over_one_parent_each_restore_their_own_child(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    job = Job(tmp_path, index)
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    base = job.ref()
    job.reqs("bslayer==1.0", "six==1.17.0", "iniconfig==2.3.0")
    job.exec("n1")
    a = job.ref()
    built_a = job.built()
    job.reqs("bslayer==1.0", "six==1.17.0", "packaging==26.3")
    r = job.exec("n1")
    b = job.ref()
    built_b = job.built()
    assert a["parent"]["key"] == base["env_key"], a
    assert b["parent"]["key"] == base["env_key"], (b, r.stderr)
    assert not (job.site / "iniconfig").exists(), "job B's tree holds job A's package"

    job.fresh_node()
    job.reqs("bslayer==1.0", "six==1.17.0", "iniconfig==2.3.0")
    job.exec("n2")
    assert tree_state(job.venv) == built_a
    job.fresh_node()
    job.reqs("bslayer==1.0", "six==1.17.0", "packaging==26.3")
    job.exec("n3")
    assert tree_state(job.venv) == built_b


def test_the_agent_squashes_in_the_background(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    """With the agent (the default), the layer at max_layers is uploaded and then squashed after exec."""
    import time

    job = Job(tmp_path, index, extra="max_layers = 1\n")
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    job.reqs("bslayer==1.1", "six==1.17.0")
    env = {k: v for k, v in pkgindex.clean_env(job.env).items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "n1-cache"), "BOOTSEER_EXEC_AGENT": "1"})
    argv = [sys.executable, "-m", "bootseer_cli", "exec", "--", str(job.venv / "bin" / "python"), "-c", "pass"]
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "(layer 1)" in r.stderr and "the agent uploads it" in r.stderr, r.stderr
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        refs = list(job.store.rglob("refs/env/*.json"))
        docs = [json.loads(p.read_text()) for p in refs]
        if any(d.get("doc", d).get("squashed") for d in docs):
            break
        time.sleep(0.5)
    else:
        logs = "\n".join(p.read_text() for p in (tmp_path / "n1-cache").rglob("agent.log"))
        pytest.fail(f"the agent did not squash within 120 s:\n{logs[-3000:]}")
    squashed = next(d.get("doc", d) for d in docs if d.get("doc", d).get("squashed"))
    assert squashed["depth"] == 0 and "chain" not in squashed
    built = job.built()
    job.fresh_node()
    again = job.exec("n2")
    assert "restored" in again.stderr and "(layer" not in again.stderr, again.stderr
    assert tree_state(job.venv) == built


RULE_ROOTS = ["/opt/venv"]
MINE = ["cmd pip install -r r.txt", "req a==1", "req b==2", "req c==3"]


def rule_keys() -> Keys:
    from bootseer_cli.keys import Key, Keys

    return Keys(Key({}, "0" * 64), Key({"image": "i1", "machine": "x86_64"}, "f" * 64), "test")


def rule_ref(store: Store, key: str, inputs: list[str], **kw: object) -> None:
    doc = {"blob": "e" * 64, "format": 1, "image": "i1", "machine": "x86_64", "roots": RULE_ROOTS}
    store.write_ref("env", key * 64, {**doc, "inputs": inputs, "created": 100.0, "depth": 0, **kw})


def rule_refs(store: Store) -> None:
    """Refs 1…7 for `MINE`: 1 and 2 share 2 inputs (2 is older), 3 names a package MINE does not, 4…7
    share 3 but differ in image, roots, machine, or have a chain at the bound."""
    rule_ref(store, "1", ["cmd pip install -r r.txt", "req a==1"])  # shares 2
    rule_ref(store, "2", ["cmd pip install -r r.txt", "req a==1", "req b==1"], created=50.0)  # shares 2, older
    rule_ref(store, "3", ["cmd pip install -r r.txt", "req a==1", "req b==2", "req z==1"])  # shares 3, names z
    rule_ref(store, "4", MINE[:3], image="i2")  # another image
    rule_ref(store, "5", MINE[:3], roots=["/other"])
    rule_ref(store, "6", MINE[:3], machine="aarch64")
    rule_ref(store, "7", MINE[:3], depth=8)  # its squash is due


def test_the_parent_rule(tmp_path: Path) -> None:
    """Same image, roots and machine; names kept; the most shared inputs, ties by last use; chains bounded."""
    from bootseer_cli.envsnap.parent import choose
    from bootseer_cli.store.core import Store

    store = Store((tmp_path / "store").as_uri())
    keys, roots, mine = rule_keys(), RULE_ROOTS, MINE
    rule_refs(store)
    c = choose(store, keys, roots, mine, 8, 1)
    assert c is not None and c.key == "1" * 64 and c.shared == 2 and c.candidates == 2
    rule_ref(store, "2", ["cmd pip install -r r.txt", "req a==1", "req b==1"], used=200.0)  # now used last
    assert choose(store, keys, roots, mine, 8, 1).key == "2" * 64
    rule_ref(store, "8", mine[:3])  # shares 3
    assert choose(store, keys, roots, mine, 8, 1).key == "8" * 64
    assert choose(store, keys, ["/elsewhere"], mine, 8, 1) is None


def test_the_parent_search_reads_an_s3_store_concurrently_by_the_same_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ref read costs a round trip (a proxy delays each request 100 ms): 47 refs read one by one
    take ≥ 4.7 s, read 16 at a time well under half that; the choice is the rule's, whatever order the
    reads end in."""
    from bootseer_cli.envsnap.parent import choose
    from bootseer_cli.store.core import Store
    from tests.support import s3server

    for k, v in s3server.S3_ENV.items():
        monkeypatch.setenv(k, v)
    if s3server.rclone_binary() is None:
        pytest.skip("rclone is not installed")
    with s3server.delayed(tmp_path / "s3", delay_ms=100) as (server, proxy):
        direct = Store(server.uri())
        rule_refs(direct)
        rule_ref(direct, "2", ["cmd pip install -r r.txt", "req a==1", "req b==1"], used=200.0)
        for i in range(40):  # fillers of another image: read, never candidates
            rule_ref(direct, f"a{i:03x}" * 16, MINE, image="other")
        slow = Store(server.uri().replace(server.endpoint, proxy.endpoint))
        t0 = time.monotonic()
        c = choose(slow, rule_keys(), RULE_ROOTS, MINE, 8, 1)
        took = time.monotonic() - t0
        assert c is not None and c.key == "2" * 64 and c.shared == 2 and c.candidates == 2
        assert took < 47 * 0.1 / 2, f"{took:.1f} s: the refs were not read concurrently"
        rule_ref(direct, "8", MINE[:3])  # shares 3: the most, read in whatever order
        assert choose(slow, rule_keys(), RULE_ROOTS, MINE, 8, 1).key == "8" * 64


def test_a_store_that_does_not_answer_gives_up_the_parent_search_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3 endpoint that takes connections and never answers: the search ends at `[env]
    parent_search_s` with one warning, and `setup_over` returns None (the build sets up from the image)
    without running anything."""
    import socket

    from bootseer_cli.config import load
    from bootseer_cli.envsnap.layers import setup_over
    from bootseer_cli.envsnap.tree import EnvTree
    from bootseer_cli.settings import Settings
    from bootseer_cli.store.cache import BlobCache
    from bootseer_cli.store.core import Store
    from tests.support import s3server

    for k, v in s3server.S3_ENV.items():
        monkeypatch.setenv(k, v)
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # the kernel completes the handshakes; nobody ever reads a request
    uri = f"s3://b/store?endpoint_override=127.0.0.1:{hole.getsockname()[1]}&scheme=http&region=us-east-1"
    marker = tmp_path / "setup-ran"
    cfg = tmp_path / "bootseer.toml"
    cfg.write_text(
        f'[store]\nuri = "{uri}"\n[env]\nroots = ["{tmp_path / "venv"}"]\nparent_search_s = 1.5\n'
        f'setup = ["touch {marker}"]\n'
    )
    settings = Settings.from_config(load(cfg, environ={}))
    warned: list[str] = []
    try:
        t0 = time.monotonic()
        got = setup_over(
            settings, Store(uri), BlobCache(tmp_path / "cache", 1 << 30), rule_keys(),
            EnvTree([str(tmp_path / "venv")]), lambda m: None, warned.append,
        )  # fmt: skip
        took = time.monotonic() - t0
    finally:
        hole.close()  # the threads left behind get a reset and end
    assert got is None and not marker.exists()
    assert 1.4 < took < 6, took
    assert len(warned) == 1 and "parent_search_s = 1.5 s" in warned[0], warned


def test_a_base_env_prewarmed_from_ci_is_the_parent_of_a_team_file_that_includes_it(tmp_path: Path) -> None:
    """CI prewarms `pip install -r base.txt`; a team's `requirements.txt` says `-r base.txt` plus its own
    lines. The included base's lines count as the team's inputs (shared, their names kept), so the
    prewarmed base is the parent; without following the include the base names packages the team's
    file seemed not to name, and no parent fitted. A binary file in `[env] files` (a wheel) is one
    input, its digest, not lines whose junk "names" no other setup shares."""
    from bootseer_cli.config import load
    from bootseer_cli.envsnap.parent import choose, setup_inputs
    from bootseer_cli.settings import Settings
    from bootseer_cli.store.core import Store

    def env(d: Path, setup: str, **files: str) -> Settings:
        d.mkdir()
        for name, text in files.items():
            (d / name.replace("_", ".")).write_text(text)
        (d / "tool.whl").write_bytes(b"PK\x03\x04\0\nnot-a-requirement==1\n" * 50)  # binary: one input
        (d / "bootseer.toml").write_text(f'[env]\nroots = ["/opt/venv"]\nsetup = ["{setup}"]\nfiles = ["tool.whl"]\n')
        return Settings.from_config(load(d / "bootseer.toml", environ={}))

    base = "torch==2.13.0\nnumpy==2.4.6  # pinned by CI\n"
    ci = env(tmp_path / "ci", "pip install -r base.txt", base_txt=base)
    team = env(
        tmp_path / "team", "pip install -r requirements.txt", base_txt=base,
        requirements_txt="-r base.txt\nsix==1.17.0\n",
    )  # fmt: skip
    mine = setup_inputs(team.env)
    assert {"req torch==2.13.0", "req numpy==2.4.6", "req -r base.txt"} <= set(mine)
    assert [i.split(":")[0] for i in mine if "tool.whl" in i or "not-a-req" in i] == ["file tool.whl sha256"]
    store = Store((tmp_path / "store").as_uri())
    doc = {"blob": "e" * 64, "format": 1, "image": "i1", "machine": "x86_64", "roots": ["/opt/venv"], "depth": 0}
    store.write_ref("env", "b" * 64, {**doc, "inputs": setup_inputs(ci.env), "created": 100.0})
    c = choose(store, rule_keys(), ["/opt/venv"], setup_inputs(team.env), 8, 1)
    assert c is not None and c.key == "b" * 64 and c.shared == 3  # the base's two lines and tool.whl


def test_the_carried_paths_of_a_layer_merge_over_its_parent() -> None:
    from bootseer_cli.envsnap.format import ArchiveEntry
    from bootseer_cli.envsnap.stamp import merged_carried

    parent = {
        "blob": "p",
        "entries": [["/v/a", "d", 0, 0, ""], ["/v/a/x.py", "f", 3, 1, ""], ["/v/b.py", "f", 1, 1, ""]],
        "deletions": ["/v/image_file"],
    }
    layer = [ArchiveEntry("/v/b.py", "f", 0o644, 2, 5), ArchiveEntry("/v/c.py", "f", 0o644, 4, 5)]
    m = merged_carried(parent, layer, ["/v/a", "/v/other_image_file"])
    assert [r[0] for r in m.rows] == ["/v/b.py", "/v/c.py"] and m.rows[0][2] == 2
    assert m.deletions == ["/v/image_file", "/v/other_image_file"]


def test_a_parent_whose_ref_does_not_verify_is_no_parent(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    from bootseer_cli.trust import keygen

    keygen(str(tmp_path / "a.key"), str(tmp_path / "a.pub"), "team-a")
    job = Job(tmp_path, index)
    toml = tmp_path / "bootseer.toml"
    toml.write_text(
        toml.read_text().replace("[store]\n", '[store]\ndomain = "team-a"\n')
        + f'[trust]\nsigning_key = "{tmp_path / "a.key"}"\nverify_keys = ["{tmp_path / "a.pub"}"]\n'
    )
    job.reqs("bslayer==1.0", "six==1.17.0")
    job.exec("n1")
    (path,) = list(job.store.rglob("refs/env/*.json"))
    signed = json.loads(path.read_text())
    assert "sig" in json.dumps(signed), "premise: the ref is signed"
    job.reqs("bslayer==1.1", "six==1.17.0")
    job.fresh_node()
    # the parent's ref altered after signing (its inputs made to match better): it verifies no more
    text = path.read_text().replace('"req bslayer==1.0"', '"req bslayer==1.1"')
    assert text != path.read_text()
    path.write_text(text)
    r = job.exec("n2")
    assert "setup over" not in r.stderr and "published" in r.stderr, r.stderr
    assert r.stdout.strip() == "1.1"
    assert job.ref()["depth"] == 0
