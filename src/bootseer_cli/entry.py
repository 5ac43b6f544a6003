"""The `bootseer` entry point: `exec` takes a fast path that never imports typer.

`bootseer exec` sits in front of every start of every job, so its own cost is paid on every
restart of every node. typer (which now imports pydantic) costs a few hundred milliseconds to
import; the exec options are few and fixed, so they are parsed here by hand. Anything unusual
(`--help`, an unknown option) goes through the full typer CLI, which explains it properly.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Config

_VALUED = {"--config", "-c", "--store", "--skip"}
_FLAGS = {"--quiet": "quiet", "-q": "quiet", "--verbose": "verbose", "-v": "verbose"}


def _parse_exec(args: list[str]) -> tuple[dict[str, str | bool], list[str]] | None:
    """Options and command of `bootseer exec …`, or None to let typer handle the arguments."""
    opts: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return opts, args[i + 1 :]
        if a in _FLAGS:
            opts[_FLAGS[a]] = True
        elif "=" in a and a.split("=", 1)[0] in _VALUED:
            name, value = a.split("=", 1)
            opts["config" if name == "-c" else name.lstrip("-")] = value
        elif a in _VALUED:
            if i + 1 >= len(args):
                return None
            opts["config" if a == "-c" else a.lstrip("-")] = args[i + 1]
            i += 1
        elif a.startswith("-"):
            return None  # --help and friends: typer explains
        else:
            return opts, args[i:]
        i += 1
    return None


def main() -> None:
    """`bootseer …`: exec and restore by hand-parsed arguments when they are plain, else the typer app."""
    argv = sys.argv[1:]
    if argv[:1] == ["exec"]:
        parsed = _parse_exec(argv[1:])
        if parsed is not None:
            _fast_exec(*parsed)
            return
    if argv[:1] == ["restore"]:
        # `bootseer restore || (setup && bootseer snapshot)` runs in front of every start too
        parsed = _parse_exec([*argv[1:], "--"])
        if parsed is not None and set(parsed[0]) <= {"config", "store"}:
            _fast_restore(parsed[0])
            return
    from .cli import main as cli_main

    cli_main()


def config_line(cfg: Config) -> str:
    """What `exec -v` says first: which config file it used (or why none) and the store it talks to."""
    from .paths import default_store_uri
    from .redact import redact

    uri = redact(cfg.get("store", "uri") or "")
    store = f"store {uri}" if uri else f"the local store {default_store_uri()}"
    if cfg.path is None:
        where = "no config file (no --config, no $BOOTSEER_CONFIG, no bootseer.toml from here up to /)"
        return f"bootseer: {where}; {store}"
    return f"bootseer: config {cfg.path.resolve()}; {store}"


def _fast_restore(opts: dict[str, str | bool]) -> None:
    from .commands.restore import restore_verb
    from .config import load
    from .errors import run_guarded

    def body() -> int:
        cfg = load(opts.get("config"), {("store", "uri"): opts.get("store")})  # type: ignore[arg-type]
        return restore_verb(cfg, print, lambda m: print(m, file=sys.stderr))

    sys.exit(run_guarded(body))


def _fast_exec(opts: dict[str, str | bool], command: list[str]) -> None:
    from .config import load
    from .errors import run_guarded
    from .launch import execute
    from .settings import Settings

    def body() -> None:
        overrides = {("store", "uri"): opts.get("store"), ("exec", "quiet"): True if opts.get("quiet") else None}
        cfg = load(opts.get("config"), overrides)  # type: ignore[arg-type]
        if opts.get("verbose"):
            print(config_line(cfg), file=sys.stderr, flush=True)
        skip = {s.strip() for s in str(opts.get("skip") or "").split(",") if s.strip()}
        execute(Settings.from_config(cfg), command, skip)

    run_guarded(body)
