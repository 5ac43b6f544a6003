"""The env image is read by the capture's no-follow writer, not by GNU tar (issue 48: "image built via
GNU tar, not the capture's no-follow reader: fix before making mount default"). GNU tar opened each
listed path by name, so a directory a job swapped for a link between the listing and the read was read
through. The builder now needs no `tar` at all; what it packs is the tree as the capture reads it: files
with their bytes and modes, symlinks as links (never their targets), bootseer's own per-tree files and
excluded paths left out, and every file owned by the tree's owner."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bootseer_cli.envmount.image import build_image

pytestmark = pytest.mark.integration


def test_the_image_is_the_tree_as_the_capture_reads_it_without_gnu_tar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mk = shutil.which("mksquashfs")
    assert mk is not None, "mksquashfs is required (apt-get install squashfs-tools)"
    only = tmp_path / "bin"  # PATH holds mksquashfs and nothing else: no tar to fall back on
    only.mkdir()
    (only / "mksquashfs").symlink_to(mk)
    root = tmp_path / "env"
    (root / "site" / "pkg").mkdir(parents=True)
    (root / "site" / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "bin" / "tool").chmod(0o755)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the image\n")
    (root / "site" / "link").symlink_to(secret)  # a link: stored as a link, its target never read
    (root / ".bootseer-env.json").write_text("{}")  # bootseer's own per-tree file: left out
    (root / "cache").mkdir()
    (root / "cache" / "blob").write_text("node cache\n")  # an excluded path: left out
    monkeypatch.setenv("PATH", str(only))

    img = build_image([str(root)], [str(root / "cache")], tmp_path / "out")

    monkeypatch.undo()
    listing = subprocess.run(
        ["unsquashfs", "-lln", "-d", "", str(img.path)], capture_output=True, text=True, check=True
    ).stdout
    rows = {line.split()[-1] if " -> " not in line else line.split()[-3]: line for line in listing.splitlines()}
    rel = str(root).lstrip("/")
    assert f"/{rel}/site/pkg/__init__.py" in rows, listing
    assert rows[f"/{rel}/bin/tool"].startswith("-rwxr-xr-x"), listing
    link = rows[f"/{rel}/site/link"]
    assert link.startswith("l") and link.endswith(f"-> {secret}"), listing
    assert f"/{rel}/.bootseer-env.json" not in rows and f"/{rel}/cache/blob" not in rows, listing
    owner = f"{os.lstat(root).st_uid}/{os.lstat(root).st_gid}"
    assert all(owner in line for line in rows.values() if line.startswith(("-", "l", "d"))), listing


def _listing(image: Path) -> list[str]:
    out = subprocess.run(["unsquashfs", "-lln", "-d", "", str(image)], capture_output=True, text=True, check=True)
    # mode, owner, size and path of each entry (the listing's date columns are the packing's)
    return sorted(" ".join(line.split()[:3] + line.split()[5:]) for line in out.stdout.splitlines())


def _capture(root: Path, baseline: object, cache_dir: Path) -> object:
    from bootseer_cli.envsnap import capture
    from bootseer_cli.settings import StoreSettings
    from bootseer_cli.store.cache import BlobCache

    settings = StoreSettings(uri=(cache_dir / "store").as_uri(), cache_dir=cache_dir)
    return capture.capture(settings, [str(root)], baseline, "a" * 64, BlobCache(cache_dir, 1 << 40), warn=print)  # type: ignore[arg-type]


def test_a_tree_made_from_nothing_is_packed_from_its_capture_as_it_is(tmp_path: Path) -> None:
    """`bootseer snapshot` in mount mode archived the tree a second time for the image (a scan, a read
    and a zstd pass over 939 MB of torch), then mksquashfs packed it at zstd level 15: 63 s against tar's
    4.6 s. A capture of a setup that made the whole tree is now packed as it is, at level 3, and the
    image holds exactly what an image of the tree holds; a capture of part of the tree is not used."""
    from bootseer_cli.envsnap import manifest

    root = tmp_path / "env"
    (root / "site" / "pkg").mkdir(parents=True)
    (root / "site" / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "site" / "pkg" / "data.bin").write_bytes(os.urandom(300_000))
    (root / "site" / "pkg" / "hard.bin").write_bytes(b"same inode\n")
    os.link(root / "site" / "pkg" / "hard.bin", root / "site" / "pkg" / "hard2.bin")
    (root / "site" / "alias").symlink_to("pkg")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "bin" / "tool").chmod(0o755)

    cap = _capture(root, {}, tmp_path / "cache")
    assert cap.whole  # type: ignore[attr-defined]
    from_capture = build_image([str(root)], [], tmp_path / "a", whole=cap.blob)  # type: ignore[attr-defined]
    from_tree = build_image([str(root)], [], tmp_path / "b")
    assert _listing(from_capture.path) == _listing(from_tree.path)
    info = subprocess.run(["unsquashfs", "-s", str(from_capture.path)], capture_output=True, text=True, check=True)
    assert "compression-level 3" in info.stdout, info.stdout

    baseline = manifest.scan([str(root)])  # the setup only adds to a tree that was there: a part of it
    (root / "site" / "pkg" / "new.py").write_text("y = 2\n")
    assert not _capture(root, baseline, tmp_path / "cache2").whole  # type: ignore[attr-defined]
