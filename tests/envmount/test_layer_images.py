"""Issue 48 item 3: a layer is an image stacked over its parent's, not a second copy of the whole tree.

Mount mode published every snapshot as an image of the whole tree, so a one-package bump cost a full
image (a CPU torch venv: 260 MB) where extract mode publishes a small layer. A layer over a parent
that has an image now gets an image of its own changes, with a whiteout (a character device 0/0) for
each path it deleted, and the ref lists the images below it; a fresh node mounts them as the overlay's
lower directories, top first. What the job sees is what an extraction of the same chain gives.

Real pip, `mksquashfs`, the kernel's squashfs on loop devices and overlayfs (root), and squashfuse and
fuse-overlayfs (`mount` off PATH, the plain user's way).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from bootseer_cli.envmount.image import FIELD, FORMAT, LAYER_FORMAT, image_stack, whiteouts
from bootseer_cli.store.core import Store

from .conftest import agents_done, bootseer, config, mounted_under, node

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a kernel loop mount)"),
]

TREE = """
import hashlib, json, os, sys
root = sys.argv[1]
out = {}
for top, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in dirs + files:
        p = os.path.join(top, name)
        rel = os.path.relpath(p, root)
        if rel.startswith(".bootseer-env"):
            continue
        if os.path.islink(p):
            out[rel] = "link " + os.readlink(p)
        elif os.path.isdir(p):
            out[rel] = "dir %o" % (os.lstat(p).st_mode & 0o7777)
        else:
            with open(p, "rb") as f:
                out[rel] = "%o %s" % (os.lstat(p).st_mode & 0o7777, hashlib.sha256(f.read()).hexdigest())
with open("/proc/self/mountinfo") as f:
    mounted = any(line.split()[4] == root for line in f)
print(json.dumps({"tree": out, "mounted": mounted}))
"""


def _tree_job(base: Path, root: Path) -> list[str]:
    script = base / "tree.py"
    script.write_text(TREE)
    return [sys.executable, str(script), str(root)]


def _refs(base: Path) -> list[dict]:
    store = Store((base / "store").as_uri())
    return [store.read_ref("env", p.name[: -len(".json")]) for p in (base / "store").rglob("refs/env/*.json")]


def _with_layer(cfg: Path, root: Path) -> None:
    """The setup as before, then a bump: a file added, one rewritten, one file and one directory deleted."""
    setup = cfg.read_text().split("setup = [")[1].rstrip().rstrip("]")
    more = [
        f"echo more > {root}/more.txt",
        f"echo '# bumped' >> {root}/site/idna/__init__.py",
        f"rm {root}/site/six.py",
        f"rm -r {root}/site/idna/__pycache__ {root}/site/six-1.17.0.dist-info",
    ]
    bumped = f"setup = [{setup}, {', '.join(map(json.dumps, more))}]"
    cfg.write_text(cfg.read_text().replace(f"setup = [{setup}]", bumped))


def _run(
    base: Path, cfg: Path, root: Path, name: str, path: str | None = None, mode: str = "mount"
) -> tuple[dict, str]:
    nd = {**node(base, name), "BOOTSEER_ENV_MODE": mode}
    r = bootseer(["exec", "--config", str(cfg), "--", *_tree_job(base, root)], nd, path=path)
    assert r.returncode == 0, r.stderr
    agents_done(nd)
    assert mounted_under(str(base)) == []
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.mark.parametrize("way", ["kernel", "fuse"])
def test_a_layer_is_an_image_over_its_parents_and_mounts_as_the_chain_extracts(
    base: Path, wheels: Path, way: str
) -> None:
    root = base / "env"
    cfg = config(base, root, wheels)
    builder = node(base, "builder")
    r = bootseer(["exec", "--config", str(cfg), "--", "true"], builder, agent=False)
    assert r.returncode == 0, r.stderr
    [parent] = _refs(base)
    assert parent[FIELD]["format"] == FORMAT

    _with_layer(cfg, root)
    r = bootseer(["exec", "--config", str(cfg), "--", *_tree_job(base, root)], builder, agent=False)
    assert r.returncode == 0, r.stderr
    built = json.loads(r.stdout.strip().splitlines()[-1])["tree"]
    [layer] = [ref for ref in _refs(base) if ref.get("depth") == 1]
    image = layer[FIELD]
    assert image["format"] == LAYER_FORMAT and image["below"] == [parent[FIELD]], image
    assert image["size"] < parent[FIELD]["size"] / 2, (image["size"], parent[FIELD]["size"])  # its changes only
    assert image_stack(layer) == [(image["digest"], image["size"]), (parent[FIELD]["digest"], parent[FIELD]["size"])]
    shutil.rmtree(root)

    extracted, _ = _run(base, cfg, root, "extract-node", mode="extract")  # the chain, extracted
    assert not extracted["mounted"]
    shutil.rmtree(root)
    path = None
    if way == "fuse":  # `mount` off PATH: squashfuse and fuse-overlayfs, as a plain user mounts
        path = str(base / "fuse-bin")
        os.makedirs(path, exist_ok=True)
        for tool in ("squashfuse_ll", "squashfuse", "fuse-overlayfs", "fusermount3", "fusermount", "sh", "env"):
            if shutil.which(tool) and not os.path.lexists(os.path.join(path, tool)):
                os.symlink(shutil.which(tool), os.path.join(path, tool))  # type: ignore[arg-type]
    mounted, err = _run(base, cfg, root, f"mount-node-{way}", path=path)

    assert mounted["mounted"] and "2 images" in err, err
    assert ("fuse squashfs" in err) == (way == "fuse"), err
    assert mounted["tree"] == extracted["tree"] == built, {
        k: (mounted["tree"].get(k), extracted["tree"].get(k)) for k in set(mounted["tree"]) ^ set(extracted["tree"])
    }
    assert "six.py" not in mounted["tree"] and "more.txt" in mounted["tree"]
    assert not any(k.startswith("site/six-1.17.0.dist-info") for k in mounted["tree"])


def test_whiteouts_go_on_the_topmost_deleted_paths() -> None:
    deleted = ["/e/a/x", "/e/a", "/e/b.py", "/e/ab/y", "/e/a/z/w", "/e/a-b", "/e/a/y"]  # '-' sorts before '/'
    assert whiteouts(deleted) == ["/e/a", "/e/a-b", "/e/ab/y", "/e/b.py"]


def test_resign_checks_every_image_of_a_stack_and_a_malformed_one_names_none() -> None:
    """`bootseer trust resign` re-signs a ref only once every blob it names is whole: a layer's image and
    each image below it (before: only a whole tree's image was counted)."""
    from bootseer_cli.resign import named_blobs

    a, b, c, blob = "a" * 64, "b" * 64, "c" * 64, "d" * 64
    below = [{"digest": b, "size": 2, "format": LAYER_FORMAT}, {"digest": c, "size": 3, "format": FORMAT}]
    doc = {"blob": blob, FIELD: {"digest": a, "size": 1, "format": LAYER_FORMAT, "below": below}}
    assert named_blobs("refs/env/k.json", doc) == [("", blob), ("", a), ("", b), ("", c)]
    assert image_stack(doc) == [(a, 1), (b, 2), (c, 3)]
    for broken in (below[:1], below[::-1], [], "x"):  # no whole image at the bottom, a whole one above a layer
        assert image_stack({FIELD: {**doc[FIELD], "below": broken}}) is None
