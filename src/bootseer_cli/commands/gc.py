"""`bootseer gc`: give the store's space back (as `docker system prune` does for docker's), by keep policies.

The policies and the safety rules (leases, refs, a second look before blobs go) are in `bootseer_cli.gc`;
this verb parses the options, prints the plan or the result, and removes this node's old run directories.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from ..units import fmt_age, fmt_bytes, fmt_seconds
from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings

if TYPE_CHECKING:
    from ..gc import Plan

# gc's own kinds; the capabilities' come from their rows (`Capability.gc_kinds`)
_KINDS = {
    "events": "event files",
    "blob": "unreferenced blobs",
    "run": "run directories (this node)",
}


def gc(
    keep_days: Annotated[
        float,
        typer.Option("--keep-days", metavar="DAYS", help="Keep what was used or written within DAYS."),
    ] = 30.0,
    keep_tags: Annotated[
        int, typer.Option("--keep-tags", metavar="K", help="Keep the newest K tags of each checkpoint name.")
    ] = 5,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would go and the space freed.")] = False,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove from the store what the keep policies let go, then the blobs nothing names any more."""
    from .. import gc as gclib
    from ..paths import runs_dir
    from ..store.core import open_store_for

    policy = gclib.Policy(keep_days=keep_days, keep_tags=keep_tags)
    settings = load_settings(config, store)
    st = open_store_for(settings)
    plan = gclib.plan(st, policy, runs_root=runs_dir())
    if not dry_run:
        plan = gclib.apply(st, plan, list(settings.checkpoint.targets))
    if as_json:
        doc = {"store": st.uri, "dry_run": dry_run, "keep_days": keep_days, "keep_tags": keep_tags}
        doc |= {"freed_bytes": plan.freed_bytes, "removed": [d.as_json() for d in plan.doomed], "held": plan.held}
        doc["kept_bytes"] = plan.kept_bytes
        doc["kept"] = {why: {"blobs": n, "bytes": b} for why, (n, b) in plan.kept.items()}
        doc["kept_refs"] = [k.as_json() for k in plan.kept_refs]
        typer.echo(json.dumps(doc, indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    names = [d.name for d in plan.doomed] + [k.name for k in plan.kept_refs]
    width = max(map(len, names), default=0)  # whole names (issue 46)
    for d in plan.doomed:
        used = f", idle {fmt_age(d.last_used, policy.now)}" if d.last_used else ""
        typer.echo(f"{verb} {d.kind:7} {d.name:{width}} {fmt_bytes(d.bytes):>9}{used}")
    for k in plan.kept_refs:
        used = f", last used {fmt_age(k.last_used, policy.now)} ago" if 0 < k.last_used <= policy.now else ""
        typer.echo(f"keep {k.kind:7} {k.name:{width}} {k.why}{used}")
    from ..capabilities import gc_kinds

    words = {**_KINDS, **gc_kinds()}
    for kind, (n, size) in plan.by_kind().items():
        typer.echo(f"{words.get(kind, kind)}: {n}, {fmt_bytes(size)}")
    for why in plan.held:
        typer.echo(f"kept: {why}")
    freed = "would free" if dry_run else "freed"
    typer.echo(f"{freed} {fmt_bytes(plan.freed_bytes)} in {len(plan.doomed)} item(s) from {st.uri}")
    _kept_line(plan, policy.grace_s)


def _kept_line(plan: Plan, grace_s: float) -> None:
    """Where the space that stays is, and why: `kept 12 blob(s), 1.2 GB: 10 (1.1 GB) named by a ref, …`."""
    from ..gc import KEPT_REASONS

    if not plan.kept:
        typer.echo("kept no blobs")
        return
    n = sum(c for c, _ in plan.kept.values())
    parts = []
    for why, label in KEPT_REASONS.items():
        if why in plan.kept:
            c, b = plan.kept[why]
            age = f"{grace_s / 3600:g} h" if grace_s >= 3600 else fmt_seconds(grace_s)
            grace = f" ({age})" if why == "grace" else ""
            parts.append(f"{c} ({fmt_bytes(b)}) {label}{grace}")
    typer.echo(f"kept {n} blob(s), {fmt_bytes(plan.kept_bytes)}: " + ", ".join(parts))


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)
