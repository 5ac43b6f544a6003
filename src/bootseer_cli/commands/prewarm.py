"""`bootseer prewarm`: publish an image's env snapshot and hot-block record from CI, through the Docker engine."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..cli import ConfigOpt, JsonOpt, StoreOpt, load_config


def prewarm(
    image: Annotated[str, typer.Option("--image", help="The job's image (tag or name@sha256:…).")],
    config: ConfigOpt = None,
    store: StoreOpt = None,
    probe: Annotated[
        str | None,
        typer.Option("--probe", help="Command whose start to record, e.g. \"python -c 'import torch'\"."),
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Run the setup in a container of IMAGE, publish its snapshot and the probe's hot blocks, print the keys."""
    from ..containers.prewarm import prewarm as run

    out = run(load_config(config, store), image, probe)
    if json_:
        typer.echo(json.dumps(out.as_dict(), indent=2, sort_keys=True))
        return
    typer.echo(f"image      {out.image.pinned}  ({out.image.source})")
    typer.echo(f"image_key  {out.image_key}")
    if out.env_key:
        ref = out.env_ref or {}
        what = "already there" if out.env_was_there else "published"
        blob = ref.get("blob") or ref.get("digest") or "?"
        size = f", {ref['size'] / 1e6:.1f} MB" if isinstance(ref.get("size"), int) else ""
        typer.echo(f"env_key    {out.env_key}  snapshot {what}: {blob}{size}")
    if out.hot_ref is not None:
        typer.echo(f"hot record published: {out.hot_ref.get('blob', '?')} for image_key {out.image_key[:16]}")
    for note in out.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"In the job: BOOTSEER_IMAGE={out.image.pinned}")


def register(app: typer.Typer) -> None:
    app.command("prewarm")(prewarm)
