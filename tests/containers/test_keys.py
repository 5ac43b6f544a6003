"""Key agreement: what `prewarm` computes outside equals what `bootseer exec` computes inside the image."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.config import load
from bootseer_cli.containers import engine
from bootseer_cli.containers.prewarm import WORKDIR, keys_for, setup_files
from bootseer_cli.settings import Settings
from tests.support import images

from .conftest import write_project

SETUP = ["pip install --no-index -r requirements.txt"]


def settings_of(cfg_path: Path) -> Settings:
    """The settings of a project's config file alone (the host's BOOTSEER_* variables left out)."""
    return Settings.from_config(load(cfg_path, environ={}))


def keys_inside(
    client: Any, image: str, cfg_path: Path, env: dict[str, str] | None = None, socket: bool = False
) -> dict[str, Any]:
    """`bootseer keys --json` in a fresh container of `image`, with the project copied in."""
    settings = settings_of(cfg_path)
    files = engine.tar_of([(dest, src, 0o644) for dest, src in setup_files(settings)])
    binds = {"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"}} if socket else None
    res = engine.run_container(
        client,
        image,
        ["bootseer", "keys", "--json"],
        environment={"BOOTSEER_CONFIG": f"{WORKDIR}/{cfg_path.name}", **(env or {})},
        files=files,
        binds=binds,
        working_dir=WORKDIR,
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.integration
def test_keys_agree_inside_and_outside(
    docker_client: Any, test_image: images.TestImage, other_image: images.TestImage, tmp_path: Path
) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    cfg_a = write_project(a, SETUP)
    cfg_b = write_project(b, SETUP, requirements="tinypkg==1.1\n")  # changed requirements file
    cfg_c = write_project(c, [*SETUP, "pip check"])  # changed setup command

    pinned = {"BOOTSEER_IMAGE": test_image.pinned}
    one = keys_inside(docker_client, test_image.pinned, cfg_a, pinned)
    two = keys_inside(docker_client, test_image.pinned, cfg_a, pinned)
    outside = keys_for(settings_of(cfg_a), test_image.pinned)
    assert one == two
    assert one["image"]["doc"] == {"v": 1, "kind": "image", "digest": test_image.digest}
    assert one["image"]["digest"] == outside.image.digest
    # The roots are absolute in this project's config: the host resolves them as the node does.
    assert one["env"]["doc"]["roots"] == outside.env.doc["roots"] == ["/usr/local"]
    assert one["env"]["digest"] == outside.env.digest

    # Without BOOTSEER_IMAGE, the engine answers when its socket is mounted: the same keys again.
    engine_side = keys_inside(docker_client, test_image.pinned, cfg_a, socket=True)
    assert engine_side["image"]["source"] == "docker engine (this container)"
    assert engine_side["env"]["digest"] == one["env"]["digest"]

    # Neither: the root-filesystem fingerprint, identical in every container of the image.
    fp1 = keys_inside(docker_client, test_image.pinned, cfg_a)
    fp2 = keys_inside(docker_client, test_image.pinned, cfg_a)
    assert fp1["image"]["source"] == "root filesystem fingerprint"
    assert fp1 == fp2

    # What must change the keys does.
    other = keys_inside(docker_client, other_image.pinned, cfg_a, {"BOOTSEER_IMAGE": other_image.pinned})
    assert other["image"]["digest"] != one["image"]["digest"] and other["env"]["digest"] != one["env"]["digest"]
    changed_req = keys_inside(docker_client, test_image.pinned, cfg_b, pinned)
    changed_setup = keys_inside(docker_client, test_image.pinned, cfg_c, pinned)
    assert changed_req["image"] == one["image"] and changed_setup["image"] == one["image"]
    assert len({one["env"]["digest"], changed_req["env"]["digest"], changed_setup["env"]["digest"]}) == 3


def test_a_shell_setup_names_no_constraints_file() -> None:
    """`sh -c …` is common in CI setups; its -c takes a script, not a constraints file (it used to fail)."""
    from bootseer_cli.keys import files_named_by

    assert files_named_by(["sh -c 'echo hi; exit 7'", "python3 -c 'import x'"]) == []
    assert files_named_by(["pip install -r r.txt -c c.txt", "uv pip install -c=cons.txt ."]) == [
        "r.txt",
        "c.txt",
        "cons.txt",
    ]
