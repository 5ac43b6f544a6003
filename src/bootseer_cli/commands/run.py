"""`bootseer exec` and the hidden `bootseer agent`: the verbs that start a job and serve it while it runs.

`bootseer exec` normally never reaches this module: `entry.py` parses its few options by hand so that
typer is not imported in front of every start. This typer version is what `--help` goes through, and
it must accept exactly what the fast path accepts; both run `verbs.exec.run_exec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..capabilities import stage_names
from .options import ConfigOpt, StoreOpt

SkipOpt = Annotated[
    str | None,
    typer.Option("--skip", metavar="STAGES", help=f"Stages not to run, comma-separated: {','.join(stage_names())}."),
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
    from ..verbs.exec import ExecOptions, run_exec

    options = ExecOptions(
        config=str(config) if config is not None else None,
        store=store,
        skip=ExecOptions.skip_list(skip),
        quiet=quiet,
        verbose=verbose,
    )
    run_exec(options, list(command or []))


def agent(run_dir: Annotated[Path, typer.Option("--run-dir", help="The run directory exec prepared.")]) -> None:
    """The sidecar that exec starts (never by hand)."""
    from ..agent import main as agent_main

    raise typer.Exit(agent_main(run_dir))


def register(app: typer.Typer) -> None:
    # exec's arguments are the launcher's: nothing after the first non-option is bootseer's. An unknown
    # option before it is a usage error (click's), never the start of the command.
    app.command("exec", context_settings={"allow_extra_args": True, "allow_interspersed_args": False})(exec_)
    app.command("agent", hidden=True)(agent)
