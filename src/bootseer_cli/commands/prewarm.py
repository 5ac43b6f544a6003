"""`bootseer prewarm`: publish an image's env snapshot and hot-block record from CI, through the Docker engine."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..units import fmt_bytes
from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings


def prewarm(
    image: Annotated[str, typer.Option("--image", help="The job's image (tag or name@sha256:…).")],
    config: ConfigOpt = None,
    store: StoreOpt = None,
    probe: Annotated[
        str | None,
        typer.Option("--probe", help="Command whose start to record, e.g. \"python -c 'import torch'\"."),
    ] = None,
    network: Annotated[
        bool,
        typer.Option(
            "--network",
            help="Run the containers on the host's network even with a local store (a setup that downloads).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the setup in a container of IMAGE, publish its snapshot and the probe's hot blocks, print the keys."""
    from ..containers.prewarm import prewarm as run

    out = run(load_settings(config, store), image, probe, host_network=network)
    if as_json:
        typer.echo(json.dumps(out.as_dict(), indent=2, sort_keys=True))
        return
    typer.echo(f"image      {out.image.pinned}  ({out.image.source})")
    typer.echo(f"image_key  {out.image_key}")
    if out.env_key:
        ref = out.env_ref or {}
        what = "already there" if out.env_was_there else "published"
        blob = ref.get("blob") or ref.get("digest") or "?"
        size = f", {fmt_bytes(ref['size'])}" if isinstance(ref.get("size"), int) else ""
        typer.echo(f"env_key    {out.env_key}  snapshot {what}: {blob}{size}")
    if out.hot_ref is not None:
        typer.echo(f"hot record published: {out.hot_ref.get('blob', '?')} for image_key {out.image_key[:16]}")
    for note in out.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"In the job: BOOTSEER_IMAGE={out.image.pinned}")


def prefetch(
    config: ConfigOpt = None,
    store: StoreOpt = None,
    cache_dir: Annotated[
        str | None, typer.Option("--cache-dir", help="Node cache to fill (default [store] cache_dir).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fetch this job's env snapshot, hot-block record and checkpoint stripes into the node cache (hooks)."""
    from ..containers.prefetch import prefetch as run

    out = run(load_settings(config, store, store__cache_dir=cache_dir))
    if as_json:
        typer.echo(json.dumps(out.as_dict(), indent=2))
    else:
        for i in out.items:
            size = f"{i.blobs} blob(s), {fmt_bytes(i.bytes)} ({fmt_bytes(i.bytes_from_store)} from the store)"
            typer.echo(f"{i.what:10} {i.status:7} {i.key[:24]:24} {size if i.blobs else i.detail}")
        typer.echo(f"node cache: {out.cache_dir}")
    if any(i.status == "failed" for i in out.items):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("prewarm")(prewarm)
    app.command("prefetch")(prefetch)
