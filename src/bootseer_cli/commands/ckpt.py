"""`bootseer ckpt push|ls|rm|pull|mount|umount`: striped checkpoints (DESIGN.md section 6)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..units import count, fmt_bytes, fmt_rate, fmt_seconds
from .complete import checkpoint_refs
from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings

if TYPE_CHECKING:
    from ..settings import Settings
    from ..store.core import Store
    from ..stripe.layout import Manifest

app = typer.Typer(
    name="ckpt",
    help="Store checkpoints as interleaved stripes; pull or mount them at the aggregate bandwidth.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "mb": 1 << 20}
_UNITS |= {"g": 1 << 30, "gib": 1 << 30, "gb": 1 << 30}


def parse_size(text: str) -> int:
    """`1MiB`, `256KiB`, `4M`, `1048576` → bytes (binary units)."""
    from ..errors import ConfigError

    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"--cell-size {text!r}: use e.g. 1MiB, 256KiB or a number of bytes")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _open(ref: str, config: Path | None, store: str | None) -> tuple[Settings, Store, Manifest]:
    """(settings, store, manifest) for a NAME[:TAG|latest] reference: what pull, mount and rm start from."""
    from ..store.core import open_store_for
    from ..stripe.catalog import load_manifest
    from ..stripe.layout import parse_ref

    name, tag = parse_ref(ref)
    settings = load_settings(config, store)
    st = open_store_for(settings)
    return settings, st, load_manifest(st, name, tag)


@app.command()
def push(
    directory: Annotated[Path, typer.Argument(help="The checkpoint directory.")],
    name: Annotated[str, typer.Option("--name", "-n", help="Checkpoint name.")],
    tag: Annotated[str | None, typer.Option("--tag", "-t", help="Tag (default: a UTC timestamp).")] = None,
    stripes: Annotated[int | None, typer.Option("--stripes", "-k", help="Stripe count ([checkpoint] stripes).")] = None,
    cell_size: Annotated[str | None, typer.Option("--cell-size", help="Cell size, e.g. 1MiB.")] = None,
    target: Annotated[
        list[str] | None, typer.Option("--target", help="Stripe target URI (repeat; default: the store).")
    ] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Store DIRECTORY as NAME:TAG in the striped layout (uploads in parallel; manifest last)."""
    from ..ckpt import push_checkpoint
    from ..store.core import open_store_for
    from ..stripe.catalog import describe

    settings = load_settings(config, store)
    t0 = time.time()
    m = push_checkpoint(
        open_store_for(settings),
        settings.checkpoint,
        directory,
        name,
        tag,
        stripes=stripes,
        cell_size=parse_size(cell_size) if cell_size else None,
        targets=target or None,
    )
    if as_json:
        typer.echo(json.dumps(describe(m), indent=2))
    else:
        typer.echo(
            f"pushed {m.name}:{m.tag}: {count(len(m.files), 'file')}, {fmt_bytes(m.total_size)} in {m.k} stripes "
            f"({fmt_seconds(time.time() - t0)})"
        )


@app.command("ls")
def ls(
    name: Annotated[str | None, typer.Argument(help="Only this checkpoint's tags.")] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List checkpoints and their tags (newest last)."""
    from ..store.core import open_store_for
    from ..stripe.catalog import list_names, list_tags
    from ..stripe.layout import check_name

    st = open_store_for(load_settings(config, store))
    names = [check_name(name)] if name else list_names(st)
    rows = [e for n in names for e in list_tags(st, n)]
    if as_json:
        typer.echo(json.dumps([e.__dict__ for e in rows], indent=2))
        return
    if not rows:
        typer.echo("no checkpoints" + (f" named {name}" if name else ""))
        return
    for e in rows:
        if e.error:  # "unverified: <why>" (trust.py), else why the manifest cannot be read
            why = e.error if e.error.startswith("unverified") else f"unreadable: {e.error}"
            typer.echo(f"{e.name}:{e.tag}  ({why})")
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.created))
        typer.echo(f"{e.name}:{e.tag}  {fmt_bytes(e.size):>10}  {e.files} files  {e.stripes} stripes  {when} UTC")


def _emit(doc: dict[str, Any]) -> None:
    typer.echo(json.dumps(doc, indent=2))


@app.command("rm")
def rm(
    ref: Annotated[str, typer.Argument(help="NAME:TAG to remove.", autocompletion=checkpoint_refs)],
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove NAME:TAG (its manifest, then the stripes no other checkpoint uses)."""
    from ..errors import ConfigError
    from ..stripe.catalog import remove

    if ":" not in ref:
        raise ConfigError(f"rm {ref}: give NAME:TAG (or NAME:latest)")
    settings, st, m = _open(ref, config, store)
    n = remove(st, m.name, m.tag, list(settings.checkpoint.targets))
    if as_json:
        _emit({"removed": f"{m.name}:{m.tag}", "name": m.name, "tag": m.tag, "stripe_objects_deleted": n})
        return
    typer.echo(f"removed {m.name}:{m.tag} ({n} stripe objects deleted)")


def _options(memory_mib: int | None, threads: int | None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if memory_mib:
        opts["memory"] = memory_mib << 20
    if threads:
        opts["threads"] = threads
    return opts


MemoryOpt = Annotated[
    int | None, typer.Option("--memory", help="Memory bound for buffered cells, MiB (default 512).", min=8)
]
ThreadsOpt = Annotated[
    int | None, typer.Option("--threads", help="Fetch threads (default 16 per stripe, at most 64).", min=1)
]


@app.command()
def pull(
    ref: Annotated[str, typer.Argument(help="NAME[:TAG|latest].", autocompletion=checkpoint_refs)],
    dest: Annotated[Path, typer.Argument(help="Directory to create (appears complete or not at all).")],
    force: Annotated[bool, typer.Option("--force", "-f", help="Replace DEST if it exists.")] = False,
    memory: MemoryOpt = None,
    threads: ThreadsOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Copy a checkpoint to local disk, in parallel from all stripes, verified."""
    from ..progress import byte_bar
    from ..store.cache import cache_for
    from ..stripe.catalog import Targets
    from ..stripe.pull import pull as do_pull
    from ..stripe.reader import ReaderOptions

    settings, st, m = _open(ref, config, store)
    t0 = time.time()
    with byte_bar(m.total_size, f"pull {m.name}:{m.tag}") as advance:
        r = do_pull(
            m,
            Targets(st, list(settings.checkpoint.targets)),
            dest,
            replace=force,
            opts=ReaderOptions(**_options(memory, threads)),
            p2p=settings.p2p,
            cache=cache_for(settings.store),
            whole_stripes=settings.p2p.enabled,
            advance=advance,
        )
    took = time.time() - t0
    if as_json:
        doc = {"name": m.name, "tag": m.tag, "dest": str(r.dest), "bytes": r.bytes, "skipped": r.skipped}
        doc |= {"bytes_from_store": r.bytes_from_store, "bytes_from_peers": r.bytes_from_peers}
        _emit({**doc, "seconds": round(took, 3)})
        return
    if r.skipped:
        typer.echo(f"{r.dest} already holds {m.name}:{m.tag}")
    else:
        typer.echo(
            f"pulled {m.name}:{m.tag} to {r.dest}: {fmt_bytes(r.bytes)} in {fmt_seconds(took)} "
            f"({fmt_rate(r.bytes, took)})"
        )


@app.command()
def mount(
    ref: Annotated[str, typer.Argument(help="NAME[:TAG|latest].", autocompletion=checkpoint_refs)],
    mountpoint: Annotated[Path, typer.Argument(help="Where to mount it (created if missing).")],
    foreground: Annotated[bool, typer.Option("--foreground", help="Serve in this process until unmounted.")] = False,
    hide: Annotated[
        bool, typer.Option("--force", help="Mount over a non-empty directory (its files hidden until unmounted).")
    ] = False,
    memory: MemoryOpt = None,
    threads: ThreadsOpt = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Mount a checkpoint read-only (FUSE); detached unless --foreground. Undo with `ckpt umount`."""
    from ..stripe.catalog import Targets
    from ..stripe.mount import check_mountable, mount_detached, resolve_mountpoint, serve

    settings, st, m = _open(ref, config, store)
    targets = list(settings.checkpoint.targets)
    Targets(st, targets).check(m)  # the manifest's targets are not trusted: refused here, not in the server
    mp = resolve_mountpoint(mountpoint.expanduser())
    check_mountable(mp, hide_files=hide)
    allow_other = settings.checkpoint.allow_other
    if foreground:
        spec: dict[str, object] = {"manifest": m.to_doc(), "mountpoint": mp, "store_uri": st.uri_with_credentials()}
        spec["targets"] = targets
        spec.update(options=_options(memory, threads), allow_other=allow_other)
        raise typer.Exit(serve(spec))
    pid = mount_detached(
        m, mp, st.uri_with_credentials(), targets=targets, options=_options(memory, threads), allow_other=allow_other
    )
    if as_json:
        _emit({"mounted": f"{m.name}:{m.tag}", "name": m.name, "tag": m.tag, "mountpoint": mp, "pid": pid})
        return
    typer.echo(f"mounted {m.name}:{m.tag} at {mp} (server pid {pid}; `bootseer ckpt umount {mp}` to unmount)")


@app.command()
def umount(mountpoint: Annotated[Path, typer.Argument(help="The mount point.")], as_json: JsonOpt = False) -> None:
    """Unmount a checkpoint mount (also a stale one whose server died, or a job's writable view)."""
    from ..errors import BootseerError
    from ..stripe.mount import resolve_mountpoint
    from ..stripe.mount import umount as do_umount
    from ..stripe.overlay import umount_overlay

    mp = resolve_mountpoint(mountpoint.expanduser())
    # a writable view first: what the job wrote stays in its upper directory, pushed by the next start
    if not umount_overlay(mp) and not do_umount(mp):
        raise BootseerError(f"{mp} is not mounted")
    if as_json:
        _emit({"unmounted": mp})
        return
    typer.echo(f"unmounted {mp}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="ckpt")
