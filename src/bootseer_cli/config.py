"""bootseer.toml: layered configuration (defaults < file < BOOTSEER_* environment < flags).

Every value remembers where it came from so `bootseer config` can explain a surprising setting.
There is no schema here: each settings section declares its own fields (settings.py, settingspec.py,
one section per row of the capability table), and the checks, the environment variables, the "did
you mean" and `bootseer config` follow from those declarations. Every value is checked as it is read,
so a bad one fails here, with its file and line, and never later in a stage.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .redact import warn
from .settingspec import Meta, check, defaults_of, parse, settings_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_NAME = "bootseer.toml"

# Sizes that counted GiB before and count decimal GB now (as `units.fmt_bytes` prints them): said once
# per load while a file or the environment sets them. Remove after the next release.
_MIGRATED_TO_GB = {("store", "cache_max_gb")}

# BOOTSEER_* variables that are facts for the launcher or knobs of the hooks, not settings.
KNOWN_FACTS = frozenset(
    {
        "BOOTSEER_CONFIG", "BOOTSEER_RUN_DIR", "BOOTSEER_RUN_ID", "BOOTSEER_JOB_ID", "BOOTSEER_EXEC_TIME",
        "BOOTSEER_CKPT_DIR", "BOOTSEER_NODE", "BOOTSEER_NODE_CACHE", "BOOTSEER_WARM_DIR", "BOOTSEER_DISABLE",
        "BOOTSEER_SPEC", "BOOTSEER_PROLOG_ENV", "BOOTSEER_PREFETCH_TIMEOUT", "BOOTSEER_RESTORE_THREADS",
        "BOOTSEER_TEST_RESTORE_FAULT", "BOOTSEER_STORE_WITHHELD",
    }
)  # fmt: skip


@dataclass
class Setting:
    value: Any
    source: str  # "default", "file:<path>:<line>", "env:<NAME>", "flag"


@dataclass
class Config:
    """The effective configuration with each value's source, for `bootseer config`.

    Capabilities do not read it: `settings.Settings.from_config` turns it into typed settings once.
    """

    settings: dict[str, dict[str, Setting]]
    path: Path | None = None
    base_dir: Path = field(default_factory=Path.cwd)

    def get(self, section: str, key: str) -> Any:
        return self.settings[section][key].value

    def source(self, section: str, key: str) -> str:
        return self.settings[section][key].source

    def is_set(self, section: str, key: str) -> bool:
        return self.settings[section][key].source != "default"

    def values(self, section: str) -> dict[str, object]:
        return {k: s.value for k, s in self.settings[section].items()}

    def describe(self) -> str:
        """Which config file applies (or why none) and the store it names, without its credentials: what
        `exec -v` says first."""
        from .paths import default_store_uri
        from .redact import redact

        uri = redact(self.get("store", "uri") or "")
        store = f"store {uri}" if uri else f"the local store {default_store_uri()}"
        if self.path is None:
            return f"no config file (no --config, no $BOOTSEER_CONFIG, no bootseer.toml of yours from here up); {store}"
        return f"config {self.path.resolve()}; {store}"


def schema() -> dict[str, dict[str, Meta]]:
    """section -> key -> declaration, derived from the settings classes (core and capability rows)."""
    from .settings import section_classes

    return {name: settings_of(cls) for name, cls in section_classes().items()}


def env_names(section: str, key: str, meta: Meta) -> tuple[str, ...]:
    """The environment variables that set a value: BOOTSEER_<SECTION>_<KEY> and the declared aliases."""
    return (f"BOOTSEER_{section.upper()}_{key.upper()}", *meta.env)


def _did_you_mean(word: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _line_of(text: str, section: str, key: str) -> int:
    """Best-effort line number of `key` inside `[section]` for error messages."""
    current = ""
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        m = re.match(r"^\[\s*([A-Za-z0-9_.-]+)\s*\]", s)
        if m:
            current = m.group(1)
            if not key and current == section:
                return n
            continue
        if key and current == section and re.match(rf"^{re.escape(key)}\s*=", s):
            return n
    return 0


def find_config_file(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """--config, else $BOOTSEER_CONFIG, else the nearest bootseer.toml from the working directory up that
    the caller may trust (`_walk_up`). `/dev/null` named explicitly means no file (the entrypoint hook's
    way of saying "defaults and environment only" without a walk)."""
    if explicit:
        p = Path(explicit).expanduser()
        if str(p) == os.devnull:
            return None
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        return p
    env = os.environ.get("BOOTSEER_CONFIG")
    if env:
        p = Path(env).expanduser()
        if str(p) == os.devnull:
            return None
        if not p.is_file():
            raise ConfigError(f"BOOTSEER_CONFIG names a file that does not exist: {p}")
        return p
    return _walk_up(Path.cwd())


def _walk_up(start: Path) -> Path | None:
    """The nearest bootseer.toml in `start` or a folder above it (as ruff and uv find theirs), so a job
    started from a subdirectory of its project still gets the project's config.

    A config is code (its setup runs as the caller), so the walk is git's safe.directory: it stops at the
    first folder the caller does not own (for root: not owned by root), naming a bootseer.toml found
    there as ignored, and refuses a found file that another user owns or can write (`_refusal`). A file
    named with --config or $BOOTSEER_CONFIG is the caller's explicit choice and is read as it is."""
    me = os.geteuid()
    for folder in (start, *start.parents):
        p = folder / CONFIG_NAME
        try:
            owner = folder.stat().st_uid
        except OSError:
            return None
        if owner != me:
            if p.is_file():
                warn(
                    f"ignored {p}: its directory {folder} belongs to {_who(owner)}, not you ({_who(me)}); "
                    f"a config is code: pass it with --config {p} if you trust it"
                )
            return None
        if p.is_symlink() or p.is_file():
            problem = _refusal(p, me)
            if problem:
                raise ConfigError(
                    f"refusing {p}: {problem}; a config is code: fix that, or pass it with --config {p} if you trust it"
                )
            return p
    return None


def _refusal(path: Path, me: int) -> str:
    """Why a found bootseer.toml may not be obeyed by `me` ('' when it may): a link another user made, or
    a file that fails `refusal_of`."""
    try:
        link = path.lstat()
        st = path.stat()
    except OSError as e:
        return f"cannot read it ({e.strerror})"
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        return f"it is a link made by {_who(link.st_uid)}, not you ({_who(me)})"
    return refusal_of(st, me)


def refusal_of(st: os.stat_result, me: int) -> str:
    """Why a found config file with status `st` may not be obeyed by `me`: another user owns it, or its
    group or others can write it. Checked again on the descriptor the file is read from, so a file
    swapped in after the walk looked is refused too. Root's own files are trusted by everyone."""
    if st.st_uid not in (me, 0):
        return f"it belongs to {_who(st.st_uid)}, not you ({_who(me)})"
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        return f"it is writable by {who} (chmod go-w it)"
    return ""


def _who(uid: int) -> str:
    """`uid 1000 (alice)` for a message."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _read_file(
    path: Path, spec: dict[str, dict[str, Meta]], settings: dict[str, dict[str, Setting]], found: bool = False
) -> None:
    """Read `path` into `settings`; a `found` file (not named by the caller) is checked again on its fd."""
    from .safeopen import read_capped

    def trusted(st: os.stat_result) -> None:
        problem = refusal_of(st, os.geteuid())
        if problem:
            raise ConfigError(f"refusing {path}: {problem}; pass it with --config {path} if you trust it")

    try:  # regular files only, capped: a config may be a job's
        text = read_capped(path, check=trusted if found else None).decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    for section, table in data.items():
        if section not in spec or not isinstance(table, dict):
            line = _line_of(text, section, "")
            hint = _did_you_mean(f"[{section}]", [f"[{s}]" for s in spec])
            raise ConfigError(f"{path}:{line}: unknown section [{section}]{hint}")
        for key, value in table.items():
            where = f"{path}:{_line_of(text, section, key)}"
            if key not in spec[section]:
                hint = _did_you_mean(key, list(spec[section])) or f" (known: {', '.join(spec[section])})"
                raise ConfigError(f"{where}: unknown key {key!r} in [{section}]{hint}")
            settings[section][key] = Setting(check(section, key, spec[section][key], value, where), f"file:{where}")


def _read_environ(
    environ: dict[str, str], spec: dict[str, dict[str, Meta]], settings: dict[str, dict[str, Setting]]
) -> None:
    names = {n: (s, k) for s, keys in spec.items() for k, m in keys.items() for n in env_names(s, k, m)}
    for name, text in sorted(environ.items()):
        if not name.startswith("BOOTSEER_"):
            continue
        target = names.get(name)
        if target is None:
            if name not in KNOWN_FACTS and not name.startswith("BOOTSEER_TEST_"):
                hint = _did_you_mean(name, list(names))
                warn(f"{name} is not a bootseer setting, ignored{hint}")
            continue
        section, key = target
        value = parse(section, key, spec[section][key], text, f"env {name}")
        settings[section][key] = Setting(value, f"env:{name}")


def load(
    config_file: str | os.PathLike[str] | None = None,
    overrides: dict[tuple[str, str], Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Build the effective config. `overrides` are flag values: {(section, key): value}."""
    from .settings import section_classes

    environ = dict(os.environ) if environ is None else environ
    classes = section_classes()
    spec = {name: settings_of(cls) for name, cls in classes.items()}
    defaults = {name: _defaults(cls) for name, cls in classes.items()}
    settings = {s: {k: Setting(defaults[s][k], "default") for k in keys} for s, keys in spec.items()}
    path = find_config_file(config_file)
    base_dir = Path.cwd()
    if path is not None:
        base_dir = path.resolve().parent
        _read_file(path, spec, settings, found=not config_file and not os.environ.get("BOOTSEER_CONFIG"))
    _read_environ(environ, spec, settings)
    for (section, key), value in (overrides or {}).items():
        if value is None:
            continue
        where = f"flag for [{section}] {key}"
        meta = spec[section][key]
        v = (
            parse(section, key, meta, value, where)
            if isinstance(value, str)
            else check(section, key, meta, value, where)
        )
        settings[section][key] = Setting(v, "flag")
    for section, key in _MIGRATED_TO_GB:
        s = settings[section][key]
        if s.source != "default" and s.value != defaults[section][key]:
            warn(
                f"[{section}] {key} now counts decimal GB (10^9 bytes), as every size bootseer prints; "
                f"{s.value:g} was {s.value * 2**30 / 1e9:.1f} GB before ({s.source})"
            )
    return Config(settings=settings, path=path, base_dir=base_dir)


def _defaults(cls: type) -> dict[str, Any]:
    """A section's declared defaults as `bootseer config` shows them (tuples as lists; a default made by a
    factory, like the per-user mountpoint, as unset)."""
    out: dict[str, Any] = {}
    for key, d in defaults_of(cls).items():
        out[key] = None if d is dataclasses.MISSING else list(d) if isinstance(d, tuple) else d
    return out
