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
from dataclasses import dataclass, field
from pathlib import Path

from .config import Config


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
    enabled: bool = False  # any explicit [image] setting turns the stage on
    ref: str | None = None
    roots: tuple[str, ...] | None = None
    record: str = "auto"
    replay: str = "auto"  # "auto": skipped where a root's filesystem drops pages at every open
    ready: str | float = "quiet"
    prefetch_threads: int = 64
    prefetch_mbps: float = 0.0
    foreground_s: float = 10.0


@dataclass(frozen=True)
class EnvSettings:
    setup: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    roots: tuple[str, ...] | None = None  # as written; envsnap resolves them (default: sys.prefix)
    extra_roots: tuple[str, ...] = ()
    key_env: tuple[str, ...] = ()
    wait_s: float = 600.0
    base_dir: Path = field(default_factory=Path.cwd)  # relative paths (roots, -r files) resolve here

    def resolve_path(self, p: str) -> Path:
        return Path(_resolve(self.base_dir, p))


@dataclass(frozen=True)
class CheckpointSettings:
    name: str | None = None
    tag: str = "latest"
    mountpoint: str = "/tmp/bootseer-ckpt"  # resolved against the config file's directory
    mode: str = "mount"
    targets: tuple[str, ...] = ()
    stripes: int = 4
    cell_size: int = 1 << 20


@dataclass(frozen=True)
class P2PSettings:
    enabled: bool = False
    port: str = "6881-6891"
    peers: tuple[str, ...] = ()
    seed_s: float = 300.0
    origin_mbps: float = 0.0
    deadline_s: float = 30.0
    host: str | None = None  # address to listen on and announce; None: the one that routes to the store


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
        g = cfg.get
        base = cfg.base_dir
        cache_dir = g("store", "cache_dir")
        roots = g("env", "roots")
        image_roots = g("image", "roots")
        return cls(
            store=StoreSettings(
                uri=g("store", "uri"),
                cache_dir=Path(cache_dir).expanduser() if cache_dir else None,
                cache_max_bytes=int(g("store", "cache_max_gb") * (1 << 30)),
            ),
            exec=ExecSettings(quiet=bool(g("exec", "quiet")), skip=tuple(g("exec", "skip")), agent=g("exec", "agent")),
            image=ImageSettings(
                enabled=any(s.source != "default" for s in cfg.settings["image"].values()),
                ref=g("image", "ref"),
                roots=tuple(image_roots) if image_roots is not None else None,
                record=g("image", "record"),
                replay=g("image", "replay"),
                ready=g("image", "ready"),
                prefetch_threads=int(g("image", "prefetch_threads")),
                prefetch_mbps=float(g("image", "prefetch_mbps")),
                foreground_s=float(g("image", "foreground_s")),
            ),
            env=EnvSettings(
                setup=tuple(g("env", "setup")),
                files=tuple(g("env", "files")),
                roots=tuple(roots) if roots is not None else None,
                extra_roots=tuple(g("env", "extra_roots")),
                key_env=tuple(g("env", "key_env")),
                wait_s=float(g("env", "wait_s")),
                base_dir=base,
            ),
            checkpoint=CheckpointSettings(
                name=g("checkpoint", "name"),
                tag=g("checkpoint", "tag") or "latest",
                mountpoint=_resolve(base, g("checkpoint", "mountpoint")),
                mode=g("checkpoint", "mode"),
                targets=tuple(g("checkpoint", "targets")),
                stripes=int(g("checkpoint", "stripes")),
                cell_size=int(g("checkpoint", "cell_size")),
            ),
            p2p=P2PSettings(
                enabled=bool(g("p2p", "enabled")),
                port=str(g("p2p", "port")),
                peers=tuple(g("p2p", "peers")),
                seed_s=float(g("p2p", "seed_s")),
                origin_mbps=float(g("p2p", "origin_mbps")),
                deadline_s=float(g("p2p", "deadline_s")),
                host=g("p2p", "host"),
            ),
            report=ReportSettings(
                gpus_per_node=int(g("report", "gpus_per_node"))
                if cfg.source("report", "gpus_per_node") != "default"
                else None
            ),
            compile=CompileSettings(
                enabled=bool(g("compile", "enabled")),
                cache_dir=Path(_resolve(base, g("compile", "cache_dir"))) if g("compile", "cache_dir") else None,
                max_bytes=int(g("compile", "max_gb") * 10**9),
                device=g("compile", "device"),
                publish=bool(g("compile", "publish")),
            ),
            config_path=cfg.path,
        )
