"""What the `bootseer ckpt` verbs do by hand: push, list, remove, pull, mount and unmount a checkpoint.

The stage (stage.py) and the agent tasks (agent_tasks.py) do the same work inside `bootseer exec`;
these are the one-shot forms, which take their settings from the command layer (commands/ckpt.py) and
return facts for it to print, so the command layer knows this one module of the package and none of
its parts. Each function imports what it uses when called: `ckpt ls` loads neither FUSE nor the reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..settings import Settings
    from ..store.core import Store
    from .catalog import Entry
    from .layout import Manifest
    from .pull import PullResult


def open_ref(settings: Settings, ref: str) -> tuple[Store, Manifest]:
    """(store, manifest) for a NAME[:TAG|latest] reference: what pull, mount and rm start from."""
    from ..store.core import open_store_for
    from .catalog import load_manifest
    from .layout import parse_ref

    name, tag = parse_ref(ref)
    st = open_store_for(settings)
    return st, load_manifest(st, name, tag)


def push_here(
    settings: Settings,
    directory: Path,
    name: str,
    tag: str | None,
    *,
    stripes: int | None = None,
    cell_size: int | None = None,
    targets: list[str] | None = None,
) -> Manifest:
    """Store `directory` as NAME:TAG in the striped layout, as the Python API (`bootseer_cli.ckpt`) does."""
    from ..ckpt import push_checkpoint
    from ..store.core import open_store_for

    store = open_store_for(settings)
    return push_checkpoint(
        store, settings.checkpoint, directory, name, tag, stripes=stripes, cell_size=cell_size, targets=targets
    )


def describe(m: Manifest) -> dict[str, Any]:
    """A manifest as the JSON `ckpt push --json` prints."""
    from .catalog import describe as describe_manifest

    return describe_manifest(m)


def list_here(settings: Settings, name: str | None) -> list[Entry]:
    """Every checkpoint's tags (or only NAME's), newest last."""
    from ..store.core import open_store_for
    from .catalog import list_names, list_tags
    from .layout import check_name

    st = open_store_for(settings)
    names = [check_name(name)] if name else list_names(st)
    return [e for n in names for e in list_tags(st, n)]


def remove_here(settings: Settings, ref: str) -> tuple[Manifest, int]:
    """Remove NAME:TAG: (its manifest, the number of stripe objects no other checkpoint used)."""
    from .catalog import remove

    st, m = open_ref(settings, ref)
    return m, remove(st, m.name, m.tag, list(settings.checkpoint.targets))


@dataclass(frozen=True)
class Pulled:
    """A checkpoint copied to local disk: which one, and what the copy read from where."""

    manifest: Manifest
    result: PullResult


def pull_here(settings: Settings, ref: str, dest: Path, *, replace: bool, options: dict[str, Any]) -> Pulled:
    """Copy NAME[:TAG] to `dest` from all stripes, verified, with a byte bar on a terminal."""
    from ..progress import byte_bar
    from ..store.cache import cache_for
    from .catalog import Targets
    from .pull import pull
    from .reader import ReaderOptions

    st, m = open_ref(settings, ref)
    with byte_bar(m.total_size, f"pull {m.name}:{m.tag}") as advance:
        r = pull(
            m,
            Targets(st, list(settings.checkpoint.targets)),
            dest,
            replace=replace,
            opts=ReaderOptions(**options),
            p2p=settings.p2p,
            cache=cache_for(settings.store),
            whole_stripes=settings.p2p.enabled,
            advance=advance,
        )
    return Pulled(m, r)


@dataclass(frozen=True)
class Mounted:
    """A checkpoint mounted read-only at `mountpoint` by a detached server (`pid`)."""

    manifest: Manifest
    mountpoint: str
    pid: int


def mount_here(
    settings: Settings, ref: str, mountpoint: Path, *, hide: bool, options: dict[str, Any], foreground: bool
) -> Mounted | int:
    """Mount NAME[:TAG] read-only (FUSE): detached (a `Mounted`), or served here until unmounted (its exit code).

    The manifest's targets are not trusted: one outside the configured targets is refused here, before
    any server starts."""
    from .catalog import Targets
    from .mount import check_mountable, mount_detached, resolve_mountpoint, serve

    st, m = open_ref(settings, ref)
    targets = list(settings.checkpoint.targets)
    Targets(st, targets).check(m)
    mp = resolve_mountpoint(mountpoint.expanduser())
    check_mountable(mp, hide_files=hide)
    allow_other = settings.checkpoint.allow_other
    if foreground:
        spec: dict[str, object] = {"manifest": m.to_doc(), "mountpoint": mp, "store_uri": st.uri_with_credentials()}
        spec.update(targets=targets, options=options, allow_other=allow_other)
        return serve(spec)
    pid = mount_detached(m, mp, st.uri_with_credentials(), targets=targets, options=options, allow_other=allow_other)
    return Mounted(m, mp, pid)


def umount_here(mountpoint: Path) -> str:
    """Unmount a checkpoint mount (a stale one too, or a job's writable view); returns the mount point."""
    from .mount import resolve_mountpoint, umount
    from .overlay import umount_overlay

    mp = resolve_mountpoint(mountpoint.expanduser())
    # a writable view first: what the job wrote stays in its upper directory, pushed by the next start
    if not umount_overlay(mp) and not umount(mp):
        raise BootseerError(f"{mp} is not mounted")
    return mp
