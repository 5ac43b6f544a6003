"""A layer holds what the setup changed, not what it rewrote with the same bytes (issue 46 finding 7).

`pip install --target T --upgrade -r reqs.txt` reinstalls every requirement into T: after a one-line
bump every file has a new inode and mtime, and the layer used to be the whole tree. Real pip, real
wheels (six and packaging, and two test projects built here) from a loopback index."""

from __future__ import annotations

import json
import marshal
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.envsnap.conftest import run_cli
from tests.envsnap.test_layers import write_wheel
from tests.support import pkgindex

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pkgindex.PackageIndex]:
    root = tmp_path_factory.mktemp("rewrites-index")
    pkgindex.wheelhouse(root, ["six==1.17.0", "packaging==26.3"])
    write_wheel(root, "bsstill", "1.0", {f"bsstill/m{i}.py": f"N = {i}\n" * 50 for i in range(12)})
    for v in ("1.0", "1.1"):
        write_wheel(root, "bsbump", v, {"bsbump/__init__.py": f"VERSION = {v!r}\n", "bsbump/core.py": "X = 1\n"})
    with pkgindex.PackageIndex(root) as idx:
        yield idx


def _content(root: Path) -> dict[str, tuple]:
    """Every path's kind, mode and bytes; a pyc's header and code objects, without the source mtime
    it records (checked apart: `_stale_pycs`)."""
    out: dict[str, tuple] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            if name.startswith(".bootseer-"):
                continue
            st = os.lstat(p)
            if os.path.isdir(p):
                out[p] = ("d", st.st_mode & 0o755)
                continue
            data = Path(p).read_bytes()
            if p.endswith(".pyc"):  # the code (marshal's back-reference flags and pip's temp path aside)
                out[p] = ("pyc", st.st_mode & 0o755, data[:8], data[12:16], marshal.loads(data[16:]))
                continue
            out[p] = ("f", st.st_mode & 0o755, data)
    return out


def _stale_pycs(root: Path) -> list[str]:
    """Bytecode Python would not use: its recorded source mtime is not its source's."""
    bad = []
    for pyc in root.rglob("__pycache__/*.pyc"):
        src = pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")
        recorded = int.from_bytes(pyc.read_bytes()[8:12], "little")
        if src.exists() and recorded != int(src.stat().st_mtime) & 0xFFFFFFFF:
            bad.append(str(pyc))
    return bad


def test_a_target_upgrade_publishes_only_the_bumped_package(tmp_path: Path, index: pkgindex.PackageIndex) -> None:
    target, store = tmp_path / "target", tmp_path / "store"
    target.mkdir()
    install = f"{sys.executable} -m pip install --target {target} --upgrade -r reqs.txt"
    (tmp_path / "bootseer.toml").write_text(
        f'[store]\nuri = "{store.as_uri()}"\n[exec]\nagent = false\n'
        f'[env]\nroots = ["{target}"]\nwait_s = 30\nsetup = ["{install}"]\n'
    )
    env = index.pip_env()

    def start(node: str) -> str:
        r = run_cli(["exec", "--", "true"], tmp_path, tmp_path / f"{node}-cache", env)
        assert r.returncode == 0, r.stderr
        return r.stderr

    def ref() -> dict:
        p = max(store.rglob("refs/env/*.json"), key=lambda q: q.stat().st_mtime_ns)
        doc = json.loads(p.read_text())
        return {"env_key": p.stem, **doc.get("doc", doc)}

    (tmp_path / "reqs.txt").write_text("six==1.17.0\npackaging==26.3\nbsstill==1.0\nbsbump==1.0\n")
    assert "published" in start("n1")
    parent = ref()
    (tmp_path / "reqs.txt").write_text("six==1.17.0\npackaging==26.3\nbsstill==1.0\nbsbump==1.1\n")
    err = start("n1")
    assert "(layer 1)" in err, err
    layer = ref()
    shown = run_cli(["env", "show", layer["env_key"][:16], "--files", "--json"], tmp_path, tmp_path / "n1-cache")
    listed = json.loads(shown.stdout)
    files = [e[0] for e in listed["entries"] if e[1] == "f"]
    print(f"parent {parent['files']} files {parent['size']} B; layer {layer['files']} files {layer['size']} B")
    assert files and all("/bsbump" in p for p in files), files
    assert len(files) <= 8 and parent["files"] >= 10 * len(files), (len(files), parent["files"])
    assert (target / "bsbump-1.0.dist-info").is_dir(), "pip --target leaves the old version's metadata"
    built = _content(target)
    assert not _stale_pycs(target)
    assert "env present" in start("n1"), "the builder's stamp does not hold its own tree"

    for p in list(target.iterdir()):  # a fresh node: the same (empty) target, an empty cache
        os.system(f"rm -rf '{p}'")
    err = start("n2")
    assert "restored" in err and "(layer 1" in err, err
    assert _content(target) == built, "the restored chain differs from the builder's tree"
    assert not _stale_pycs(target), "restored bytecode that Python would recompile"
