"""The frozen settings each capability reads, built once from the layered config.

`Config` (config.py) knows where every value came from, which `bootseer config` needs; the
capabilities need none of that, only typed values. `Settings.from_config` is the one place that
reads `cfg.get(...)`: a capability takes its own small dataclass (`EnvSettings`, `ImageSettings`, …),
so its signature says which settings it depends on and a test can build one without a file.
Relative paths are resolved here, against the config file's directory, as a user reading the file
expects.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .config import Config
from .errors import BootseerError
from .paths import default_mountpoint


def _resolve(base_dir: Path, p: str) -> str:
    path = Path(os.path.expanduser(p))
    return str(path if path.is_absolute() else base_dir / path)


@dataclass(frozen=True)
class StoreSettings:
    uri: str | None = None  # None: the embedded local store under the user cache dir
    cache_dir: Path | None = None  # None: platformdirs user cache
    cache_max_bytes: int = 50 << 30


@dataclass(frozen=True)
class ExecSettings:
    quiet: bool = False
    skip: tuple[str, ...] = ()
    agent: bool = True


@dataclass(frozen=True)
class ImageSettings:
    enabled: bool = False  # `enabled = true`, or `record`/`roots` set by the user: see _image_enabled
    ref: str | None = None
    roots: tuple[str, ...] | None = None
    record: str = "auto"
    replay: str = "auto"  # "auto": skipped where a root's filesystem drops pages at every open
    ready: str | float = "quiet"
    prefetch_threads: int = 64
    prefetch_mbps: float = 0.0
    foreground_s: float = 10.0


def _image_enabled(cfg: Config) -> bool:
    """The image stage runs only when asked: its first start evicts the roots' page cache and records.

    `enabled` decides when the user set it; else `record` or `roots` set by the user to a value other
    than the default turn it on. A key that restates its default (`bootseer init` writes a few) never does.
    """
    from .config import SCHEMA

    if cfg.source("image", "enabled") != "default":
        return bool(cfg.get("image", "enabled"))
    return any(
        cfg.source("image", key) != "default" and cfg.get("image", key) != SCHEMA["image"][key][1]
        for key in ("record", "roots")
    )


@dataclass(frozen=True)
class EnvSettings:
    setup: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    roots: tuple[str, ...] | None = None  # as written; envsnap resolves them (default: sys.prefix)
    extra_roots: tuple[str, ...] = ()
    key_env: tuple[str, ...] = ()
    wait_s: float = 600.0
    lease_ttl_s: float = 60.0  # renewed every third of it while the builder works (and its agent uploads)
    base_dir: Path = field(default_factory=Path.cwd)  # relative paths (roots, -r files) resolve here

    def resolve_path(self, p: str) -> Path:
        return Path(_resolve(self.base_dir, p))

    def resolve_roots(self) -> list[str]:
        """`roots` (default: the running interpreter's prefix) plus `extra_roots`, absolute and normalised.

        A root nested inside another is dropped (it is scanned as part of its parent). Here, below every
        capability, so that the keys, the env stage and the commands read one answer without importing
        each other.
        """
        roots = list(self.roots or [sys.prefix]) + list(self.extra_roots)
        out: list[str] = []
        for r in roots:
            p = os.path.normpath(os.path.abspath(str(self.resolve_path(r))))
            if p == "/":
                raise BootseerError("[env] roots: '/' cannot be a root (name the directories the setup writes into)")
            if p not in out:
                out.append(p)
        return [r for r in out if not any(r != o and r.startswith(o + "/") for o in out)]


@dataclass(frozen=True)
class CheckpointSettings:
    name: str | None = None
    tag: str = "latest"
    # resolved against the config file's directory; default: a private per-user runtime directory
    mountpoint: str = field(default_factory=default_mountpoint)
    mode: str = "mount"
    targets: tuple[str, ...] = ()
    stripes: int = 4
    cell_size: int = 1 << 20
    allow_other: bool = False  # FUSE allow_other: other local users may read the mount


@dataclass(frozen=True)
class P2PSettings:
    enabled: bool = False
    port: str = "6881-6891"
    peers: tuple[str, ...] = ()
    seed_s: float = 300.0
    origin_mbps: float = 0.0
    deadline_s: float = 30.0
    host: str | None = None  # address to listen on and announce; None: the one that routes to the store
    listen: str | None = None  # address the listener binds; None: the announced one (0.0.0.0 only if set so)


@dataclass(frozen=True)
class ReportSettings:
    # None when the config does not set it: the report then uses what the launcher said, else 8
    gpus_per_node: int | None = None


@dataclass(frozen=True)
class CompileSettings:
    enabled: bool = False
    cache_dir: Path | None = None  # None: <user cache>/compile; one subdirectory per compile key
    max_bytes: int = 10 * 10**9  # decimal GB, like every size bootseer prints
    device: str | None = None  # None: detected
    publish: bool = True


@dataclass(frozen=True)
class Settings:
    """Every capability's settings, plus the config file they came from (for the agent and `-v`)."""

    store: StoreSettings = field(default_factory=StoreSettings)
    exec: ExecSettings = field(default_factory=ExecSettings)
    image: ImageSettings = field(default_factory=ImageSettings)
    env: EnvSettings = field(default_factory=EnvSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    p2p: P2PSettings = field(default_factory=P2PSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    compile: CompileSettings = field(default_factory=CompileSettings)
    config_path: Path | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> Settings:
        return cls(
            store=_store(cfg),
            exec=ExecSettings(
                quiet=bool(cfg.get("exec", "quiet")),
                skip=tuple(cfg.get("exec", "skip")),
                agent=bool(cfg.get("exec", "agent")),
            ),
            image=_image(cfg),
            env=_env(cfg),
            checkpoint=_checkpoint(cfg),
            p2p=_p2p(cfg),
            report=ReportSettings(
                gpus_per_node=int(cfg.get("report", "gpus_per_node"))
                if cfg.source("report", "gpus_per_node") != "default"
                else None
            ),
            compile=_compile(cfg),
            config_path=cfg.path,
        )


# One builder per section: the only readers of `cfg.get`.


def _store(cfg: Config) -> StoreSettings:
    cache_dir = cfg.get("store", "cache_dir")
    return StoreSettings(
        uri=cfg.get("store", "uri"),
        cache_dir=Path(cache_dir).expanduser() if cache_dir else None,
        cache_max_bytes=int(cfg.get("store", "cache_max_gb") * (1 << 30)),
    )


def _image(cfg: Config) -> ImageSettings:
    g = cfg.get
    roots = g("image", "roots")
    return ImageSettings(
        enabled=_image_enabled(cfg),
        ref=g("image", "ref"),
        roots=tuple(roots) if roots is not None else None,
        record=g("image", "record"),
        replay=g("image", "replay"),
        ready=g("image", "ready"),
        prefetch_threads=int(g("image", "prefetch_threads")),
        prefetch_mbps=float(g("image", "prefetch_mbps")),
        foreground_s=float(g("image", "foreground_s")),
    )


def _env(cfg: Config) -> EnvSettings:
    g = cfg.get
    roots = g("env", "roots")
    return EnvSettings(
        setup=tuple(g("env", "setup")),
        files=tuple(g("env", "files")),
        roots=tuple(roots) if roots is not None else None,
        extra_roots=tuple(g("env", "extra_roots")),
        key_env=tuple(g("env", "key_env")),
        wait_s=float(g("env", "wait_s")),
        lease_ttl_s=float(g("env", "lease_ttl_s")),
        base_dir=cfg.base_dir,
    )


def _checkpoint(cfg: Config) -> CheckpointSettings:
    g = cfg.get
    return CheckpointSettings(
        name=g("checkpoint", "name"),
        tag=g("checkpoint", "tag") or "latest",
        mountpoint=_resolve(cfg.base_dir, g("checkpoint", "mountpoint") or default_mountpoint()),
        mode=g("checkpoint", "mode"),
        targets=tuple(g("checkpoint", "targets")),
        stripes=int(g("checkpoint", "stripes")),
        cell_size=int(g("checkpoint", "cell_size")),
        allow_other=bool(g("checkpoint", "allow_other")),
    )


def _p2p(cfg: Config) -> P2PSettings:
    g = cfg.get
    return P2PSettings(
        enabled=bool(g("p2p", "enabled")),
        port=str(g("p2p", "port")),
        peers=tuple(g("p2p", "peers")),
        seed_s=float(g("p2p", "seed_s")),
        origin_mbps=float(g("p2p", "origin_mbps")),
        deadline_s=float(g("p2p", "deadline_s")),
        host=g("p2p", "host"),
        listen=g("p2p", "listen"),
    )


def _compile(cfg: Config) -> CompileSettings:
    g = cfg.get
    cache_dir = g("compile", "cache_dir")
    return CompileSettings(
        enabled=bool(g("compile", "enabled")),
        cache_dir=Path(_resolve(cfg.base_dir, cache_dir)) if cache_dir else None,
        max_bytes=int(g("compile", "max_gb") * 10**9),
        device=g("compile", "device"),
        publish=bool(g("compile", "publish")),
    )


def settings_doc(settings: Settings) -> dict[str, dict[str, object]]:
    """The settings as JSON-able sections, for the agent (agent.json): it gets what `exec` ran with
    instead of reading a config file again. The store URI is left out (it may carry credentials, which
    reach the agent through its environment only)."""
    import dataclasses

    def plain(v: object) -> object:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    doc: dict[str, dict[str, object]] = {}
    for f in dataclasses.fields(settings):
        section = getattr(settings, f.name)
        if dataclasses.is_dataclass(section):
            doc[f.name] = {g.name: plain(getattr(section, g.name)) for g in dataclasses.fields(section)}
    doc["store"].pop("uri", None)
    doc["_"] = {"config_path": str(settings.config_path) if settings.config_path else None}
    return doc


def settings_from_doc(doc: dict[str, dict[str, object]], store_uri: str | None) -> Settings:
    """`settings_doc` read back, with the store URI from where the agent has it (its environment)."""
    import dataclasses
    import typing

    sections: dict[str, object] = {}
    hints = typing.get_type_hints(Settings)
    for name, cls in hints.items():
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or name not in doc:
            continue
        values = dict(doc[name])
        if name == "store":
            values["uri"] = store_uri
        types = typing.get_type_hints(cls)
        for k, v in list(values.items()):
            t = str(types.get(k, ""))
            if isinstance(v, list):
                values[k] = tuple(v)
            elif v is not None and "Path" in t:
                values[k] = Path(str(v))
        sections[name] = cls(**values)
    path = doc.get("_", {}).get("config_path")
    return Settings(**sections, config_path=Path(str(path)) if path else None)  # type: ignore[arg-type]
