"""The example's config variants differ from its bootseer.toml only where they say they do.

`bench_e2e.py` (e) restarts the compiled job with `bootseer-compile.toml` on a store warmed by
`bootseer.toml`: if any other section drifted (the setup, the checkpoint, the image stage), the
variant would build its own env or miss the checkpoint, and the bench would compare unlike starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bootseer_cli.config import load, tomllib  # tomli before Python 3.11
from bootseer_cli.settings import Settings
from tests.e2e.harness import EXAMPLE, Node


def test_compile_variant_is_the_example_plus_the_compile_stage() -> None:
    base = tomllib.loads((EXAMPLE / "bootseer.toml").read_text())
    variant = tomllib.loads((EXAMPLE / "bootseer-compile.toml").read_text())
    assert variant == {**base, "compile": {"enabled": True}}
    settings = Settings.from_config(load(EXAMPLE / "bootseer-compile.toml", {}, {}))
    assert settings.compile.enabled
    assert not Settings.from_config(load(EXAMPLE / "bootseer.toml", {}, {})).compile.enabled


def test_use_config_puts_the_variant_where_a_start_finds_it(tmp_path: Path) -> None:
    node = Node(tmp_path / "n", "n", "file:///nowhere", "job", venv_at=tmp_path / "n" / "venv")
    node.work.mkdir(parents=True)
    shutil.copy2(EXAMPLE / "bootseer.toml", node.work / "bootseer.toml")
    assert node.use_config("bootseer-compile.toml") is node
    assert (node.work / "bootseer.toml").read_bytes() == (EXAMPLE / "bootseer-compile.toml").read_bytes()
