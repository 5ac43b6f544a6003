"""Cache keys: hex sha256 digests of canonical JSON documents.

A key is only as good as a user's ability to see why it changed, so every key is kept together with
the document it was computed from (`bootseer keys` prints both). The document builders are pure
functions of their inputs; the few facts read from the machine are gathered in `gather_*` helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

FORMAT_VERSION = 1

# Options of pip/uv (and conda/mamba) whose next argument names a file the setup reads.
# Programs whose `-c` takes code, not a file.
_INTERPRETER = re.compile(r"^(sh|bash|dash|zsh|ksh|python[0-9.]*|pypy[0-9.]*|perl|ruby|node)$")
_FILE_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "--constraints", "-f", "--file", "--override"}


@dataclass(frozen=True)
class Key:
    doc: dict[str, Any]
    digest: str

    @property
    def short(self) -> str:
        return self.digest[:16]


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def make_key(doc: dict[str, Any]) -> Key:
    return Key(doc=doc, digest=hashlib.sha256(canonical(doc)).hexdigest())


def image_key_doc(image_digest: str | None, fingerprint: dict[str, Any] | None, source: str = "") -> dict[str, Any]:
    """The image's identity: a registry/engine digest when known, else a root-filesystem fingerprint.

    `source` is not part of the identity (two ways of naming one digest must agree) and is kept out.
    """
    if image_digest:
        return {"v": FORMAT_VERSION, "kind": "image", "digest": image_digest}
    return {"v": FORMAT_VERSION, "kind": "rootfs", "fingerprint": fingerprint or {}}


def env_key_doc(
    image_key: str,
    setup: list[str],
    files: dict[str, str],
    key_env: dict[str, str | None],
    machine: str,
) -> dict[str, Any]:
    """`files` maps each file the setup names to the sha256 of its bytes."""
    return {
        "v": FORMAT_VERSION,
        "kind": "env",
        "image": image_key,
        "setup": list(setup),
        "files": dict(sorted(files.items())),
        "key_env": dict(sorted(key_env.items())),
        "machine": machine,
    }


_INSTALLERS = re.compile(r"^(pip[0-9.]*|uv|conda|mamba|micromamba|pdm|poetry)$")
_SHELLS = re.compile(r"^(sh|bash|dash|zsh)$")


def _simple_commands(command: str) -> list[list[str]]:
    """Split a shell command line at `&&`, `||`, `;` and `|` into the words of each simple command."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    try:
        for tok in lexer:
            if tok and set(tok) <= set(";&|"):
                out.append([])
            else:
                out[-1].append(tok)
    except ValueError as e:
        raise ConfigError(f"[env] setup: cannot parse {command!r}: {e}") from None
    return [words for words in out if words]


def _installer_args(words: list[str]) -> list[str] | None:
    """The arguments of an installer invocation (`pip …`, `uv pip …`, `python -m pip …`), else None."""
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]  # leading VAR=value assignments
    if not words:
        return None
    prog = os.path.basename(words[0])
    if _INSTALLERS.match(prog):
        return words[1:]
    if _INTERPRETER.match(prog) and len(words) > 2 and words[1] == "-m" and _INSTALLERS.match(words[2]):
        return words[3:]
    return None


def files_named_by(setup: list[str]) -> list[str]:
    """Requirement, constraint and lock files that the setup's installer commands read.

    Only installer invocations are parsed (`pip`, `uv`, `python -m pip`, conda…, also inside
    `sh -c '…'`), so `rm -rf build` or `python -c CODE` are never mistaken for `-r`/`-c` files.
    """
    found: list[str] = []

    def scan(command: str) -> None:
        for words in _simple_commands(command):
            prog = os.path.basename(words[0])
            if _SHELLS.match(prog) and "-c" in words[1:-1]:
                scan(words[words.index("-c") + 1])
                continue
            args = _installer_args(words)
            if args is None:
                continue
            for i, tok in enumerate(args):
                name = None
                if tok in _FILE_OPTIONS and i + 1 < len(args):
                    name = args[i + 1]
                elif "=" in tok and tok.split("=", 1)[0] in _FILE_OPTIONS:
                    name = tok.split("=", 1)[1]
                elif tok.startswith(("-r", "-c")) and len(tok) > 2 and not tok.startswith("--"):
                    name = tok[2:]
                if name and not name.startswith(("http://", "https://")) and name not in found:
                    found.append(name)

    for command in setup:
        scan(command)
    return found


def digest_files(names: list[str], base_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        path = Path(name) if os.path.isabs(name) else base_dir / name
        try:
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as e:
            raise ConfigError(f"[env] setup names {name}, which cannot be read: {e.strerror}") from None
    return out


def _dist_names(site_dirs: list[str]) -> list[str]:
    names: set[str] = set()
    for d in site_dirs:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        names.update(e for e in entries if e.endswith((".dist-info", ".egg-info")))
    return sorted(names)


def gather_rootfs_fingerprint() -> dict[str, Any]:
    """What is identical on every node started from one image, and differs between images.

    The distributions counted are those of the *base* interpreter (`sys.base_prefix`), so that a
    setup installing into a virtual environment does not change the image key it is keyed on.
    When the setup installs into the base prefix itself, pin the image (`[image] ref` or
    BOOTSEER_IMAGE, as the templates do).
    """
    try:
        os_release = Path("/etc/os-release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        os_release = ""
    base_paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    site_dirs = sorted({base_paths["purelib"], base_paths["platlib"]})
    exe = os.path.realpath(sys.executable)
    try:
        exe_size = os.stat(exe).st_size
    except OSError:
        exe_size = -1
    return {
        "os_release": hashlib.sha256(os_release.encode()).hexdigest(),
        "python": sys.version.split()[0],
        "cache_tag": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("SOABI") or "",
        "machine": platform.machine(),
        "executable": [exe, exe_size],
        "base_distributions": hashlib.sha256("\n".join(_dist_names(site_dirs)).encode()).hexdigest(),
    }


def image_digest_from_ref(ref: str | None) -> str | None:
    """`name@sha256:…` or a bare `sha256:…` pins an image; a tag alone does not."""
    if not ref:
        return None
    if "@" in ref:
        return ref.split("@", 1)[1]
    if ref.startswith("sha256:"):
        return ref
    return None


@dataclass(frozen=True)
class Keys:
    image: Key
    env: Key
    image_source: str


def compute(cfg: Any) -> Keys:
    """Both keys for a config (see config.Config)."""
    ref = cfg.get("image", "ref")
    digest = image_digest_from_ref(ref)
    source = "image ref" if digest else "root filesystem fingerprint"
    if ref and not digest:
        # A tag may move; ask the engine for what it currently names, when an engine is reachable.
        try:
            from .containers.engine import resolve_local_digest
        except ImportError:
            resolve_local_digest = None  # type: ignore[assignment]
        if resolve_local_digest is not None:
            digest = resolve_local_digest(ref)
            source = "docker engine" if digest else source
    elif not ref:
        # Inside a container with the engine's socket mounted, the engine knows our image.
        try:
            from .containers.engine import own_image_digest
        except ImportError:
            own_image_digest = None  # type: ignore[assignment]
        if own_image_digest is not None:
            digest = own_image_digest()
            source = "docker engine (this container)" if digest else source
    image = make_key(image_key_doc(digest, None if digest else gather_rootfs_fingerprint()))
    setup = cfg.get("env", "setup")
    names = files_named_by(setup) + [f for f in cfg.get("env", "files") if f not in files_named_by(setup)]
    files = digest_files(names, cfg.base_dir)
    key_env = {name: os.environ.get(name) for name in cfg.get("env", "key_env")}
    env = make_key(env_key_doc(image.digest, setup, files, key_env, platform.machine()))
    return Keys(image=image, env=env, image_source=source)
