"""The `bootseer` command: the typer app, the verbs of `commands/` registered on it, and `main`.

Every verb lives in a `bootseer_cli.commands.<group>` module exposing `register(app)`; the shared
options are in `commands/options.py`, below both, so no command module imports this one back. Each
verb imports its heavy libraries inside its body, so building the app stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from . import __version__
from .errors import run_guarded

app = typer.Typer(
    name="bootseer",
    help="Cut the startup time of distributed training jobs: bootseer exec -- torchrun … train.py",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion, as users of typer-based tools expect
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Wide enough that `bootseer --help` shows each verb's whole line, also in a log or a pipe.
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 140, "terminal_width": 140},
)

# The command modules, in the order their verbs appear in `bootseer --help` (groups follow the verbs).
COMMAND_MODULES: tuple[str, ...] = (
    "run", "setup", "hot", "report", "p2p", "prewarm", "ckpt", "env", "cache", "gc", "trust",
)  # fmt: skip

_registered = False


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bootseer {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """bootseer: cut the startup time of distributed training jobs."""


def register_commands() -> typer.Typer:
    """Register every command module's verbs on the app, once (main() may run many times in a test)."""
    global _registered
    if not _registered:
        for name in COMMAND_MODULES:
            importlib.import_module(f"bootseer_cli.commands.{name}").register(app)
        _registered = True
    return app


def human_metavars(command: object) -> None:
    """Help that reads like a Unix tool's: `--name NAME`, `DIRECTORY`, not typer's `<str>` / `<path>`.

    typer labels a value with its Python type (`--set <list[str]>`, `path <path>`); an option without
    its own metavar gets its name in capitals instead, and an argument shows only its name. Duck-typed
    on click's `param_type_name`: typer vendors its own click in newer releases, not in the oldest.
    """
    for param in getattr(command, "params", ()):
        kind = getattr(param, "param_type_name", "")
        if kind == "option" and param.metavar is None and not param.is_flag and not param.count:
            param.metavar = (param.name or "value").upper()
        elif kind == "argument":
            param.display_type_rich = lambda ctx: None
    for sub in getattr(command, "commands", {}).values():
        human_metavars(sub)


def main() -> None:
    command = typer.main.get_command(register_commands())
    human_metavars(command)
    run_guarded(command)
