"""`bootseer exec` and the hidden `bootseer agent`: the verbs that start a job and serve it while it runs.

`bootseer exec` normally never reaches this module: `entry.py` parses its few options by hand so that
typer is not imported in front of every start. This typer version is what `--help` and unusual
arguments go through, and it must accept exactly what the fast path accepts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import ConfigOpt, StoreOpt, load_config

SkipOpt = Annotated[
    str | None,
    typer.Option("--skip", metavar="STAGES", help="Stages not to run, comma-separated: image,env,checkpoint,compile."),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No summary line ($BOOTSEER_QUIET=1).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Say which config file and store are used.")]


def exec_(
    # Hidden from the Arguments table (typer prints its Python type there); the usage line and the
    # docstring name it.
    command: Annotated[list[str] | None, typer.Argument(metavar="COMMAND", hidden=True)] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    skip: SkipOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run the configured stages, then exec COMMAND (the launcher and its arguments, after --) in place
    (same pid, exit status, signals)."""
    from ..launch import execute
    from ..settings import Settings

    cfg = load_config(config, store, exec__quiet=True if quiet else None)
    if verbose:
        from ..entry import config_line

        typer.echo(config_line(cfg), err=True)
    skipped = {s.strip() for s in (skip or "").split(",") if s.strip()}
    execute(Settings.from_config(cfg), list(command or []), skipped)


def agent(run_dir: Annotated[Path, typer.Option("--run-dir", help="The run directory exec prepared.")]) -> None:
    """The sidecar that exec starts (never by hand)."""
    from ..agent import main as agent_main

    raise typer.Exit(agent_main(run_dir))


def register(app: typer.Typer) -> None:
    # exec's arguments are the launcher's: nothing after the first non-option is bootseer's.
    app.command(
        "exec",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False},
    )(exec_)
    app.command("agent", hidden=True)(agent)
