"""`bootseer cache info|prune`: the node's blob cache, shown and trimmed by hand (as `uv cache prune`,
`pip cache` and `docker system df/prune` do for theirs).

The cache bounds itself on every fetch ([store] cache_max_gb, least recently used out first); these verbs
are for the operator who wants to see what it holds, or to give disk back now (a smaller bound, or all of
it). Removing a blob is always safe: the next start fetches it again from the store. A blob a running
process has open stays readable (POSIX unlink), so a prune never breaks a start in progress.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..units import fmt_age, fmt_bytes
from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings

if TYPE_CHECKING:
    from ..store.cache import BlobCache

cache = typer.Typer(help="The node's blob cache: what it holds, and trimming it.", no_args_is_help=True)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_UNITS = {"": 1, "b": 1}
_UNITS |= {f"{p}{s}": 1000**i for i, p in enumerate("kmgt", 1) for s in ("", "b")}
_UNITS |= {f"{p}{s}": 1024**i for i, p in enumerate("kmgt", 1) for s in ("i", "ib")}


def parse_size(text: str) -> int:
    """`0`, `500MB`, `20G`, `1.5TB` (decimal, as bootseer prints sizes), `8GiB` (binary) -> bytes."""
    from ..errors import ConfigError

    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ConfigError(f"--max-size {text!r}: expected a size such as 20GB, 500MB, 8GiB or 0")
    return int(float(m.group(1)) * _UNITS[unit])


def _node_cache(config: Path | None, store: str | None) -> BlobCache:
    from ..store.cache import cache_for

    return cache_for(load_settings(config, store).store, degrade=False)  # the configured one, as it is


@cache.command("info")
def info(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Where the node cache is, how many blobs it holds, their size against the bound, their ages."""
    c = _node_cache(config, store)
    entries = c.entries()
    total = sum(size for _, size, _ in entries)
    oldest = min((t for t, _, _ in entries), default=None)
    # Entries hard-linked with the local store are one copy on disk: counted once, under the store.
    linked, linked_bytes = c.linked()
    from ..stripe.kept import usage

    kept, kept_bytes = usage()
    if as_json:
        doc = {"dir": str(c.root), "blobs": len(entries), "bytes": total, "max_bytes": c.max_bytes}
        doc |= {"linked": linked, "linked_bytes": linked_bytes, "disk_bytes": total - linked_bytes}
        doc |= {"kept_checkpoints": kept, "kept_checkpoint_bytes": kept_bytes}
        typer.echo(json.dumps(doc | {"least_recent_use": oldest}, indent=2))
        return
    typer.echo(f"dir     {c.root}")
    typer.echo(f"blobs   {len(entries)}")
    typer.echo(f"size    {fmt_bytes(total)} of {fmt_bytes(c.max_bytes)} ([store] cache_max_gb)")
    if linked:
        typer.echo(f"linked  {linked} blob(s), {fmt_bytes(linked_bytes)} shared with the local store (one copy)")
        typer.echo(f"disk    {fmt_bytes(total - linked_bytes)} beyond the store's copies")
    if oldest is not None:
        typer.echo(f"oldest  last used {fmt_age(oldest)} ago")
    if kept:
        typer.echo(f"kept    {kept} checkpoint save(s), {fmt_bytes(kept_bytes)}: a restart here reads them locally")


def _plan(c: BlobCache, max_bytes: int) -> list[tuple[int, Path]]:
    """The blobs an eviction down to max_bytes removes: least recently used first, as BlobCache.evict."""
    entries = sorted(c.entries())
    total = sum(size for _, size, _ in entries)
    out = []
    for _, size, p in entries:
        if total <= max_bytes:
            break
        out.append((size, p))
        total -= size
    return out


@cache.command("prune")
def prune(
    max_size: Annotated[
        str | None,
        typer.Option("--max-size", metavar="SIZE", help="Trim to this size, e.g. 20GB or 0 (default: the bound)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would go, remove nothing.")] = False,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove least recently used blobs until the cache fits SIZE; the next start refetches what it needs.
    With SIZE 0, also the checkpoint saves kept on this node that no running job uses."""
    from ..store.cache import BlobCache

    c = _node_cache(config, store)
    limit = parse_size(max_size) if max_size is not None else c.max_bytes
    plan = _plan(c, limit)
    # an entry hard-linked with the local store frees nothing on disk: only a last link counts (issue 46)
    shared = [size for size, p in plan if _links(p) > 1]
    freed = sum(size for size, _ in plan) - sum(shared)
    left = c.total_bytes() - sum(size for size, _ in plan)
    if not dry_run:
        freed = BlobCache(c.root, limit).evict()
        left = c.total_bytes()
    kept = _prune_kept(dry_run) if limit == 0 else (0, 0)  # to nothing: the kept checkpoint saves go too
    if as_json:
        doc = {"dry_run": dry_run, "removed": len(plan), "freed_bytes": freed, "left_bytes": left}
        doc |= {"kept_checkpoints_removed": kept[0], "kept_checkpoint_bytes_freed": kept[1]}
        typer.echo(json.dumps(doc | {"shared": len(shared), "max_bytes": limit}, indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    also = f" ({len(shared)} of them shared with the local store, which keeps them)" if shared else ""
    typer.echo(
        f"{verb} {len(plan)} blob(s), {fmt_bytes(freed)} freed{also}; {fmt_bytes(left)} left (max {fmt_bytes(limit)})"
    )
    if kept[0]:
        typer.echo(f"{verb} {kept[0]} kept checkpoint save(s), {fmt_bytes(kept[1])} (none a running job uses)")


def _prune_kept(dry_run: bool) -> tuple[int, int]:
    from ..stripe.kept import drop_unheld, usage

    return usage() if dry_run else drop_unheld()


def _links(p: Path) -> int:
    try:
        return os.lstat(p).st_nlink
    except OSError:
        return 1


def register(app: typer.Typer) -> None:
    app.add_typer(cache, name="cache")
