"""`bootseer report`: where each node's startup time went, as a table, JSON, an SVG timeline or an HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a temporary name in the same directory, then a rename."""
    import os
    import tempfile

    from ..errors import BootseerError

    tmp: Path | None = None
    try:  # O_EXCL under an unguessable name: never a link planted at a predictable one
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent or ".")
        tmp = Path(name)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise BootseerError(f"cannot write {path}: {e.strerror or e}") from None


def report(
    job: Annotated[str | None, typer.Option("--job", help="The job to report (its BOOTSEER_JOB_ID).")] = None,
    last: Annotated[bool, typer.Option("--last", help="The job with the most recent event (the default).")] = False,
    since: Annotated[
        str | None, typer.Option("--since", help="Across jobs over this window instead, e.g. 7d, 12h.")
    ] = None,
    start: Annotated[
        int | None, typer.Option("--start", min=1, help="Which start of a restarted job (default: the latest).")
    ] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Also write a self-contained HTML page here.")] = None,
    svg: Annotated[Path | None, typer.Option("--svg", help="Also write the SVG timeline here.")] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", min=1, help="GPUs per node (default: what the launcher said).")
    ] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where the startup time of a job went: per-stage p50/p90/max, hits, stragglers, GPU time wasted."""
    from ..errors import ConfigError
    from ..report import analysis, load, page, text
    from ..report.svg import timeline_svg
    from ..store.core import open_store_for

    if job and last:
        raise ConfigError("--job and --last: give one of them")
    if since and (job or last or start):
        raise ConfigError("--since reports across jobs: it does not take --job, --last or --start")
    if since and svg:
        raise ConfigError("--svg draws one job's timeline: use it without --since")
    settings = load_settings(config, store)
    configured = settings.report.gpus_per_node  # None unless set: then the launcher's own count wins
    st = open_store_for(settings)
    if since:
        seconds = load.parse_since(since)
        trend = analysis.analyze_trend(load.load_since(st, seconds), seconds, gpus_per_node, configured)
        if html:
            _write(html, page.trend_html(trend))
        typer.echo(text.to_json(trend) if as_json else text.trend_text(trend))
        return
    name = job or load.last_job(st)
    result = analysis.analyze_job(
        load.load_job(st, name),
        name,
        gpus_flag=gpus_per_node,
        gpus_configured=configured,
        attempt=start,
        store_uri=st.uri,
    )
    if html:
        _write(html, page.job_html(result))
    if svg:
        _write(svg, timeline_svg(result))
    typer.echo(text.to_json(result) if as_json else text.job_text(result))


def register(app: typer.Typer) -> None:
    app.command("report")(report)
