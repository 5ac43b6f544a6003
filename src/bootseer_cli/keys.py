"""Cache keys: hex sha256 digests of canonical JSON documents.

A key is only as good as a user's ability to see why it changed, so every key is kept together with
the document it was computed from (`bootseer keys` prints both). Everything here is a pure function
of its inputs: the facts read from the machine (the image's digest from the Docker engine, the
root-filesystem fingerprint, the bytes of the files the setup names, the environment) are gathered
by `identity.py` and passed in, so a key can be tested, and reasoned about, without a machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .settings import EnvSettings

FORMAT_VERSION = 1

# Options of pip/uv (and conda/mamba) whose next argument names a file the setup reads.
# Programs whose `-c` takes code, not a file.
_INTERPRETER = re.compile(r"^(sh|bash|dash|zsh|ksh|python[0-9.]*|pypy[0-9.]*|perl|ruby|node)$")
_FILE_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "--constraints", "-f", "--file", "--override"}


@dataclass(frozen=True)
class Key:
    """A digest together with the document it hashes (so a user can see why it changed)."""

    doc: dict[str, Any]
    digest: str


def canonical(doc: object) -> bytes:
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
    roots: list[str] | None = None,
) -> dict[str, Any]:
    """`files` maps each file the setup names to the sha256 of its bytes; `roots` are the resolved,
    absolute directories the env lives in (one setup into `/opt/venv` and into `./.venv` are two envs:
    a snapshot of one cannot be restored into the other)."""
    doc = {
        "v": FORMAT_VERSION,
        "kind": "env",
        "image": image_key,
        "setup": list(setup),
        "files": dict(sorted(files.items())),
        "key_env": dict(sorted(key_env.items())),
        "machine": machine,
    }
    if roots is not None:
        doc["roots"] = list(roots)
    return doc


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


def env_file_names(env: EnvSettings) -> list[str]:
    """The files whose bytes the env key covers: those the setup's installers read, then `[env] files`."""
    named = files_named_by(list(env.setup))
    return named + [f for f in env.files if f not in named]


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
class ImageIdentity:
    """What names the image this process runs in: a digest when one is known, else a fingerprint.

    Gathered by `identity.resolve_image` (which may ask the Docker engine or read the root
    filesystem) so that `compute` stays pure; `source` says which of the two, for `bootseer keys`.
    """

    digest: str | None
    fingerprint: dict[str, Any] | None
    source: str


@dataclass(frozen=True)
class Keys:
    image: Key
    env: Key
    image_source: str


def compute(
    env: EnvSettings,
    image: ImageIdentity,
    files: dict[str, str],
    key_env: dict[str, str | None],
    machine: str,
    roots: list[str] | None = None,
) -> Keys:
    """Both keys, from the gathered facts: `files` maps each of `env_file_names(env)` to its sha256,
    `key_env` each `[env] key_env` name to its value (None when unset), `machine` is the CPU
    architecture, `roots` the env's resolved absolute roots. `identity.keys_for(settings)` gathers
    them on this machine."""
    image_key = make_key(image_key_doc(image.digest, None if image.digest else image.fingerprint))
    env_key = make_key(env_key_doc(image_key.digest, list(env.setup), files, key_env, machine, roots))
    return Keys(image=image_key, env=env_key, image_source=image.source)
