"""The frozen settings each capability reads, and how they are built from the layered config.

Each section is a frozen dataclass whose fields declare themselves (settingspec.py): the field's name
is the key in bootseer.toml, its metadata the kind, unit, environment variables, choices and help.
`config.py` derives the schema, the checks and `bootseer config` from these classes, so a setting is
written once. `Config` knows where every value came from; the capabilities need none of that, only
typed values: a capability takes its own small section (`EnvSettings`, `ImageSettings`, …), so its
signature says which settings it depends on and a test can build one without a file. The sections
are the core ones here and one per row of the capability table (`section_classes`). Relative paths
resolve against the config file's directory, as a user reading the file expects.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .errors import BootseerError
from .paths import default_mountpoint
from .settingspec import (
    Meta,
    defaults_of,
    flag,
    integer,
    location,
    number,
    seconds_or,
    settings_of,
    size_gb,
    strings,
    text,
)


def _resolve(base_dir: Path, p: str) -> str:
    path = Path(os.path.expanduser(p))
    return str(path if path.is_absolute() else base_dir / path)


class Origin(Protocol):
    """What building a section may ask of the config besides the values: where a value came from."""

    base_dir: Path

    def is_set(self, section: str, key: str) -> bool: ...


# ---- the core sections (every capability reads them) -----------------------------------------------


@dataclass(frozen=True)
class StoreSettings:
    uri: str | None = text(
        None, "The store: file://, s3://, hdfs://, gs:// or a path (unset: a local store).", env=("BOOTSEER_STORE",)
    )
    cache_dir: Path | None = location(None, "The node-local blob cache (unset: the user cache directory).")
    cache_max_gb: float = size_gb(50.0, "Bound on the node cache; least recently used blobs go first.")
    domain: str | None = text(
        None, "Trust domain: refs are read and written under <domain>/ (unset: the job owner's user name).",
        pattern=r"[A-Za-z0-9._-]{1,64}", example="team-nlp",
    )  # fmt: skip

    def trust_domain(self) -> str:
        from .domains import default_domain

        return self.domain or default_domain()

    @property
    def cache_max_bytes(self) -> int:
        return int(self.cache_max_gb * 10**9)


@dataclass(frozen=True)
class ExecSettings:
    quiet: bool = flag(False, "No summary line.", env=("BOOTSEER_QUIET",))
    skip: tuple[str, ...] = strings((), "Stages not to run (see bootseer exec --help).")
    agent: bool = flag(True, "Start the agent that serves mounts, seeds and uploads after exec.")
    pass_store_credentials: bool = flag(
        False, "Hand the store's credentials and the signing key to the launcher (a job pushing checkpoints itself)."
    )


@dataclass(frozen=True)
class TrustSettings:
    read_from: tuple[str, ...] = strings((), "Other domains whose signed refs this job uses (e.g. CI's prewarm).")
    signing_key: Path | None = location(
        None,
        "Private key (0600, `bootseer trust keygen`) that signs what this process publishes: set it only where the "
        "domain's signer runs (CI's pre-warm, a site publisher), never on a node that runs jobs or the Slurm prolog.",
    )
    verify_keys: tuple[str, ...] = strings(
        (), "Public key files (the .pub of `bootseer trust keygen`) trusted, each for the domain it names."
    )
    verify: str | None = text(
        None, "'required': refuse unsigned refs; 'off': trust the store (unset: required when keys are set).",
        choices=("required", "off"),
    )  # fmt: skip

    @classmethod
    def derive(cls, values: dict[str, object], origin: Origin) -> None:
        """Key files are relative to the config file, as every path in it."""
        keys = values.get("verify_keys")
        if isinstance(keys, tuple):
            values["verify_keys"] = tuple(_resolve(origin.base_dir, k) for k in keys)


@dataclass(frozen=True)
class ReportSettings:
    gpus_per_node: int | None = integer(
        None, "GPUs per node for the report (unset: what the launcher said, else 8).", minimum=1
    )
    first_step: bool = flag(
        True, "Detect the first optimizer step in the launcher's Python processes (a sitecustomize on its PYTHONPATH)."
    )


# ---- the capabilities' sections ----------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSettings:
    enabled: bool = flag(False, "Record and replay the start's hot blocks (also on when record or roots is set).")
    ref: str | None = text(
        None, "The image, pinned by digest (unset: asked of the engine, else a fingerprint).", env=("BOOTSEER_IMAGE",)
    )
    roots: tuple[str, ...] | None = strings(
        None, "Trees whose reads are recorded (unset: the interpreter's prefixes, /lib*, /usr/lib*, CUDA)."
    )
    record: str = text(
        "auto",
        "When to record: 'auto' when there is no usable record, 'always' every start, 'never' (replay only).",
        choices=("auto", "always", "never"),
    )
    replay: str = text(
        "auto",
        "When to replay ('auto': not where the tree drops pages at open and its loader keeps no cache).",
        choices=("auto", "always", "never"),
    )
    ready: str | float = seconds_or(
        "quiet",
        "When a start is over: 'call' (bootseer_cli.ready(), else the first optimizer step), 'quiet' (the launcher's "
        "memory stops growing), or seconds.",
        choices=("call", "quiet"),
    )
    prefetch_threads: int = integer(64, "Streams at most for the replay.", minimum=1)
    prefetch_mbps: float = number(0.0, "Cap on the background replay (0: none).", unit="MB/s")
    foreground_s: float = number(10.0, "How long the replay may hold the launcher back.", unit="s")
    record_max_files: int = integer(
        1_000_000, "Files a record keeps at most (opens of more: the record says it is partial).", minimum=1
    )

    def wanted(self) -> bool:
        return self.enabled

    @classmethod
    def derive(cls, values: dict[str, object], origin: Origin) -> None:
        """The image stage runs only when asked: its first start evicts the roots' page cache and records.

        `enabled` decides when the user set it; else `record` or `roots` set by the user to a value other
        than the default turn it on. A key that restates its default (`bootseer init` writes a few) never does.
        """
        if origin.is_set("image", "enabled"):
            return
        defaults = defaults_of(cls)
        values["enabled"] = any(
            origin.is_set("image", key) and values[key] != defaults[key] for key in ("record", "roots")
        )


@dataclass(frozen=True)
class EnvSettings:
    setup: tuple[str, ...] = strings((), "The setup commands (pip install -r ...): what a snapshot captures.")
    files: tuple[str, ...] = strings((), "Files whose bytes are part of the env key, besides those the setup names.")
    roots: tuple[str, ...] | None = strings(
        None, "Trees the setup writes into (unset: the prefix of the interpreter bootseer runs in)."
    )
    extra_roots: tuple[str, ...] = strings((), "More trees to capture (compile caches, torch extensions).")
    key_env: tuple[str, ...] = strings((), "Environment variables whose values are part of the env key.")
    wait_s: float = number(600.0, "How long a node waits for another node's build of the same env.", unit="s")
    lease_ttl_s: float = number(
        60.0, "The builder's lease: another node builds this long after the builder died.", unit="s"
    )
    layers: bool = flag(
        True, "On a miss, set up over the nearest published snapshot and publish only the difference (a layer)."
    )
    max_layers: int = integer(8, "Layers a chain may grow to before the agent squashes it.", minimum=1)
    parent_search_s: float = number(
        15.0,
        "How long a miss may read the store's env refs for a parent; past it, the setup runs from the image.",
        unit="s",
    )
    mode: str = text(
        "extract",
        "How a snapshot reaches a fresh node: extracted into the roots, or its squashfs image mounted there.",
        choices=("extract", "mount"),
    )
    base_dir: Path = field(default_factory=Path.cwd)  # the config file's folder: relative paths resolve here

    def wanted(self) -> bool:
        return bool(self.setup)

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

    @classmethod
    def derive(cls, values: dict[str, object], origin: Origin) -> None:
        values["base_dir"] = origin.base_dir


@dataclass(frozen=True)
class CheckpointSettings:
    name: str | None = text(None, "The checkpoint to mount or pull (unset: none).")
    tag: str = text("latest", "Its tag.", pattern=r".+")
    mountpoint: str = field(
        default_factory=default_mountpoint,
        metadata={
            "setting": Meta(
                "path",
                "Where it is mounted (unset: each run its own private <runtime>/ckpt-<run id>, <runtime> being "
                "$XDG_RUNTIME_DIR/bootseer when that is the user's and 0700, /run/bootseer/0 for root). "
                "The launcher finds it in $BOOTSEER_CKPT_DIR.",
            )
        },
    )
    mode: str = text("mount", "Mount it through FUSE, or pull it to local disk.", choices=("mount", "pull"))
    targets: tuple[str, ...] = strings((), "Storage targets the stripes spread over (unset: the store).")
    stripes: int = integer(4, "Stripes a pushed checkpoint is cut into.", minimum=1)
    cell_size: int = integer(1 << 20, "Bytes dealt to one stripe at a time.", unit="B", minimum=1)
    allow_other: bool = flag(False, "FUSE allow_other: other local users may read the mount.")
    keep_local: bool = flag(
        True,
        "Keep what a run saved on the node after the write-back pushed it (one save per checkpoint), so "
        "a restart here reads it from local disk, not the store.",
    )

    def wanted(self) -> bool:
        return bool(self.name)


@dataclass(frozen=True)
class P2PSettings:
    enabled: bool = flag(False, "Fetch blobs from the job's swarm (libtorrent) before the store.")
    port: str = text(
        "6881-6891", "Port, or range of ports, to listen on.", pattern=r"\d{1,5}(-\d{1,5})?", example="6881-6891"
    )
    peers: tuple[str, ...] = strings((), "host:port of peers to try first.", env=("BOOTSEER_PEERS",))
    seed_s: float = number(
        300.0, "How long the agent seeds after the launcher started (it stops with the launcher).", unit="s"
    )
    origin_mbps: float = number(
        0.0, "Cap on what one origin node reads from the store for the swarm (0: none).", unit="MB/s"
    )
    deadline_s: float = number(
        30.0,
        "No progress from the swarm for this long (no peer, dead or corrupt ones): read the rest from the store.",
        unit="s",
    )
    host: str | None = text(None, "Address to listen on and announce (unset: the one that routes to the store).")
    listen: str | None = text(None, "Address the listener binds (unset: the announced one).")
    key_file: Path | None = location(
        None, "Per-job swarm secret, 0600 (unset: derived from [trust] signing_key; neither: no swarm)."
    )
    user: str = text("nobody", "Unprivileged user the swarm's libtorrent helper runs as when bootseer is root.")


@dataclass(frozen=True)
class CompileSettings:
    enabled: bool = flag(False, "Restore torch.compile caches for the compile key, and publish new ones.")
    cache_dir: Path | None = location(None, "Node-local compile caches (unset: under the user cache directory).")
    max_gb: float = size_gb(10.0, "Bound on the published cache (least recently used entries out first).")
    device: str | None = text(None, "The device kind in the key (unset: detected).")
    publish: bool = flag(True, "Publish what the run added.")
    python: Path | None = location(
        None, "The job's Python, whose torch the key names (unset: the launcher's, by its shebang or PATH)."
    )

    def wanted(self) -> bool:
        return self.enabled

    @property
    def max_bytes(self) -> int:
        return int(self.max_gb * 10**9)


CORE_SECTIONS: dict[str, type] = {
    "store": StoreSettings,
    "exec": ExecSettings,
    "trust": TrustSettings,
    "report": ReportSettings,
}


def section_classes() -> dict[str, type]:
    """Every settings section, by its name in bootseer.toml: the core ones, then one per capability row."""
    from .capabilities import CAPABILITIES, resolve

    out = dict(CORE_SECTIONS)
    for cap in CAPABILITIES:
        if cap.settings:
            out[cap.section_name] = resolve(cap.settings)
    return out


@dataclass(frozen=True)
class Settings:
    """Every section's settings, plus the config file they came from (for `-v`).

    The sections bootseer ships are typed attributes; a section added by a capability row that is not
    one of them (a test's toy capability, a plugin) is in `extra`; `section(name)` answers for both.
    """

    store: StoreSettings = field(default_factory=StoreSettings)
    exec: ExecSettings = field(default_factory=ExecSettings)
    image: ImageSettings = field(default_factory=ImageSettings)
    env: EnvSettings = field(default_factory=EnvSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    p2p: P2PSettings = field(default_factory=P2PSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    compile: CompileSettings = field(default_factory=CompileSettings)
    trust: TrustSettings = field(default_factory=TrustSettings)
    extra: Mapping[str, object] = field(default_factory=dict)
    config_path: Path | None = None

    def section(self, name: str) -> object:
        return getattr(self, name) if name in _TYPED else self.extra[name]

    def sections(self) -> dict[str, object]:
        return {**{n: getattr(self, n) for n in _TYPED}, **self.extra}

    @classmethod
    def from_config(cls, cfg: ConfigLike) -> Settings:
        typed: dict[str, object] = {}
        extra: dict[str, object] = {}
        for name, section_cls in section_classes().items():
            built = build_section(section_cls, name, cfg.values(name), cfg)
            (typed if name in _TYPED else extra)[name] = built
        return cls(**typed, extra=extra, config_path=cfg.path)  # type: ignore[arg-type]


# The sections with a field of their own above (the rest, a capability added by its row alone, go to `extra`).
_TYPED = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in ("extra", "config_path"))


class ConfigLike(Origin, Protocol):
    path: Path | None

    def values(self, section: str) -> dict[str, object]: ...


def build_section(cls: type, name: str, values: Mapping[str, object], origin: Origin) -> object:
    """One section from checked config values: lists become tuples, paths resolve against the config file's
    folder, and the class's own `derive` fills what follows from the others."""
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    out: dict[str, object] = {}
    for key, meta in settings_of(cls).items():
        v = values.get(key)
        if v is None:
            continue  # unset: the field's own default (or default factory) applies
        if meta.kind == "list" and isinstance(v, list | tuple):  # checked by config: a list of strings
            v = tuple(v)
        elif meta.kind == "path":
            resolved = _resolve(origin.base_dir, str(v))
            v = Path(resolved) if "Path" in types[key] else resolved
        out[key] = v
    derive = getattr(cls, "derive", None)
    if derive is not None:
        derive(out, origin)
    return cls(**out)


def _plain(v: object) -> object:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


def settings_doc(settings: Settings) -> dict[str, dict[str, object]]:
    """The settings as JSON-able sections, for the agent (agent.json): it gets what `exec` ran with
    instead of reading a config file again. The store URI is left out (it may carry credentials, which
    reach the agent through its environment only)."""
    doc: dict[str, dict[str, object]] = {}
    for name, section in settings.sections().items():
        doc[name] = {f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)}  # type: ignore[arg-type]
    doc["store"].pop("uri", None)
    doc["_"] = {"config_path": str(settings.config_path) if settings.config_path else None}
    return doc


def settings_from_doc(doc: Mapping[str, Mapping[str, object]], store_uri: str | None) -> Settings:
    """`settings_doc` read back, with the store URI from where the agent has it (its environment)."""
    typed: dict[str, object] = {}
    extra: dict[str, object] = {}
    for name, cls in section_classes().items():
        values = dict(doc.get(name, {}))
        if name == "store":
            values["uri"] = store_uri
        for f in dataclasses.fields(cls):
            v = values.get(f.name)
            if isinstance(v, list):
                values[f.name] = tuple(v)
            elif v is not None and "Path" in str(f.type):
                values[f.name] = Path(str(v))
        (typed if name in _TYPED else extra)[name] = cls(**values)
    path = doc.get("_", {}).get("config_path")
    return Settings(**typed, extra=extra, config_path=Path(str(path)) if path else None)  # type: ignore[arg-type]
