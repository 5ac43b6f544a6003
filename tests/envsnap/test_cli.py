"""The verbs (baseline, snapshot, restore with exit 3 on a miss, env ls|show|rm) and the exec stage's
fallbacks, on the file:// and the loopback S3 store: a corrupted and a truncated blob, a stale stamp,
a failing setup, an unreachable store, and what must not be captured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store, blob_path
from tests.envsnap.conftest import run_cli, tree_state

pytestmark = pytest.mark.integration

SITE = "lib/site"


def make_base(root: Path) -> None:
    """The "image": one installed package."""
    if root.exists():
        shutil.rmtree(root)
    (root / SITE / "pkg_a").mkdir(parents=True)
    (root / SITE / "pkg_a" / "__init__.py").write_text("A = 1\n")
    (root / SITE / "pkg_a-1.0.dist-info").mkdir()
    (root / SITE / "pkg_a-1.0.dist-info" / "RECORD").write_text("pkg_a/__init__.py,,\n")


def project(tmp_path: Path, store_uri: str, setup: str = "sh setup.sh") -> Path:
    root = tmp_path / "env"
    make_base(root)
    s = root / SITE
    (tmp_path / "setup.sh").write_text(
        "set -e\n"
        f"rm -r {s}/pkg_a {s}/pkg_a-1.0.dist-info\n"
        f"mkdir -p {s}/pkg_b {s}/pkg_b-2.0.dist-info\n"
        f"echo 'B = 2' > {s}/pkg_b/__init__.py\n"
        f"echo 'pkg_b/__init__.py,,' > {s}/pkg_b-2.0.dist-info/RECORD\n"
        f"ln -s pkg_b/__init__.py {s}/b_link.py\n"
        f"echo run >> {tmp_path}/setup-runs\n"
    )
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store_uri}"\n[exec]\nagent = false\n[env]\nroots = ["{root}"]\nwait_s = 20\n'
        f"setup = {json.dumps([setup])}\n"
    )
    return root


def cli(tmp_path: Path, *args: str, node: str = "node1"):
    return run_cli(list(args), tmp_path, tmp_path / f"{node}-cache")


def capture_by_hand(tmp_path: Path) -> None:
    assert cli(tmp_path, "baseline").returncode == 0
    import subprocess

    subprocess.run(["sh", "setup.sh"], cwd=tmp_path, check=True)
    r = cli(tmp_path, "snapshot")
    assert r.returncode == 0 and "published" in r.stdout, r.stderr


def test_verbs_baseline_snapshot_restore_ls_show_rm(tmp_path: Path, store_uri: str) -> None:
    root = project(tmp_path, store_uri)
    base = tree_state(root)
    miss = cli(tmp_path, "restore")
    assert miss.returncode == 3 and "no snapshot" in miss.stderr, miss.stderr
    capture_by_hand(tmp_path)
    want = tree_state(root)

    ls = cli(tmp_path, "env", "ls", "--json")
    rows = json.loads(ls.stdout)
    assert len(rows) == 1 and rows[0]["files"] == 3 and rows[0]["deletions"] == 2 and rows[0]["format"] == 1
    key = rows[0]["env_key"]
    table = cli(tmp_path, "env", "ls").stdout
    assert key[:16] in table and "FILES" in table
    show = cli(tmp_path, "env", "show", key[:8], "--files").stdout
    assert f"{root}/{SITE}/pkg_b/__init__.py" in show and f"- {root}/{SITE}/pkg_a" in show
    assert f"{root}/{SITE}/b_link.py -> pkg_b/__init__.py" in show
    assert f"roots      {root}\n" in show and "[" not in show, show  # lists joined, not Python's repr
    lines = {ln.split()[0]: ln for ln in show.splitlines() if ln.strip()}
    assert lines["size"].endswith(" compressed") and lines["bytes"].endswith(" unpacked"), show
    assert " B " in lines["size"] or "kB" in lines["size"], show

    make_base(root)  # another node: same image, empty cache
    r = cli(tmp_path, "restore", node="node2")
    assert r.returncode == 0 and "restored" in r.stdout and " unpacked) from " in r.stdout, r.stderr
    assert tree_state(root) == want
    again = cli(tmp_path, "restore", node="node2")
    assert again.returncode == 0 and "already present" in again.stdout

    # a stale stamp: someone changed an installed package since; the stamp is not trusted
    rec = root / SITE / "pkg_b-2.0.dist-info" / "RECORD"
    rec.write_text("tampered\n")
    stale = cli(tmp_path, "restore", node="node2")
    assert stale.returncode == 0 and "stale stamp" in stale.stderr and "restored" in stale.stdout, stale.stderr
    assert tree_state(root) == want

    rm = cli(tmp_path, "env", "rm", key[:8])
    assert rm.returncode == 0
    assert "no env snapshots" in cli(tmp_path, "env", "ls").stdout
    make_base(root)
    gone = cli(tmp_path, "restore", node="node3")
    assert gone.returncode == 3
    assert tree_state(root) == base
    assert cli(tmp_path, "env", "show", "ffff").returncode == 1


def test_corrupt_and_truncated_blobs_are_caught(tmp_path: Path, store_uri: str) -> None:
    root = project(tmp_path, store_uri)
    capture_by_hand(tmp_path)
    want = tree_state(root)
    ref = json.loads(cli(tmp_path, "env", "ls", "--json").stdout)[0]
    store = Store(store_uri)
    good = store.get_blob_bytes(ref["blob"])
    flipped = bytearray(good)
    flipped[len(good) // 3] ^= 0x01
    outside_before = tree_state(tmp_path, skip=(str(root), *tuple(str(p) for p in tmp_path.glob("node*-cache"))))
    for n, bad in enumerate([bytes(flipped), good[: len(good) // 2]]):
        store.put_bytes(blob_path(ref["blob"]), bad)
        make_base(root)
        base = tree_state(root)
        r = cli(tmp_path, "restore", node=f"bad{n}")
        assert r.returncode == 1 and "does not match its digest" in r.stderr, r.stderr
        assert tree_state(root) == base, "a bad blob changed the env"
    skip = (str(root), str(tmp_path / "store"), *tuple(str(p) for p in tmp_path.glob("*-cache")))
    assert tree_state(tmp_path, skip=skip) == {k: v for k, v in outside_before.items() if not k.startswith(skip)}

    # exec with the bad blob: warns, runs the setup, publishes a good snapshot that the next node restores
    store.put_bytes(blob_path(ref["blob"]), bytes(flipped))
    make_base(root)
    r = cli(tmp_path, "exec", "--", "true", node="exec1")
    assert r.returncode == 0, r.stderr
    assert "could not restore" in r.stderr and "published" in r.stderr and " compressed)" in r.stderr, r.stderr
    assert r.stderr.count("could not restore") == 1, "the lease holder tried the blob that just failed again"
    assert (tmp_path / "setup-runs").read_text().count("run") == 2
    assert tree_state(root) == want
    make_base(root)
    r = cli(tmp_path, "exec", "--", "true", node="exec2")
    assert r.returncode == 0 and "restored" in r.stderr, r.stderr
    assert tree_state(root) == want


def test_a_corrupt_cached_blob_is_fetched_again(tmp_path: Path) -> None:
    root = project(tmp_path, (tmp_path / "store").as_uri())
    capture_by_hand(tmp_path)  # node1's cache now holds the blob
    want = tree_state(root)
    cached = next((tmp_path / "node1-cache").rglob("blobs/sha256/*/*"))
    data = bytearray(cached.read_bytes())
    data[100] ^= 0xFF
    cached.unlink()  # with a local store the cache entry is a hard link to the store's copy: corrupt the cache's
    cached.write_bytes(bytes(data))
    make_base(root)
    r = cli(tmp_path, "restore")
    assert r.returncode == 0 and "from store" in r.stdout, r.stdout + r.stderr
    assert tree_state(root) == want


def test_failing_setup_stops_the_start_with_its_status(tmp_path: Path) -> None:
    project(tmp_path, (tmp_path / "store").as_uri(), setup="echo doing; exit 7")
    r = cli(tmp_path, "exec", "--", "echo", "launched")
    assert r.returncode == 7, r.stderr
    assert "setup command failed (exit 7)" in r.stderr and "launched" not in r.stdout
    assert "doing" in r.stderr, "the setup's output goes to stderr"


def test_unreachable_store_runs_the_setup_locally(tmp_path: Path) -> None:
    from tests.support.s3server import free_port

    dead = f"s3://nowhere/x?endpoint_override=http://127.0.0.1:{free_port()}&scheme=http&connect_timeout=1&request_timeout=1"
    root = project(tmp_path, dead)
    r = cli(tmp_path, "exec", "--", "echo", "launched")
    assert r.returncode == 0 and r.stdout.strip() == "launched", r.stderr
    assert "store unreachable" in r.stderr and "running the setup locally" in r.stderr
    assert (root / SITE / "pkg_b" / "__init__.py").exists()
    again = cli(tmp_path, "exec", "--", "true")
    assert "env present" in again.stderr, "the locally built env is stamped"


def test_refuses_what_another_node_could_not_use(tmp_path: Path) -> None:
    root = project(tmp_path, (tmp_path / "store").as_uri())
    assert cli(tmp_path, "baseline").returncode == 0
    (root / SITE / "__editable__.mine.pth").write_text(f"{tmp_path / 'src'}\n")
    r = cli(tmp_path, "snapshot")
    assert r.returncode == 1 and "editable" in r.stderr and str(tmp_path / "src") in r.stderr, r.stderr
    (root / SITE / "__editable__.mine.pth").unlink()
    with open(root / SITE / "being_written.bin", "wb") as f:
        f.write(b"half")
        f.flush()
        r = cli(tmp_path, "snapshot")
    assert r.returncode == 1 and "open for writing" in r.stderr and "being_written.bin" in r.stderr, r.stderr
    assert json.loads(cli(tmp_path, "env", "ls", "--json").stdout) == [], "nothing was published"
    missing = run_cli(["snapshot"], tmp_path, tmp_path / "fresh-cache")
    assert missing.returncode == 1 and "bootseer baseline" in missing.stderr


def test_changes_outside_the_roots_are_listed(tmp_path: Path) -> None:
    """A setup that writes outside the roots still works, but the user is told what the snapshot lacks."""
    import os

    outside = Path(f"/opt/bootseer-envsnap-test-{os.getpid()}-{tmp_path.name}")
    try:
        setup = f"sh setup.sh && mkdir -p {outside} && touch {outside}/x"
        project(tmp_path, (tmp_path / "store").as_uri(), setup=setup)
        r = cli(tmp_path, "exec", "--", "true")
        assert r.returncode == 0, r.stderr
        assert "outside [env] roots" in r.stderr and f"{outside}/x" in r.stderr, r.stderr
        assert "published" in r.stderr
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_switching_envs_removes_the_old_envs_files(tmp_path: Path) -> None:
    """A node carrying env A restores env B: A's files B does not have go (undoably), B's come; what the
    user added or changed stays (with the directory that holds it)."""
    root = project(tmp_path, (tmp_path / "store").as_uri())  # env A: setup.sh (pkg_a → pkg_b)
    s = root / SITE
    (tmp_path / "setupB.sh").write_text(
        f"set -e\nrm -r {s}/pkg_a {s}/pkg_a-1.0.dist-info\nmkdir -p {s}/pkg_c\necho 'C = 3' > {s}/pkg_c/__init__.py\n"
    )
    (tmp_path / "setupC.sh").write_text(f"set -e\nmkdir -p {s}/pkg_d\necho 'D = 4' > {s}/pkg_d/__init__.py\n")
    cfg_a = (tmp_path / "bootseer.toml").read_text()

    def use(script: str) -> None:
        (tmp_path / "bootseer.toml").write_text(cfg_a.replace('"sh setup.sh"', f'"sh {script}"'))

    for script in ("setupB.sh", "setupC.sh"):  # build B and C on fresh nodes
        use(script)
        make_base(root)
        assert "published" in cli(tmp_path, "exec", "--", "true", node=f"build-{script}").stderr
    use("setupB.sh")
    make_base(root)
    cli(tmp_path, "exec", "--", "true", node="b")
    want_b = tree_state(root)

    use("setup.sh")  # the node carries A …
    make_base(root)
    r = cli(tmp_path, "exec", "--", "true", node="n")
    assert "published" in r.stderr or "restored" in r.stderr, r.stderr
    assert (s / "pkg_b").exists()
    (s / "mine.py").write_text("M = 1\n")  # the user's own file, and one of A's the user edited
    (s / "pkg_b" / "notes.txt").write_text("mine\n")
    (s / "pkg_b" / "__init__.py").write_text("B = 2  # edited\n")
    use("setupB.sh")  # … and restarts with B
    r = cli(tmp_path, "exec", "--", "true", node="n")
    assert r.returncode == 0 and "restored" in r.stderr, r.stderr
    assert "switching envs: removing 3 path(s)" in r.stderr and "2 path(s) changed since" in r.stderr, r.stderr
    mine = {str(s / "mine.py"), str(s / "pkg_b"), str(s / "pkg_b" / "notes.txt"), str(s / "pkg_b" / "__init__.py")}
    assert {k: v for k, v in tree_state(root).items() if k not in mine} == want_b, "env A's files were left behind"
    assert (s / "mine.py").exists() and (s / "pkg_b" / "notes.txt").exists(), "the user's files were removed"
    assert (s / "pkg_b" / "__init__.py").read_text() == "B = 2  # edited\n"
    assert not (s / "b_link.py").exists() and not (s / "pkg_b-2.0.dist-info").exists()

    use("setupC.sh")  # B deleted pkg_a of the image, which C keeps: no restore can bring it back
    r = cli(tmp_path, "exec", "--", "true", node="n")
    assert r.returncode == 0 and "cannot bring back" in r.stderr, r.stderr
    assert not (s / "pkg_c").exists() and (s / "pkg_d" / "__init__.py").exists(), "B stripped, C set up"
