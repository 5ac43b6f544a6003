"""The facts a cache key is computed from, gathered on this machine.

`keys.compute` is pure; what it needs from the world is read here: which image this process runs in
(a pinned reference, else the Docker engine's answer, else a fingerprint of the root filesystem),
the bytes of the files the setup names, the `[env] key_env` variables and the CPU architecture.
`keys_for(settings)` gathers all of them and computes both keys, which is what a stage or a verb
wants; a test or `prewarm` can call `keys.compute` with facts of its own.

The Docker SDK is imported only when an engine may answer (`containers.engine` checks the socket
first), so `bootseer exec` pays nothing for it on a machine without Docker.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import reqfiles
from .errors import ConfigError
from .keys import ImageIdentity, Keys, compute, env_file_names, image_digest_from_ref
from .safeopen import sha256_and_head

if TYPE_CHECKING:
    from .settings import EnvSettings, ImageSettings, Settings

__all__ = [
    "ImageIdentity",
    "digest_files",
    "env_roots",
    "gather_rootfs_fingerprint",
    "key_env_values",
    "keys_for",
    "resolve_image",
]


def _machine() -> str:
    """`platform.machine()` without importing `platform` at every start: the same field of uname(2)."""
    if hasattr(os, "uname"):
        return os.uname().machine
    import platform

    return platform.machine()


def resolve_image(image: ImageSettings) -> ImageIdentity:
    """The identity of the job's image, from the cheapest source that knows it.

    A pinned `[image] ref` (`name@sha256:…`) is its own answer. A tag may move, so the engine is
    asked what it names now; with no ref at all, a mounted engine socket knows the image of this
    container. When no engine answers, the root-filesystem fingerprint stands in.
    """
    ref = image.ref
    digest = image_digest_from_ref(ref)
    if digest:
        return ImageIdentity(digest, None, "image ref")
    from .containers.engine import own_image_digest, resolve_local_digest

    if ref:
        digest, source = resolve_local_digest(ref), "docker engine"
    else:
        digest, source = own_image_digest(), "docker engine (this container)"
    if digest:
        return ImageIdentity(digest, None, source)
    return ImageIdentity(None, gather_rootfs_fingerprint(), "root filesystem fingerprint")


def digest_files(names: list[str], base_dir: Path) -> dict[str, str]:
    """sha256 of each named file (relative names resolve against the config file's directory), and of
    every file a requirement file among them includes (see `setup_files`)."""
    return {name: digest for name, (_, digest) in setup_files(names, base_dir).items()}


def setup_files(names: list[str], base_dir: Path) -> dict[str, tuple[Path, str]]:
    """Each named file and every file a requirement file among them includes (`-r base.txt`,
    `-c constraints.txt`, relative to the including file, as pip reads them), by the name the env key
    gives it (`requirements.txt > base.txt`): its path here and its sha256. A change to the base alone
    must change the env key, and `prewarm` must carry the base into the container."""
    out: dict[str, tuple[Path, str]] = {}
    seen: set[str] = set()
    for name in names:
        _walk(name, Path(name) if os.path.isabs(name) else base_dir / name, out, seen, 0)
    return out


def _walk(name: str, path: Path, out: dict[str, tuple[Path, str]], seen: set[str], depth: int) -> None:
    real = os.path.normpath(path)
    if real in seen:
        return
    seen.add(real)
    try:
        digest, head = sha256_and_head(path, reqfiles.MAX_BYTES)  # /dev/zero or a FIFO: refused at once
    except OSError as e:
        raise ConfigError(f"[env] setup names {name}, which cannot be read: {e.strerror}") from None
    out[name] = (Path(real), digest)
    text = reqfiles.text_of(head)
    for inc in reqfiles.includes(text) if text is not None else []:
        if depth >= reqfiles.MAX_DEPTH:
            raise ConfigError(f"[env] setup names {name}, which includes files more than {reqfiles.MAX_DEPTH} deep")
        _walk(f"{name} > {inc}", Path(inc) if os.path.isabs(inc) else path.parent / inc, out, seen, depth + 1)


def key_env_values(env: EnvSettings, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The `[env] key_env` variables as this process sees them (None for an unset one)."""
    environ = os.environ if environ is None else environ
    return {name: environ.get(name) for name in env.key_env}


def env_roots(env: EnvSettings) -> list[str]:
    """The env's roots as the key knows them: absolute, symlinks resolved (`./.venv` and `/opt/venv`
    are two envs; one directory reached by two names is one)."""
    return [os.path.realpath(r) for r in env.resolve_roots()]


def keys_for(settings: Settings, environ: Mapping[str, str] | None = None, roots: list[str] | None = None) -> Keys:
    """Both keys for these settings on this machine: gather the facts, then `keys.compute`.

    `roots`: the env's roots as the node sees them, when computed elsewhere (`prewarm` outside the
    image, whose interpreter prefix and working directory differ from this process's)."""
    env = settings.env
    return compute(
        env,
        resolve_image(settings.image),
        digest_files(env_file_names(env), env.base_dir),
        key_env_values(env, environ),
        _machine(),
        env_roots(env) if roots is None else roots,
    )


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
        "machine": _machine(),
        "executable": [exe, exe_size],
        "base_distributions": hashlib.sha256("\n".join(_dist_names(site_dirs)).encode()).hexdigest(),
    }
