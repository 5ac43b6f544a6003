"""How a setting declares itself: its kind, default, unit, environment variables, choices and help.

A settings section is a frozen dataclass (settings.py, or a capability's own module) whose fields are
made by the constructors below (`text`, `flag`, `integer`, `number`, `size_gb`, `strings`, `location`, `seconds_or`).
The field's name is the key in bootseer.toml, and its metadata is everything else: `config.py` derives
the schema, the checks, the environment variables and `bootseer config` from it, so a setting is
written once, with its unit beside its value. No imports beyond the standard library: the config is
read in front of every start.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import NamedTuple, TypeVar

from .errors import ConfigError

# The kinds of value a setting holds. In TOML a list is an array; from an environment variable or a
# flag, it is comma- or newline-separated text.
KINDS = ("str", "bool", "int", "float", "list", "path", "str|float")


class Meta(NamedTuple):
    """What a field says of itself besides its name and default (a tuple: declared on every start)."""

    kind: str
    help: str
    unit: str = ""  # "s", "GB" (decimal, as every size bootseer prints), "B", "MB/s", "Mbit/s"
    choices: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # names users expect besides BOOTSEER_<SECTION>_<KEY>
    minimum: float | None = None
    pattern: str = ""  # a regular expression a text value must match in full
    example: str = ""  # what a value looks like, for the error that refuses one

    def describe(self) -> str:
        """The type as an error message says it: 'a number of seconds >= 0', 'one of auto, always'."""
        if self.choices:
            words = ", ".join(self.choices)
            return f"one of {words}" + (" or a number of seconds" if self.kind == "str|float" else "")
        noun = {
            "str": "text",
            "bool": "true or false",
            "int": "a whole number",
            "float": "a number",
            "list": "a list of strings",
            "path": "a path",
            "str|float": "text or a number",
        }[self.kind]
        if self.unit and self.kind in ("int", "float"):
            noun += f" of {_UNIT_WORDS.get(self.unit, self.unit)}"
        if self.minimum is not None:
            noun += f" >= {self.minimum:g}"
        if self.example:
            noun += f" (like {self.example})"
        return noun


_UNIT_WORDS = {"s": "seconds", "GB": "GB (decimal: 10^9 bytes)", "B": "bytes"}


# Each constructor returns what `dataclasses.field` does: to the type checker, a value of the default's
# type, so `uri: str | None = text(None, ...)` is checked against the field's annotation.
_T = TypeVar("_T")
_Text = TypeVar("_Text", bound="str | None")
_Int = TypeVar("_Int", bound="int | None")
_Strings = TypeVar("_Strings", bound="tuple[str, ...] | None")


def _field(default: _T, meta: Meta) -> _T:
    return field(default=default, metadata={"setting": meta})


def text(
    default: _Text, help: str, *, choices: Sequence[str] = (), env: Sequence[str] = (), pattern: str = "",
    example: str = "",
) -> _Text:  # fmt: skip
    return _field(default, Meta("str", help, choices=tuple(choices), env=tuple(env), pattern=pattern, example=example))


def flag(default: bool, help: str, *, env: Sequence[str] = ()) -> bool:
    return _field(default, Meta("bool", help, env=tuple(env)))


def integer(default: _Int, help: str, *, unit: str = "", minimum: float | None = 0) -> _Int:
    return _field(default, Meta("int", help, unit=unit, minimum=minimum))


def number(default: float, help: str, *, unit: str = "", minimum: float | None = 0) -> float:
    return _field(default, Meta("float", help, unit=unit, minimum=minimum))


def size_gb(default: float, help: str) -> float:
    """A size in decimal gigabytes (10^9 bytes), as `units.fmt_bytes` prints every size."""
    return _field(default, Meta("float", help, unit="GB", minimum=0))


def strings(default: _Strings, help: str, *, env: Sequence[str] = ()) -> _Strings:
    return _field(default, Meta("list", help, env=tuple(env)))


def location(default: None, help: str) -> Path | None:
    """A path: `~` expands, and a relative one is relative to the config file's directory (unset by
    default: every location setting falls back to a directory of its own when none is given)."""
    return _field(default, Meta("path", help))


def seconds_or(default: str, help: str, *, choices: Sequence[str]) -> str | float:
    """One of `choices`, or a number of seconds (`[image] ready`)."""
    return _field(default, Meta("str|float", help, unit="s", choices=tuple(choices), minimum=0))


def settings_of(cls: type) -> dict[str, Meta]:
    """key -> Meta for each declared setting of a section class (fields without metadata are derived)."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(cls) if "setting" in f.metadata}


def defaults_of(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(cls) if "setting" in f.metadata}


def check(section: str, key: str, meta: Meta, value: object, where: str) -> object:
    """A value as TOML gives it (already typed), checked against its declaration; returns it normalised."""
    ok = True
    if value is None:
        return None
    if meta.kind == "list":
        ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        value = list(value) if ok else value  # type: ignore[call-overload]
    elif meta.kind == "bool":
        ok = isinstance(value, bool)
    elif meta.kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif meta.kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value  # type: ignore[arg-type]
    elif meta.kind == "str|float":
        ok = isinstance(value, str | int | float) and not isinstance(value, bool)
        if ok and isinstance(value, str):
            ok = value in meta.choices
        elif ok:
            value = float(value)  # type: ignore[arg-type]
    else:
        ok = isinstance(value, str)
        if ok and meta.choices:
            ok = value in meta.choices
        if ok and meta.pattern:
            ok = re.fullmatch(meta.pattern, str(value)) is not None
    if ok and meta.minimum is not None and isinstance(value, int | float) and not isinstance(value, bool):
        ok = value >= meta.minimum
    if not ok:
        raise ConfigError(f"{where}: [{section}] {key} must be {meta.describe()}, got {value!r}")
    return value


def parse(section: str, key: str, meta: Meta, raw: str, where: str) -> object:
    """A value given as text (an environment variable or a flag), parsed by its kind, then checked.

    An empty text unsets a path or a text (`BOOTSEER_TRUST_SIGNING_KEY=` undoes the file's key)."""
    value: object = raw
    if raw == "" and meta.kind in ("path", "str"):
        return None
    try:
        if meta.kind == "list":
            value = [v.strip() for v in re.split(r"[,\n]", raw) if v.strip()]
        elif meta.kind == "bool":
            low = raw.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off", ""):
                raise ValueError(raw)
            value = low in ("1", "true", "yes", "on")
        elif meta.kind == "int":
            value = int(raw)
        elif meta.kind == "float" or (meta.kind == "str|float" and raw not in meta.choices):
            value = float(raw)
    except ValueError:
        raise ConfigError(f"{where}: [{section}] {key} must be {meta.describe()}, got {raw!r}") from None
    return check(section, key, meta, value, where)
