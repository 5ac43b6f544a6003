"""The `bootseer` command: one short typer function per verb over the library.

Capability verbs (env snapshots, checkpoints, hot blocks, p2p, prewarm, report) live in
`bootseer_cli.commands.<name>` and are registered below; each imports its heavy libraries inside
the function body, so building the app stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import __version__
from .commands.options import ConfigOpt, JsonOpt, StoreOpt, load_config
from .errors import run_guarded

app = typer.Typer(
    name="bootseer",
    help="Cut the startup time of distributed training jobs: bootseer exec -- torchrun … train.py",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # Wide enough that `bootseer --help` shows each verb's whole line, also in a log or a pipe.
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 140, "terminal_width": 140},
)


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


@app.command(
    "exec",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False},
)
def exec_(
    command: Annotated[list[str] | None, typer.Argument(help="The launcher and its arguments, after --.")] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    skip: Annotated[
        str | None, typer.Option("--skip", help="Stages not to run, comma-separated: image,env,checkpoint.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary line ($BOOTSEER_QUIET=1).")] = False,
) -> None:
    """Run the configured stages, then exec COMMAND in place (same pid, exit status, signals)."""
    from .launch import execute

    cfg = load_config(config, store, exec__quiet=True if quiet else None)
    skipped = {s.strip() for s in (skip or "").split(",") if s.strip()}
    execute(cfg, list(command or []), skipped)


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write it.")] = Path("bootseer.toml"),
    template: Annotated[
        str, typer.Option("--template", "-t", help="Template to render (see --list).")
    ] = "bootseer.toml",
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the templates and exit.")] = False,
    values: Annotated[
        list[str] | None, typer.Option("--set", help="KEY=VALUE substituted for {{KEY}} in the template.")
    ] = None,
) -> None:
    """Write a commented bootseer.toml (or another template) to start from."""
    from . import templates

    if list_:
        for name, about in templates.available().items():
            typer.echo(f"{name:32} {about}")
        return
    written = templates.render_to(template, path, values or [], force=force)
    typer.echo(f"wrote {written}")


@app.command("config")
def config_(config: ConfigOpt = None, store: StoreOpt = None, json_: JsonOpt = False) -> None:
    """Print the effective configuration and where each value came from."""
    cfg = load_config(config, store)
    if json_:
        doc = {
            s: {k: {"value": v.value, "source": v.source} for k, v in keys.items()} for s, keys in cfg.settings.items()
        }
        typer.echo(json.dumps({"file": str(cfg.path) if cfg.path else None, "settings": doc}, indent=2))
        return
    typer.echo(f"# config file: {cfg.path or '(none: defaults and environment only)'}")
    for section, keys in cfg.settings.items():
        typer.echo(f"[{section}]")
        for key, s in keys.items():
            typer.echo(f"{key} = {json.dumps(s.value)}    # {s.source}")
        typer.echo("")


@app.command()
def keys(config: ConfigOpt = None, store: StoreOpt = None, json_: JsonOpt = False) -> None:
    """Print the cache keys and the documents they hash (why a cache hit or missed)."""
    from .keys import compute

    k = compute(load_config(config, store))
    if json_:
        out = {
            "image": {"digest": k.image.digest, "source": k.image_source, "doc": k.image.doc},
            "env": {"digest": k.env.digest, "doc": k.env.doc},
        }
        typer.echo(json.dumps(out, indent=2, sort_keys=True))
        return
    typer.echo(f"image_key {k.image.digest}  (from {k.image_source})")
    typer.echo(json.dumps(k.image.doc, indent=2, sort_keys=True))
    typer.echo(f"env_key   {k.env.digest}")
    typer.echo(json.dumps(k.env.doc, indent=2, sort_keys=True))


@app.command()
def doctor(config: ConfigOpt = None, store: StoreOpt = None, json_: JsonOpt = False) -> None:
    """Check the store, FUSE, the local cache, the Docker engine and the P2P port."""
    from .doctor import run_checks

    checks = run_checks(load_config(config, store))
    if json_:
        typer.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for c in checks:
            line = f"{c.status:4}  {c.name:12} {c.detail}"
            if c.fix and c.status != "ok":
                line += f"\n      fix: {c.fix}"
            typer.echo(line)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


@app.command(hidden=True)
def agent(run_dir: Annotated[Path, typer.Option("--run-dir", help="The run directory exec prepared.")]) -> None:
    """The sidecar that exec starts (never by hand)."""
    from .agent import main as agent_main

    raise typer.Exit(agent_main(run_dir))


def _register_capabilities() -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"bootseer_cli.commands.{name}").register(app)


# Capability verbs, each module exposing register(app).
COMMAND_MODULES: tuple[str, ...] = ("hot", "report", "p2p", "prewarm", "ckpt", "env")


def main() -> None:
    _register_capabilities()
    run_guarded(app)
