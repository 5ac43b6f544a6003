"""`bootseer hot record|replay|show`: the hot-block record of this image, by hand (e.g. in CI)."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from .options import ConfigOpt, JsonOpt, StoreOpt, load_config

hot = typer.Typer(help="Hot-block record and replay of this image's start.", no_args_is_help=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@hot.command(
    "record",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False},
)
def record(
    command: Annotated[list[str] | None, typer.Argument(help="The command whose start to record, after --.")] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    roots: Annotated[
        list[str] | None, typer.Option("--root", help="A root to record (repeat); default [image] roots.")
    ] = None,
    ready: Annotated[str | None, typer.Option("--ready", help='End of start: "call", "quiet" or seconds.')] = None,
) -> None:
    """Evict the roots, run COMMAND, record what its start read, publish it; exits with COMMAND's code."""
    from ..errors import BootseerError
    from ..hotblocks.ops import record_command

    if not command:
        raise BootseerError("no command given: bootseer hot record [OPTIONS] -- COMMAND [ARGS]…", 2)
    out = record_command(load_config(config, store), list(command), roots, ready)
    if out.doc is None:
        typer.echo(
            f"bootseer: nothing resident under the roots at the end of the start ({out.why}); nothing recorded",
            err=True,
        )
    else:
        d = out.doc
        typer.echo(
            f"bootseer: recorded {d['files']} files, {d['extents']} extents, {_mb(d['bytes'])} "
            f"of {_mb(d['roots_bytes'])} under the roots ({out.why}); record {d['blob'][:12]}",
            err=True,
        )
    raise typer.Exit(out.exit_code)


@hot.command("replay")
def replay(
    config: ConfigOpt = None,
    store: StoreOpt = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="Reader threads (default [image] prefetch_threads).")
    ] = None,
    mbps: Annotated[float | None, typer.Option("--mbps", help="Bandwidth cap in MB/s (0: none).")] = None,
    json_: JsonOpt = False,
) -> None:
    """Read this image's recorded hot blocks now, into the page cache."""
    from ..hotblocks.ops import replay_now

    res, doc = replay_now(load_config(config, store), threads, mbps)
    out = {
        "record": doc.get("blob"),
        "bytes_read": res.bytes_read,
        "extents": res.extents_done,
        "files": res.files,
        "stale_files": len(res.staleness.stale_files),
        "stale_bytes": res.staleness.stale_bytes,
        "errors": res.errors,
        "seconds": round(res.seconds, 3),
    }
    if json_:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(
        f"replayed {_mb(res.bytes_read)} from {res.files} files in {res.seconds:.2f} s; "
        f"{out['stale_files']} stale file(s) skipped" + (f", {res.errors} read error(s)" if res.errors else "")
    )


@hot.command("show")
def show(config: ConfigOpt = None, store: StoreOpt = None, json_: JsonOpt = False) -> None:
    """Describe this image's record: files, bytes, share of the roots, staleness."""
    from ..hotblocks.ops import describe

    d = describe(load_config(config, store))
    if json_:
        typer.echo(json.dumps(d, indent=2))
        return
    if d["record"] is None:
        typer.echo(f"no hot-block record for image {d['image_key'][:16]}")
        raise typer.Exit(1)
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d["created"]))
    typer.echo(f"image {d['image_key'][:16]}  record {d['record'][:12]}  taken {created} on {d['creator']}")
    typer.echo(f"roots: {', '.join(d['roots'])}")
    typer.echo(
        f"{d['files']} files, {d['extents']} extents, {_mb(d['bytes'])} "
        f"= {d['share_of_roots']:.1%} of {_mb(d['roots_bytes'])} under the roots ({d['roots_files']} files)"
    )
    typer.echo(f"stale now: {d['stale_files']} file(s), {_mb(d['stale_bytes'])} ({d['stale_share']:.0%} of the record)")
    for f in d["top_files"]:
        typer.echo(f"  {_mb(f['bytes']):>10}  {f['path']}")


def register(app: typer.Typer) -> None:
    app.add_typer(hot, name="hot")
