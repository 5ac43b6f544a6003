"""Issue 13: the env stage never leaves a job wrong. The tree is exactly what the setup would have
made, or the setup runs: on every failure that is not the user's own (any exception a crafted blob
provokes, too little space, a blob bigger than its metadata admits), on an unreadable `-r` file (the
setup runs and fails as without bootseer), across concurrent starts on one node, across a restore
killed part way, and when switching envs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bootseer_cli.envsnap import apply, extract, format, plan, reader
from bootseer_cli.envsnap import undo as undo_mod
from bootseer_cli.errors import IntegrityError
from bootseer_cli.store.core import Store, blob_path
from tests.envsnap.conftest import killed_restore, run_cli, tree_state
from tests.envsnap.test_cli import SITE, cli, make_base, project
from tests.envsnap.test_safety import craft, reg, rel
from tests.support import pkgindex

pytestmark = pytest.mark.integration

OURS = (".bootseer-env.journal", ".bootseer-undo-")


def env_key(tmp_path: Path) -> str:
    r = cli(tmp_path, "keys", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["env"]["digest"]


def blob_bytes(tar: bytes, meta_json: bytes) -> bytes:
    """A blob in the snapshot format: one frame of `tar`, then a trailer holding `meta_json` verbatim."""
    import struct

    import zstandard

    frame = zstandard.ZstdCompressor().compress(tar)
    z = zstandard.ZstdCompressor().compress(meta_json)
    payload = z + struct.pack("<Q", len(z)) + format.TRAILER_MAGIC
    return frame + struct.pack("<II", format.SKIPPABLE_MAGIC, len(payload)) + payload


def publish_crafted(store_uri: str, key: str, blob: bytes, ref: object = None) -> None:
    """Put `blob` in the store under its digest and name it from the ref of `key`."""
    store = Store(store_uri)
    digest = hashlib.sha256(blob).hexdigest()
    store.put_bytes(blob_path(digest), blob)
    doc = ref if ref is not None else {"blob": digest, "size": len(blob), "files": 1, "format": 1}
    store.put_bytes(store.ref_path("env", key), json.dumps(doc).encode())


def non_octal_tar(path: str) -> bytes:
    """A tar member whose size field is not octal (checksum recomputed, so only the parse can fail)."""
    ti = tarfile.TarInfo(path.lstrip("/"))
    ti.size = 7
    hdr = bytearray(ti.tobuf(tarfile.GNU_FORMAT))
    hdr[124:136] = b"zzzzzzzzzzz\0"
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr[:512])
    return bytes(hdr[:512]) + b"payload".ljust(512, b"\0") + b"\0" * 1024


def crafted_cases(root: Path) -> dict[str, tuple[bytes, object]]:
    f = f"{root}/{SITE}/evil.py"
    good_meta = {"format": 1, "roots": [str(root)], "deletions": [], "entries": [[f, "f", 420, 7, 0, ""]]}
    tar = non_octal_tar(f)
    import zstandard

    frame_len = len(zstandard.ZstdCompressor().compress(tar))
    nested = b"[" * 200_000 + b"]" * 200_000
    return {
        "metadata-list": (blob_bytes(tar, b"[]"), None),
        "metadata-nested": (blob_bytes(tar, nested), None),
        "size-not-octal": (
            blob_bytes(tar, json.dumps({**good_meta, "chunks": [[0, frame_len, len(tar)]]}).encode()),
            None,
        ),
        "roots-not-paths": (
            blob_bytes(tar, json.dumps({**good_meta, "roots": [[1]], "chunks": [[0, frame_len, len(tar)]]}).encode()),
            None,
        ),
        "ref-list": (blob_bytes(tar, b"[]"), []),
    }


# ---- 1: an error computing the key runs the setup as without bootseer ----------------------------


def test_unreadable_requirements_file_fails_the_start_as_without_bootseer(tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.mkdir()
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{(tmp_path / "store").as_uri()}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{env}"]\n'
        f'setup = ["touch SETUP_RAN", "{sys.executable} -m pip install -r missing-reqs.txt"]\n'
    )
    r = cli(tmp_path, "exec", "--", "touch", str(tmp_path / "LAUNCHED"))
    assert (tmp_path / "SETUP_RAN").exists(), r.stderr
    assert not (tmp_path / "LAUNCHED").exists(), "the launcher ran although the setup could not"
    assert r.returncode != 0, r.stderr
    assert "missing-reqs.txt" in r.stderr and "setup command failed" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# ---- 2: any exception from a crafted snapshot: warn, set up, go on; restore prints one line ----------


@pytest.mark.parametrize("case", ["metadata-list", "metadata-nested", "size-not-octal", "roots-not-paths", "ref-list"])
def test_crafted_snapshots_fall_back_to_the_setup(tmp_path: Path, case: str) -> None:
    store_uri = (tmp_path / "store").as_uri()
    root = project(tmp_path, store_uri)
    key = env_key(tmp_path)
    blob, ref = crafted_cases(root)[case]
    publish_crafted(store_uri, key, blob, ref)

    base = tree_state(root)
    r = cli(tmp_path, "restore", node="r")
    assert r.returncode not in (0, 3), r.stderr
    said = [line for line in r.stderr.strip().splitlines() if "running unsigned" not in line]  # the notice (issue 45)
    assert "Traceback" not in r.stderr and len(said) == 1, r.stderr
    assert tree_state(root) == base, "a refused snapshot changed the tree"

    r = cli(tmp_path, "exec", "--", "echo", "launched", node="x")
    assert r.returncode == 0 and r.stdout.strip() == "launched", r.stderr
    assert "continuing without it" not in r.stderr, r.stderr
    assert (tmp_path / "setup-runs").read_text().count("run") == 1, f"the setup did not run: {r.stderr}"
    assert (root / SITE / "pkg_b" / "__init__.py").exists() and not (root / SITE / "evil.py").exists()


# ---- 3: the roots are part of the env key -------------------------------------------------------------


def test_the_env_key_knows_its_roots(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")

    def keys(root: str) -> dict:
        (tmp_path / "bootseer.toml").write_text(f'[env]\nroots = ["{root}"]\nsetup = ["true"]\n')
        r = cli(tmp_path, "keys", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["env"]

    venv, dotvenv, real, alias = keys("/opt/venv"), keys(".venv"), keys(str(tmp_path / "real")), keys("alias")
    assert venv["digest"] != dotvenv["digest"], "two trees with the same setup share one key"
    assert venv["doc"]["roots"] == ["/opt/venv"]
    assert dotvenv["doc"]["roots"] == [str(tmp_path / ".venv")], "relative roots are resolved"
    assert real["digest"] == alias["digest"] and alias["doc"]["roots"] == [str(tmp_path / "real")]
    text = cli(tmp_path, "keys").stdout
    assert str(tmp_path / "real") in text, "`bootseer keys` shows the roots"


# ---- 7: bounds ----------------------------------------------------------------------------------------


def test_a_member_writes_no_more_than_its_listed_size(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    p = f"{root}/big.bin"
    meta = craft(tmp_path / "blob", [reg(rel(Path(p)), b"\0" * 200_000)], [[p, "f", 0o644, 10, 0, ""]], [str(root)])
    with pytest.raises(IntegrityError):
        extract.extract(tmp_path / "blob", meta, [str(root)])
    assert not os.path.exists(p)
    assert os.listdir(root) == [], "nothing left behind"


def test_frames_cannot_expand_beyond_the_listed_entries(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    p = f"{root}/a.txt"
    members = [reg(rel(Path(p)), b"1234567"), reg(rel(Path(f"{root}/b.txt")), b"\0" * 3_000_000)]
    meta = craft(tmp_path / "blob", members, [[p, "f", 0o644, 7, 0, ""]], [str(root)])  # b.txt is not listed
    with pytest.raises(IntegrityError, match="more than its listed entries"):
        extract.extract(tmp_path / "blob", meta, [str(root)])
    assert os.listdir(root) == []


def test_metadata_is_capped_in_proportion_to_its_entries(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    meta = {"format": 1, "roots": ["/x"], "deletions": [], "entries": [], "chunks": [], "pad": "p" * (6 << 20)}
    blob.write_bytes(blob_bytes(b"\0" * 1024, json.dumps(meta).encode()))
    with pytest.raises(IntegrityError, match=r"larger than|too large"):
        reader.read_meta(blob)
    with pytest.raises(IntegrityError, match="larger than"):
        reader.read_meta(blob, entries_hint=10)  # refused before it is parsed
    meta["pad"] = "p" * 1000
    blob.write_bytes(blob_bytes(b"\0" * 1024, json.dumps(meta).encode()))
    assert reader.read_meta(blob).roots == ("/x",)
    bad = {**meta, "entries": [["/x/a", "f", 420, 7, 0, ["not", "a", "digest"]]]}
    blob.write_bytes(blob_bytes(b"\0" * 1024, json.dumps(bad).encode()))
    with pytest.raises(format.UnsafeArchive, match="malformed"):
        reader.read_meta(blob)


def test_too_little_space_warns_and_runs_the_setup(tmp_path: Path) -> None:
    """The snapshot needs 20 MB, the tree is on an 8 MiB tmpfs: a clear warning, nothing restored, the setup."""
    env = tmp_path / "env"
    env.mkdir()
    marker = tmp_path / "setup-runs"
    setup = (
        f"echo run >> {marker}; mkdir -p {env}/lib && echo small > {env}/lib/small.txt && "
        f"(head -c 20000000 /dev/urandom > {env}/lib/big.bin || rm -f {env}/lib/big.bin)"
    )
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{(tmp_path / "store").as_uri()}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{env}"]\nsetup = [{json.dumps(setup)}]\n'
    )
    built = cli(tmp_path, "exec", "--", "true", node="builder")
    assert built.returncode == 0 and "published" in built.stderr, built.stderr
    for p in list(env.rglob("*"))[::-1]:
        p.unlink() if not p.is_dir() else p.rmdir()
    (env / ".bootseer-env.json").unlink(missing_ok=True)
    script = 'mount -t tmpfs -o size=8m tmpfs "$1" && shift && exec "$@"'
    full = pkgindex.clean_env({"XDG_CACHE_HOME": str(tmp_path / "small-cache")})
    for k in [k for k in full if k.startswith("BOOTSEER_")]:
        del full[k]
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(env)]
    listing = f"ls -a {env}/lib > {tmp_path}/listing"
    r = subprocess.run(
        [*argv, sys.executable, "-m", "bootseer_cli", "exec", "--", "sh", "-c", listing],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"needs 2\d\.\d MB, has 8\.\d MB", r.stderr), r.stderr
    assert marker.read_text().count("run") == 2, r.stderr
    assert "small.txt" in (tmp_path / "listing").read_text()


# ---- 8: capture refuses what it cannot read ------------------------------------------------------


def test_an_unreadable_file_fails_the_capture_and_nothing_is_published(tmp_path: Path) -> None:
    root = project(tmp_path, (tmp_path / "store").as_uri(), setup="sh setup.sh && sh more.sh")
    secret = root / SITE / "pkg_b" / "secret.bin"
    (tmp_path / "more.sh").write_text(f"echo hidden > {secret} && chmod 000 {secret}\n")
    # root without the capabilities that let it read any file: as an ordinary user would run
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
    full = pkgindex.clean_env({"XDG_CACHE_HOME": str(tmp_path / "node-cache")})
    for k in [k for k in full if k.startswith("BOOTSEER_")]:
        del full[k]
    r = subprocess.run(
        [*drop, sys.executable, "-m", "bootseer_cli", "exec", "--", "echo", "launched"],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "launched", r.stderr
    assert "not captured" in r.stderr and ", published" not in r.stderr, r.stderr
    assert str(secret) in r.stderr and "cannot snapshot" in r.stderr, r.stderr
    assert json.loads(cli(tmp_path, "env", "ls", "--json").stdout) == [], "a snapshot without the file was published"


# ---- 6: one bootseer per tree on a node -------------------------------------------------------------------


def many_files_project(tmp_path: Path, store_uri: str) -> Path:
    """A tree whose setup replaces and deletes image files and writes many small files and three large
    ones (several frames, so the restore uses several workers)."""
    root = project(tmp_path, store_uri, setup="sh setup.sh && sh many.sh")
    s = root / SITE
    (tmp_path / "many.sh").write_text(
        "set -e\n"
        f"for d in $(seq 1 30); do mkdir -p {s}/many_$d/sub; for f in $(seq 1 10); do "
        f"echo $d-$f > {s}/many_$d/sub/f$f.py; done; done\n"
        f"for b in 1 2 3; do head -c 3000000 /dev/urandom > {s}/blob$b.bin; done\n"
    )
    return root


def capture_many(tmp_path: Path) -> None:
    """baseline, both setup scripts by hand, snapshot (the builder node)."""
    assert cli(tmp_path, "baseline").returncode == 0
    for script in ("setup.sh", "many.sh"):
        subprocess.run(["sh", script], cwd=tmp_path, check=True)
    r = cli(tmp_path, "snapshot")
    assert r.returncode == 0 and "published" in r.stdout, r.stderr


def test_concurrent_restores_and_starts_on_one_tree(tmp_path: Path) -> None:
    root = many_files_project(tmp_path, (tmp_path / "store").as_uri())
    capture_many(tmp_path)
    want = tree_state(root)
    base_env = pkgindex.clean_env()

    def start(args: list[str], node: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in base_env.items() if not k.startswith("BOOTSEER_")}
        env.update({"XDG_CACHE_HOME": str(tmp_path / f"{node}-cache"), "BOOTSEER_EXEC_AGENT": "0"})
        return subprocess.Popen(
            [sys.executable, "-m", "bootseer_cli", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    make_base(root)
    procs = [start(["restore"], "node"), start(["restore"], "node")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = " ".join(o for o, _ in outs)
    assert said.count("restored env") == 1 and said.count("already present") == 1, outs
    assert tree_state(root) == want

    make_base(root)
    check = f"sleep 1.5; cat {root}/{SITE}/many_30/sub/f10.py"
    first = start(["exec", "--", "sh", "-c", check], "node")
    time.sleep(0.25)
    second = start(["exec", "--", "sh", "-c", check], "node")
    (o1, e1), (o2, e2) = first.communicate(timeout=120), second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, e1 + e2
    assert o1.strip() == "30-10" and o2.strip() == "30-10", e1 + e2
    assert (e1 + e2).count("restored") == 1 and (e1 + e2).count("env present") == 1, e1 + e2
    assert tree_state(root) == want


# ---- 4: directories of an env go when switching away ------------------------------------------------------


def test_switching_away_removes_the_directories_the_env_created(tmp_path: Path) -> None:
    from tests.support.s3server import free_port

    store_uri = (tmp_path / "store").as_uri()
    root = project(tmp_path, store_uri)  # env B: setup.sh, built and published on another node
    assert "published" in cli(tmp_path, "exec", "--", "true", node="builder").stderr
    make_base(root)
    cli(tmp_path, "exec", "--", "true", node="other")
    want_b = tree_state(root)
    cfg_b = (tmp_path / "bootseer.toml").read_text()

    s = root / SITE
    (tmp_path / "setupA.sh").write_text(
        f"set -e\nmkdir -p {s}/six-1.16.0.dist-info {s}/sixpkg/__pycache__\n"
        f"echo six > {s}/six-1.16.0.dist-info/METADATA\necho 'six.py,,' > {s}/six-1.16.0.dist-info/RECORD\n"
        f"echo X=1 > {s}/sixpkg/__init__.py\necho pyc > {s}/sixpkg/__pycache__/__init__.cpython.pyc\n"
    )
    dead = f"s3://nowhere/x?endpoint_override=http://127.0.0.1:{free_port()}&scheme=http&connect_timeout=1&request_timeout=1"
    (tmp_path / "bootseer.toml").write_text(cfg_b.replace("sh setup.sh", "sh setupA.sh").replace(store_uri, dead))
    make_base(root)
    r = cli(tmp_path, "exec", "--", "true", node="n")  # env A, set up locally (no store)
    assert r.returncode == 0 and "running the setup locally" in r.stderr, r.stderr
    assert (s / "six-1.16.0.dist-info").is_dir()

    (tmp_path / "bootseer.toml").write_text(cfg_b)  # … and the node restarts with env B
    r = cli(tmp_path, "exec", "--", "true", node="n")
    assert r.returncode == 0 and "restored" in r.stderr, r.stderr
    assert not (s / "six-1.16.0.dist-info").exists() and not (s / "sixpkg").exists(), "env A's directories stayed"
    assert tree_state(root) == want_b


# ---- 5: a restore killed part way is put back by the next start ---------------------------------------------


@pytest.mark.parametrize("point", ["journal", "member:5", "committed"])
def test_a_restore_killed_part_way_is_recovered(tmp_path: Path, point: str) -> None:
    root = many_files_project(tmp_path, (tmp_path / "store").as_uri())
    (root / SITE / "pkg_a" / "keep.txt").write_text("image file the setup deletes\n")
    capture_many(tmp_path)
    want = tree_state(root)
    assert len(want) > 300

    make_base(root)
    (root / SITE / "pkg_a" / "keep.txt").write_text("image file the setup deletes\n")
    killed_restore(tmp_path, tmp_path / "node-cache", point)
    assert (root / ".bootseer-env.journal").exists(), "the restore wrote its journal before its first change"
    assert not (root / ".bootseer-env.json").exists()
    if point != "journal":  # killed after the moves: originals aside, (some) new files in place
        assert any(n.startswith(".bootseer-undo-") for n in os.listdir(root))

    r = run_cli(["exec", "--", "true"], tmp_path, tmp_path / "node-cache")
    assert r.returncode == 0, r.stderr
    assert "restored" in r.stderr, r.stderr
    assert tree_state(root) == want, "the tree differs from what the setup produces"
    left = [n for n in os.listdir(root) if n.startswith(OURS)]
    assert left == [], f"left behind: {left}"


def test_a_first_restore_killed_after_its_last_write_is_restored_again(tmp_path: Path) -> None:
    """A restore that moved nothing aside writes no commit: killed between its last write and the
    journal's removal, its journal is the first, uncommitted one, and the next start removes the tree
    it made and restores it again, whole (before: a committed journal, an fsync on the critical path).
    The journal names the new directories, not every path below them (before: 221 paths here)."""
    root = project(tmp_path, (tmp_path / "store").as_uri(), setup="sh many.sh")
    s = root / SITE
    (tmp_path / "many.sh").write_text(
        f"set -e\nfor d in $(seq 1 20); do mkdir -p {s}/new_$d; for f in $(seq 1 10); do "
        f"echo $d-$f > {s}/new_$d/f$f.py; done; done\nhead -c 3000000 /dev/urandom > {s}/new.bin\n"
    )
    assert cli(tmp_path, "baseline").returncode == 0
    subprocess.run(["sh", "many.sh"], cwd=tmp_path, check=True)
    r = cli(tmp_path, "snapshot")
    assert r.returncode == 0 and "published" in r.stdout, r.stderr
    want = tree_state(root)

    make_base(root)  # the image alone: the env only adds, so the restore moves nothing aside
    killed_restore(tmp_path, tmp_path / "node-cache", "committed")
    doc = json.loads((root / ".bootseer-env.journal").read_text())
    assert doc["committed"] is False and doc["new"], "a restore that moved nothing aside wrote a commit"
    # the journal lists the new paths whose parent is not new: recovery removes a new directory whole
    assert sorted(doc["new"]) == sorted([str(s / "new.bin"), *(str(s / f"new_{d}") for d in range(1, 21))])
    assert (s / "new_20" / "f10.py").exists(), "killed before its last write"

    r = run_cli(["exec", "--", "true"], tmp_path, tmp_path / "node-cache")
    assert r.returncode == 0, r.stderr
    assert "interrupted restore was undone" in r.stderr and "restored" in r.stderr, r.stderr
    assert tree_state(root) == want, "the tree differs from what the setup produces"
    assert [n for n in os.listdir(root) if n.startswith(OURS)] == []


def test_a_dead_workers_files_are_removed(tmp_path: Path) -> None:
    """In-process rollback after a worker died: the paths it created go too (the journal's plan)."""
    root = tmp_path / "env"
    (root / "lib").mkdir(parents=True)
    before = tree_state(root)
    members = [reg(rel(root / "lib" / f"f{i}.py"), b"x" * 100) for i in range(5)]
    entries = [[str(root / "lib" / f"f{i}.py"), "f", 0o644, 100, 0, ""] for i in range(5)]
    entries.append([str(root / "lib" / "missing.py"), "f", 0o644, 1, 0, ""])  # listed, never in the stream
    meta = craft(tmp_path / "blob", members, entries, [str(root)])
    st = apply.State(plan.plan(meta, [str(root)]))
    undo = undo_mod.Undo([str(root)])
    undo_mod.plan_changes(st, undo)
    # a "worker" wrote files, then died before reporting them: st.created does not know them
    for i in range(3):
        (root / "lib" / f"f{i}.py").write_bytes(b"half")
    note = undo_mod.rollback(st, undo)
    assert "put back" in note
    assert tree_state(root) == before
