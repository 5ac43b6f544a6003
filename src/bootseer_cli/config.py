"""bootseer.toml: layered configuration (defaults < file < BOOTSEER_* environment < flags).

Every value remembers where it came from so `bootseer config` can explain a surprising setting.
The schema is one table below: adding a setting is adding one row, and validation, the environment
variable and the documentation of `bootseer config` follow from it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_NAME = "bootseer.toml"

# section -> key -> (type, default). Types: str, int, float, bool, "list[str]", "str|float".
# A default of None means "unset": the capability decides (usually from the running interpreter).
SCHEMA: dict[str, dict[str, tuple[Any, Any]]] = {
    "store": {
        "uri": (str, None),  # None: file:// under the user cache dir
        "cache_dir": (str, None),  # node-local blob cache; None: platformdirs user cache
        "cache_max_gb": (float, 50.0),
    },
    "exec": {
        "quiet": (bool, False),
        "skip": ("list[str]", []),
        "agent": (bool, True),
    },
    "image": {
        "enabled": (bool, False),  # also on when the user sets record or roots (to a value of their own)
        "ref": (str, None),
        "roots": ("list[str]", None),
        "record": (str, "auto"),
        "replay": (str, "auto"),  # "auto": not where the tree drops pages at open; "always"; "never"
        "ready": ("str|float", "quiet"),
        "prefetch_threads": (int, 64),
        "prefetch_mbps": (float, 0.0),
        "foreground_s": (float, 10.0),
    },
    "env": {
        "setup": ("list[str]", []),
        "files": ("list[str]", []),
        "roots": ("list[str]", None),
        "extra_roots": ("list[str]", []),
        "key_env": ("list[str]", []),
        "wait_s": (float, 600.0),
        "lease_ttl_s": (float, 60.0),  # the builder's lease: another node builds this long after the builder died
    },
    "checkpoint": {
        "name": (str, None),
        "tag": (str, "latest"),
        "mountpoint": (str, None),  # None: <private runtime dir>/ckpt (paths.default_mountpoint)
        "mode": (str, "mount"),
        "targets": ("list[str]", []),
        "stripes": (int, 4),
        "cell_size": (int, 1 << 20),
        "allow_other": (bool, False),  # let other users read the mount (multi-user containers)
    },
    "p2p": {
        "enabled": (bool, False),
        "port": (str, "6881-6891"),
        "peers": ("list[str]", []),
        "seed_s": (float, 300.0),
        "origin_mbps": (float, 0.0),
        "deadline_s": (float, 30.0),
        "host": (str, None),  # address to listen on and announce; None: the one that routes to the store
        "listen": (str, None),  # address the listener binds; None: the announced address (never all interfaces)
    },
    "report": {
        "gpus_per_node": (int, 8),
    },
    "compile": {
        "enabled": (bool, False),
        "cache_dir": (str, None),  # node-local torch.compile caches; None: under the user cache dir
        "max_gb": (float, 10.0),  # bound on the published cache (least recently used out first)
        "device": (str, None),  # None: detected (GPU name and driver, else CPU model)
        "publish": (bool, True),
    },
}

CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("image", "record"): ("auto", "always", "never"),
    ("image", "replay"): ("auto", "always", "never"),
    ("checkpoint", "mode"): ("mount", "pull"),
}

# Environment variables that are not BOOTSEER_<SECTION>_<KEY> but users expect.
ENV_ALIASES: dict[str, tuple[str, str]] = {
    "BOOTSEER_STORE": ("store", "uri"),
    "BOOTSEER_QUIET": ("exec", "quiet"),
    "BOOTSEER_IMAGE": ("image", "ref"),
    "BOOTSEER_PEERS": ("p2p", "peers"),
}


@dataclass
class Setting:
    value: Any
    source: str  # "default", "file:<path>:<line>", "env:<NAME>", "flag:--x"


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

    def resolve_path(self, p: str) -> Path:
        """Paths in the file are relative to the file's directory, as a user reading it expects."""
        path = Path(os.path.expanduser(p))
        return path if path.is_absolute() else self.base_dir / path


def _type_name(t: Any) -> str:
    return t if isinstance(t, str) else t.__name__


def _coerce(section: str, key: str, value: Any, where: str) -> Any:
    """Check a value from TOML (already typed) against the schema."""
    t, _ = SCHEMA[section][key]
    ok: bool
    if t == "list[str]":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif t == "str|float":
        ok = isinstance(value, str | int | float) and not isinstance(value, bool)
    elif t is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif t is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, t)
    if not ok:
        raise ConfigError(f"{where}: [{section}] {key} must be {_type_name(t)}, got {value!r}")
    choices = CHOICES.get((section, key))
    if choices and value not in choices:
        raise ConfigError(f"{where}: [{section}] {key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def parse_text(section: str, key: str, text: str, where: str) -> Any:
    """Parse a value given as text (environment variable or flag) by the schema's type."""
    t, _ = SCHEMA[section][key]
    try:
        if t == "list[str]":
            value: Any = [v.strip() for v in re.split(r"[,\n]", text) if v.strip()]
        elif t is bool:
            low = text.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off", ""):
                raise ValueError(text)
            value = low in ("1", "true", "yes", "on")
        elif t is int:
            value = int(text)
        elif t is float:
            value = float(text)
        elif t == "str|float":
            try:
                value = float(text)
            except ValueError:
                value = text
        else:
            value = text
    except ValueError:
        raise ConfigError(f"{where}: [{section}] {key} must be {_type_name(t)}, got {text!r}") from None
    return _coerce(section, key, value, where)


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
    """--config, else $BOOTSEER_CONFIG, else the nearest bootseer.toml from the working directory up."""
    if explicit:
        p = Path(explicit).expanduser()
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        return p
    env = os.environ.get("BOOTSEER_CONFIG")
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise ConfigError(f"BOOTSEER_CONFIG names a file that does not exist: {p}")
        return p
    return _walk_up(Path.cwd())


def _walk_up(start: Path) -> Path | None:
    """The nearest bootseer.toml in `start` or a folder above it, up to the filesystem root (as ruff and uv
    find theirs), so a job started from a subdirectory of its project still gets the project's config."""
    for folder in (start, *start.parents):
        p = folder / CONFIG_NAME
        if p.is_file():
            return p
    return None


def load(
    config_file: str | os.PathLike[str] | None = None,
    overrides: dict[tuple[str, str], Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Build the effective config. `overrides` are flag values: {(section, key): value}."""
    environ = dict(os.environ) if environ is None else environ
    settings = {s: {k: Setting(d, "default") for k, (_, d) in keys.items()} for s, keys in SCHEMA.items()}
    path = find_config_file(config_file)
    base_dir = Path.cwd()
    if path is not None:
        base_dir = path.resolve().parent
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
        for section, table in data.items():
            if section not in SCHEMA or not isinstance(table, dict):
                line = _line_of(text, section, "")
                raise ConfigError(f"{path}:{line}: unknown section [{section}]")
            for key, value in table.items():
                line = _line_of(text, section, key)
                where = f"{path}:{line}"
                if key not in SCHEMA[section]:
                    known = ", ".join(SCHEMA[section])
                    raise ConfigError(f"{where}: unknown key {key!r} in [{section}] (known: {known})")
                settings[section][key] = Setting(_coerce(section, key, value, where), f"file:{where}")
    for name, text in sorted(environ.items()):
        if not name.startswith("BOOTSEER_"):
            continue
        target = ENV_ALIASES.get(name)
        if target is None:
            rest = name[len("BOOTSEER_") :].lower()
            for section in SCHEMA:
                if rest.startswith(section + "_") and rest[len(section) + 1 :] in SCHEMA[section]:
                    target = (section, rest[len(section) + 1 :])
                    break
        if target is None:
            continue  # BOOTSEER_* facts for the launcher (run id, mountpoints) live here too
        settings[target[0]][target[1]] = Setting(parse_text(*target, text, f"env {name}"), f"env:{name}")
    for (section, key), value in (overrides or {}).items():
        if value is None:
            continue
        where = f"flag for [{section}] {key}"
        v = parse_text(section, key, value, where) if isinstance(value, str) else _coerce(section, key, value, where)
        settings[section][key] = Setting(v, "flag")
    return Config(settings=settings, path=path, base_dir=base_dir)
