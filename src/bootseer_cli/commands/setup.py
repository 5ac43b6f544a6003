"""Setting bootseer up on a machine: `init` writes a config, `config` and `keys` show what it resolves to,
`doctor` checks that the machine can do the work.

These are the verbs a user runs by hand while getting a job to hit its caches; each says *why*
(where a value came from, which document a key hashes, how to fix a failed check).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .complete import template_names
from .options import ConfigOpt, JsonOpt, StoreOpt, load_config, load_settings

if TYPE_CHECKING:
    from ..compilecache.jobpython import JobTorch
    from ..config import Config
    from ..keys import Key, Keys
    from ..settings import Settings
    from ..upkeep import Check


def init(
    path: Annotated[Path, typer.Argument(help="Where to write it.")] = Path("bootseer.toml"),
    template: Annotated[
        str,
        typer.Option(
            "--template", "-t", metavar="NAME", help="Template to render (see --list).", autocompletion=template_names
        ),
    ] = "bootseer.toml",
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the templates and exit.")] = False,
    values: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Substituted for {{KEY}} in the template (repeatable)."),
    ] = None,
) -> None:
    """Write a commented bootseer.toml (or another template) to start from."""
    from .. import templates

    if list_:
        for name, about in templates.available().items():
            typer.echo(f"{name:32} {about}")
            typer.echo(f"{'':32}   {templates.knobs_line(name)}")
        return
    written = templates.render_to(template, path, values or [], force=force)
    typer.echo(f"wrote {written}")


def config_(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Print the effective configuration and where each value came from."""
    cfg = load_config(config, store)
    typer.echo(_config_json(cfg) if as_json else _config_text(cfg))


def _shown(value: object) -> object:
    """A value as `config` shows it: URIs (the store's, checkpoint targets) without their credentials."""
    from ..redact import redact

    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_shown(v) for v in value]
    return value


def _config_json(cfg: Config) -> str:
    doc = {
        s: {k: {"value": _shown(v.value), "source": v.source} for k, v in keys.items()}
        for s, keys in cfg.settings.items()
    }
    return json.dumps({"file": str(cfg.path) if cfg.path else None, "settings": doc}, indent=2)


def _config_text(cfg: Config) -> str:
    """Valid TOML with each value's source as a comment (what a user pastes into an issue, or into a file).

    An unset value is a comment saying what applies instead, so the output parses and shows the store
    actually used."""
    from ..config import schema
    from ..paths import blob_cache_dir, default_store_uri

    spec = schema()
    lines = [f"# config file: {cfg.path or '(none: defaults and environment only)'}"]
    for section, keys in cfg.settings.items():
        lines.append(f"[{section}]")
        for key, s in keys.items():
            unit = spec[section][key].unit
            if s.value is not None:
                lines.append(f"{key} = {_toml_value(_shown(s.value))}    # {s.source}" + (f" · {unit}" if unit else ""))
            elif (section, key) == ("store", "uri"):
                lines.append(f"# {key} = (unset: the local store {default_store_uri()})")
            elif (section, key) == ("store", "cache_dir"):
                lines.append(f"# {key} = (unset: {blob_cache_dir()})")
            else:
                lines.append(f"# {key} = (unset)    # {spec[section][key].help}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: object) -> str:
    """A TOML literal for a config value (str, bool, number, list of those)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a TOML basic string


# The launcher after `--` (`bootseer keys -- torchrun …`): the compile key reads torch from its interpreter.
LauncherArg = Annotated[list[str] | None, typer.Argument(metavar="-- LAUNCHER", hidden=True)]
LAUNCHER_ARGS = {"allow_extra_args": True, "allow_interspersed_args": False}


def keys(
    command: LauncherArg = None, config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False
) -> None:
    """Print the cache keys and the documents they hash (why a cache hit or missed). With the launcher
    after --, the compile key reads torch from the interpreter it runs (else the python3 on PATH)."""
    from ..errors import ConfigError
    from ..identity import keys_for

    settings = load_settings(config, store)
    try:
        k = keys_for(settings)
    except ConfigError as e:
        # A fresh `init` names requirements.txt as its example setup: the key hashes that file's bytes,
        # so there is no key until it exists; the line says what to do, not only what is missing.
        if "cannot be read" not in str(e):
            raise
        raise ConfigError(f"{e}; create it, or change [env] setup in the config (the env key hashes it)") from None
    compiled = _compile_key(settings, k, command or []) if settings.compile.enabled else None
    typer.echo(_keys_json(k, compiled) if as_json else _keys_text(k, compiled))
    if not as_json and settings.env.setup:
        typer.echo("\n".join(_env_chain(settings, k)))


def _env_chain(settings: Settings, k: Keys) -> list[str]:
    """The env snapshot's chain of layers, or the parent a build would choose and why (store best effort)."""
    from ..envsnap.parent import explain
    from ..store.core import open_store_for

    try:
        return explain(settings, k, open_store_for(settings))
    except Exception as e:  # the keys never depend on the store: say why the chain is not shown
        return [f"env snapshot: store not read ({type(e).__name__}: {e})"[:300]]


def _compile_key(settings: Settings, k: Keys, command: list[str]) -> tuple[Key | str, JobTorch]:
    """The compile stage's key for the launcher's interpreter, or why there is none; and that interpreter."""
    from ..compilecache.jobpython import for_command
    from ..compilecache.key import current_compile_key

    job = for_command(settings, command)
    return current_compile_key(k, job, settings.compile.device) or f"none ({job.why_none(hint=True)})", job


def _keys_json(k: Keys, compiled: tuple[Key | str, JobTorch] | None) -> str:
    out: dict[str, object] = {
        "image": {"digest": k.image.digest, "source": k.image_source, "doc": k.image.doc},
        "env": {"digest": k.env.digest, "doc": k.env.doc},
    }
    if compiled is not None:
        key, job = compiled
        if isinstance(key, str):
            out["compile"] = {"digest": None, "why": key, "python": job.facts()}
        else:
            out["compile"] = {"digest": key.digest, "doc": key.doc, "python": job.facts()}
    return json.dumps(out, indent=2, sort_keys=True)


def _keys_text(k: Keys, compiled: tuple[Key | str, JobTorch] | None) -> str:
    lines = [
        f"image_key {k.image.digest}  (from {k.image_source})",
        json.dumps(k.image.doc, indent=2, sort_keys=True),
        f"env_key   {k.env.digest}",
        json.dumps(k.env.doc, indent=2, sort_keys=True),
    ]
    if compiled is not None:
        key, job = compiled
        if isinstance(key, str):
            lines.append(f"compile_key {key}")
        else:
            lines += [f"compile_key {key.digest}  (torch {job.torch} in {job.where()})"]
            lines.append(json.dumps(key.doc, indent=2, sort_keys=True))
    return "\n".join(lines)


def doctor(
    command: LauncherArg = None, config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False
) -> None:
    """Check the store, FUSE, the local cache, the Docker engine and the P2P port; with the launcher after
    --, which interpreter the compile key reads torch from."""
    from ..doctor import run_checks

    checks = run_checks(load_settings(config, store), command or [])
    if as_json:
        typer.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for c in checks:
            typer.echo(_check_line(c))
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


def _check_line(c: Check) -> str:
    """`ok    store        …`, and for a check that is not ok, how to fix it on the next line."""
    line = f"{c.status:4}  {c.name:12} {c.detail}"
    if c.fix and c.status != "ok":
        line += f"\n      fix: {c.fix}"
    return line


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.command("config")(config_)
    app.command("keys", context_settings=LAUNCHER_ARGS)(keys)
    app.command("doctor", context_settings=LAUNCHER_ARGS)(doctor)
