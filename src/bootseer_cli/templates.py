"""`bootseer init`: render the files under templates/ (shipped inside the package).

Placeholders are `{{NAME}}` or `{{NAME|default}}`; `--set NAME=VALUE` fills them. A placeholder with
no value and no default is an error naming it, so a rendered file never carries a hole.
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from .errors import ConfigError

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Z0-9_]+)\s*(?:\|([^}]*))?\}\}")


def _dir() -> Path:
    return Path(str(resources.files("bootseer_cli") / "templates"))


def available() -> dict[str, str]:
    """Template name -> its first comment line."""
    out = {}
    for p in sorted(_dir().iterdir()):
        if p.is_file() and not p.name.startswith("."):
            first = p.read_text(encoding="utf-8").splitlines()[0] if p.stat().st_size else ""
            out[p.name] = first.lstrip("#/ -").strip()
    return out


def render(name: str, values: dict[str, str]) -> str:
    path = _dir() / name
    if "/" in name or not path.is_file():
        raise ConfigError(f"no template {name!r} (bootseer init --list shows them)")
    text = path.read_text(encoding="utf-8")
    missing: list[str] = []

    def fill(m: re.Match[str]) -> str:
        key, default = m.group(1), m.group(2)
        if key in values:
            return values[key]
        if default is not None:
            return default
        missing.append(key)
        return m.group(0)

    out = _PLACEHOLDER.sub(fill, text)
    if missing:
        raise ConfigError(f"template {name} needs --set {missing[0]}=VALUE")
    return out


def render_to(name: str, dest: Path, assignments: list[str], force: bool = False) -> Path:
    values = {}
    for a in assignments:
        if "=" not in a:
            raise ConfigError(f"--set {a!r}: expected KEY=VALUE")
        k, v = a.split("=", 1)
        values[k.strip().upper()] = v
    text = render(name, values)
    if dest.exists() and not force:
        raise ConfigError(f"{dest} exists (use --force to overwrite)")
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    if name.endswith(".sh"):
        os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return dest
