"""`bootseer init`: render the files under templates/ (shipped inside the package, hooks included).

Placeholders are `{{NAME}}` or `{{NAME|default}}`; `--set NAME=VALUE` fills them. A placeholder with
no value and no default is an error naming it, so a rendered file never carries a hole; a `--set` name
the template does not know is an error listing the ones it does, so a typo never goes unnoticed.

The hooks (entrypoint wrapper, Kubernetes init script, Slurm prolog) live in templates/hooks/ and are
rendered under their bare names (`--template entrypoint.sh`): a pip install carries them, so a Dockerfile
or a node's provisioning writes them with `bootseer init` instead of needing a checkout of this repository.
"""

from __future__ import annotations

import os
import re
import tempfile
from importlib import resources
from pathlib import Path

from .errors import BootseerError, ConfigError

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Z0-9_]+)\s*(?:\|([^}]*))?\}\}")
_HOOKS = "hooks"


def _dir() -> Path:
    return Path(str(resources.files("bootseer_cli") / "templates"))


def _files() -> dict[str, Path]:
    """Template name -> its file: the top-level templates, then the hooks under their bare names."""
    out: dict[str, Path] = {}
    for folder in (_dir(), _dir() / _HOOKS):
        if folder.is_dir():
            for p in sorted(folder.iterdir()):
                if p.is_file() and not p.name.startswith("."):
                    out.setdefault(p.name, p)
    return out


def _about(path: Path) -> str:
    """The first comment line that is not a shebang (`#!/bin/bash` says nothing about the template)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#!"):
            continue
        return line.lstrip("#/ -").strip()
    return ""


def available() -> dict[str, str]:
    """Template name -> its first comment line."""
    return {name: _about(p) for name, p in _files().items()}


def names_in(text: str) -> list[str]:
    """The placeholder names a template knows, in order of first use."""
    return list(dict.fromkeys(m.group(1) for m in _PLACEHOLDER.finditer(text)))


def knobs(name: str) -> list[tuple[str, str | None]]:
    """The `--set` names a template takes, in order of first use, each with its default (None: required)."""
    out: dict[str, str | None] = {}
    for m in _PLACEHOLDER.finditer(_source(name)):
        key, default = m.group(1), m.group(2)
        if key not in out or default is None:  # one use without a default makes it required (`render`)
            out[key] = default
    return list(out.items())


def knobs_line(name: str) -> str:
    """What `init --list` prints under a template: its `--set` names, the required ones first."""
    ks = knobs(name)
    need = [k for k, d in ks if d is None]
    may = [k for k, d in ks if d is not None]
    if not ks:
        return "--set: nothing"
    parts = [f"{', '.join(need)} (required)"] if need else []
    parts += [f"{', '.join(may)} (optional)"] if may else []
    return "--set " + "; ".join(parts)


def _source(name: str) -> str:
    path = _files().get(name)
    if "/" in name or path is None:
        raise ConfigError(f"no template {name!r} (bootseer init --list shows them)")
    return path.read_text(encoding="utf-8")


def render(name: str, values: dict[str, str]) -> str:
    text = _source(name)
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
    """Render into dest atomically, creating its folders (`init .github/workflows/x.yml` on a fresh repo)."""
    values = {}
    for a in assignments:
        if "=" not in a:
            raise ConfigError(f"--set {a!r}: expected KEY=VALUE")
        k, v = a.split("=", 1)
        values[k.strip().upper()] = v
    known = names_in(_source(name))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"template {name} has no {unknown[0]} (--set takes: {', '.join(known) or 'nothing'})")
    text = render(name, values)
    if dest.is_dir():  # `init .` or `init deploy/`: the template's own name in that folder
        dest = dest / name
    if dest.exists() and not force:
        raise ConfigError(f"{dest} exists (use --force to overwrite)")
    if dest.is_dir():
        raise ConfigError(f"{dest} is a directory: name a file to write")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BootseerError(f"cannot create {dest.parent}: {e.strerror}") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as e:
        raise BootseerError(f"cannot write {dest}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o755 if name.endswith(".sh") else 0o644)
        os.replace(tmp, dest)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise BootseerError(f"cannot write {dest}: {e.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
