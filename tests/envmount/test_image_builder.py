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
