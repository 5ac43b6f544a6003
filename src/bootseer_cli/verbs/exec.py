"""`bootseer exec`, once: its options (`ExecOptions`), their parsing by hand for the fast path, and
the body both the fast path (entry.py) and the typer command (commands/run.py) run (`run_exec`).

An option bootseer does not know, before the command, is a usage error (exit 2) raised here, before
any stage runs: `bootseer exec --sotre x -- true` must not run every stage and then exec `--sotre`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..errors import ConfigError

# The options of `exec` (the typer command in commands/run.py declares the same ones, with their help).
VALUED: dict[str, str] = {"--config": "config", "-c": "config", "--store": "store", "--skip": "skip"}
FLAGS: dict[str, str] = {"--quiet": "quiet", "-q": "quiet", "--verbose": "verbose", "-v": "verbose"}
HELP = ("--help", "-h")
USAGE = "bootseer exec [OPTIONS] [--] COMMAND [ARGS]..."


@dataclass(frozen=True)
class ExecOptions:
    config: str | None = None  # --config FILE
    store: str | None = None  # --store URI
    skip: tuple[str, ...] = ()  # --skip a,b
    quiet: bool = False
    verbose: bool = False

    @staticmethod
    def skip_list(value: str | None) -> tuple[str, ...]:
        """`--skip image,env` as stage names."""
        return tuple(s.strip() for s in (value or "").split(",") if s.strip())


class ExecUsageError(ConfigError):
    """A word of exec's own options that is not one (exit 2, like any usage error)."""


def unknown_option(word: str) -> ExecUsageError:
    """The one-line usage error for `word`, with the option it is closest to."""
    import difflib

    name = word.split("=", 1)[0]
    if name in FLAGS:
        return ExecUsageError(f"exec: option {name} takes no value; usage: {USAGE}")
    known = [o for o in (*VALUED, *FLAGS, *HELP) if o.startswith("--")]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ExecUsageError(f"exec: no such option {name}{hint}; usage: {USAGE}")


def parse_exec(args: list[str]) -> tuple[ExecOptions, list[str]] | None:
    """Options and command of `bootseer exec ARGS`; None for what typer explains (--help, an option
    missing its value). Raises `ExecUsageError` for an unknown option before the command."""
    opts: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return _checked(_options(opts)), args[i + 1 :]
        if a in HELP:
            return None
        if a in FLAGS:
            opts[FLAGS[a]] = True
        elif a.startswith("--") and "=" in a and a.split("=", 1)[0] in VALUED:
            name, value = a.split("=", 1)
            opts[VALUED[name]] = value
        elif a in VALUED:
            if i + 1 >= len(args):
                return None  # typer says the option needs a value
            opts[VALUED[a]] = args[i + 1]
            i += 1
        elif a.startswith("-") and not a.startswith("--") and len(a) > 2:
            taken = _short_cluster(a, args[i + 1] if i + 1 < len(args) else None, opts)
            if taken is None:
                return None
            i += taken
        elif a.startswith("-") and a != "-":
            raise unknown_option(a)
        else:
            return _checked(_options(opts)), args[i:]
        i += 1
    return _checked(_options(opts)), []


def _checked(opts: ExecOptions) -> ExecOptions:
    """`opts`, once its store is one (`--store --` or a relative path is a usage error, exit 2)."""
    from ..paths import store_flag_problem

    problem = None if opts.store is None else store_flag_problem(opts.store)
    if problem:
        raise ExecUsageError(f"exec: option --store {problem}; usage: {USAGE}")
    return opts


def _short_cluster(word: str, following: str | None, opts: dict[str, str | bool]) -> int | None:
    """`-qv`, `-qc FILE`, `-cFILE` (click's short options, joined): how many more words it took, or None
    for typer (`-h` among them, a `-c` missing its value)."""
    for j, ch in enumerate(word[1:], start=1):
        short = f"-{ch}"
        if short in FLAGS:
            opts[FLAGS[short]] = True
        elif short in VALUED:
            rest = word[j + 1 :]
            if rest:
                opts[VALUED[short]] = rest
                return 0
            if following is None:
                return None
            opts[VALUED[short]] = following
            return 1
        elif short in HELP:
            return None
        else:
            raise unknown_option(word)
    return 0


def _options(opts: dict[str, str | bool]) -> ExecOptions:
    def text(name: str) -> str | None:
        value = opts.get(name)
        return value if isinstance(value, str) else None

    return ExecOptions(
        config=text("config"),
        store=text("store"),
        skip=ExecOptions.skip_list(text("skip")),
        quiet=bool(opts.get("quiet")),
        verbose=bool(opts.get("verbose")),
    )


def run_exec(options: ExecOptions, command: list[str]) -> None:
    """Load the config with the options applied, run the stages, exec `command`. Returns only on error
    (raised as a `BootseerError`)."""
    from ..config import load
    from ..launch import execute
    from ..settings import Settings

    cfg = load(options.config, {("store", "uri"): options.store, ("exec", "quiet"): True if options.quiet else None})
    if options.verbose:
        print(f"bootseer: {cfg.describe()}", file=sys.stderr, flush=True)  # the config file and store
    execute(Settings.from_config(cfg), command, set(options.skip))
