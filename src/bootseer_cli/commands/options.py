"""Options shared by the verbs, and the one way a verb turns them into settings.

Below both `cli.py` (which only registers verbs) and each `commands/<area>.py`, so no command module
imports the app back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..config import Config
from ..settings import Settings

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="bootseer.toml to use (default: $BOOTSEER_CONFIG, else the nearest bootseer.toml from here up).",
    ),
]


def _store_flag(value: str | None) -> str | None:
    """`--store`'s value, refused before the verb runs when it names no store (`--`, a relative path)."""
    from ..paths import store_flag_problem

    problem = None if value is None else store_flag_problem(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URI",
        callback=_store_flag,
        help="Store URI (file://…, s3://…, hdfs://…); overrides [store] uri and $BOOTSEER_STORE.",
    ),
]
# A verb names this parameter `as_json` (`json` would shadow the module); the flag is `--json`.
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def load_config(config: Path | None = None, store: str | None = None, **flags: object) -> Config:
    """The effective config with flags applied. `flags` are {"section__key": value}."""
    from ..config import load

    overrides: dict[tuple[str, str], object] = {("store", "uri"): store}
    for name, value in flags.items():
        section, key = name.split("__", 1)
        overrides[(section, key)] = value
    return load(config, overrides)


def load_settings(config: Path | None = None, store: str | None = None, **flags: object) -> Settings:
    """The settings of the effective config with flags applied."""
    return Settings.from_config(load_config(config, store, **flags))
