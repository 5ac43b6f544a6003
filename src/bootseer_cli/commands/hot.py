"""`bootseer hot record|replay|show`: the hot-block record of this image, by hand (e.g. in CI)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..units import fmt_bytes, fmt_seconds, fmt_time
from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings

if TYPE_CHECKING:
    from ..settings import Settings

hot = typer.Typer(help="Hot-block record and replay of this image's start.", no_args_is_help=True)


def _image_key(settings: Settings) -> str:
    """This image's key (computed only when an action needs it: it may ask the Docker engine)."""
    from ..identity import keys_for

    return keys_for(settings).image.digest


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
    from ..hotblocks.actions import record_command

    if not command:
        raise BootseerError("no command given: bootseer hot record [OPTIONS] -- COMMAND [ARGS]…", 2)
    settings = load_settings(config, store)
    out = record_command(settings, lambda: _image_key(settings), list(command), roots, ready)
    if out.doc is None:
        typer.echo(
            f"bootseer: nothing resident under the roots at the end of the start ({out.why}); nothing recorded",
            err=True,
        )
    else:
        d = out.doc
        typer.echo(
            f"bootseer: recorded {d['files']} files, {d['extents']} extents, {fmt_bytes(d['bytes'])} "
            f"of {fmt_bytes(d['roots_bytes'])} under the roots ({out.why}); record {d['blob'][:12]}"
            + (f"; coverage {d['coverage']}" if d.get("coverage", "full") != "full" else ""),
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
    as_json: JsonOpt = False,
) -> None:
    """Read this image's recorded hot blocks now, into the page cache."""
    from ..hotblocks.actions import replay_now

    settings = load_settings(config, store)
    res, doc = replay_now(settings, _image_key(settings), threads, mbps)
    out = {
        "record": doc.get("blob"),
        "bytes_read": res.bytes_read,
        "extents": res.extents_done,
        "files": res.files,
        "stale_files": len(res.staleness.stale_files),
        "stale_bytes": res.staleness.stale_bytes,
        "errors": res.errors,
        "seconds": round(res.seconds, 3),
        "streams": res.streams,
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(
        f"replayed {fmt_bytes(res.bytes_read)} from {res.files} files in {fmt_seconds(res.seconds)}; "
        f"{out['stale_files']} stale file(s) skipped"
        + (f", {res.errors} read error(s)" if res.errors else "")
        + (f"; streams at once {' → '.join(map(str, res.streams))}" if res.streams else "")
    )


@hot.command("show")
def show(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Describe this image's record: files, bytes, share of the roots, staleness."""
    from ..hotblocks.actions import describe

    settings = load_settings(config, store)
    d = describe(settings, _image_key(settings))
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    if d["record"] is None:
        typer.echo(f"no hot-block record for image {d['image_key'][:16]}")
        if d.get("last_empty"):
            typer.echo(f"the last record was empty: {d['last_empty'].get('why')}")
        raise typer.Exit(1)
    _print_record(d)


def _print_record(d: dict[str, Any]) -> None:
    """The text form of `hot show` for an existing record."""
    typer.echo(
        f"image {d['image_key'][:16]}  record {d['record'][:12]}  taken {fmt_time(d['created'])} on {d['creator']}"
    )
    typer.echo(f"roots: {', '.join(d['roots'])}")
    typer.echo(
        f"{d['files']} files, {d['extents']} extents, {fmt_bytes(d['bytes'])} "
        f"= {d['share_of_roots']:.1%} of {fmt_bytes(d['roots_bytes'])} under the roots ({d['roots_files']} files)"
    )
    typer.echo(
        f"stale now: {d['stale_files']} file(s), {fmt_bytes(d['stale_bytes'])} ({d['stale_share']:.0%} of the record)"
    )
    if d.get("coverage", "full") != "full":
        typer.echo(f"coverage: {d['coverage']} (opens the recording lost; published all the same)")
    if d["method"] != "mincore":
        typer.echo(f"taken as: {d['method']} (the tree drops pages at every open: whole files the start opened)")
    r = d["replay"]
    if r["off"]:
        typer.echo(f"replay: OFF for this image until the record changes: {r['why']}")
    else:
        typer.echo(
            f"replay: on (starts to ready: recording {r['recording_s'] or '-'} s, with {r['with_s'] or '-'} s, "
            f"without {r['without_s'] or '-'} s)"
        )
    for f in d["top_files"]:
        typer.echo(f"  {fmt_bytes(f['bytes']):>10}  {f['path']}")


def register(app: typer.Typer) -> None:
    app.add_typer(hot, name="hot")
