"""`bootseer trust`: the keys that sign and verify refs, and what this node trusts (trust.py says why)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings

trust_app = typer.Typer(
    help="Sign what you publish and trust only what your domain signed (keys, domains).",
    no_args_is_help=True,
)


@trust_app.command("keygen")
def keygen(
    domain: Annotated[str, typer.Option("--domain", "-d", metavar="NAME", help="The domain the key signs for.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="PREFIX", help="Writes PREFIX.key (private, 0600) and PREFIX.pub.")
    ],
) -> None:
    """Write a new Ed25519 key pair: keep PREFIX.key where only the domain's signer (CI's pre-warm secret,
    or a publisher of the site's own) can read it, never on a node that runs jobs (not the Slurm prolog,
    a batch job or a pod); give PREFIX.pub to every reader of the domain ([trust] verify_keys).
    docs/trust.md shows the setup per team."""
    from ..trust import keygen as make

    kid = make(f"{out}.key", f"{out}.pub", domain)
    typer.echo(f"wrote {out}.key (private, 0600) and {out}.pub: key {kid} for domain {domain}")


@trust_app.command("show")
def show(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """What this node trusts: its domain, the domains it reads, its keys, and whether refs are checked."""
    import json

    from ..trust import describe, trust_for

    t = trust_for(load_settings(config, store))
    _, detail, fix = describe(t)
    if as_json:
        keys = {kid: v.domain for kid, v in t.verifiers.items()}
        doc = {"domain": t.domain, "reads": list(t.domains), "verify_keys": keys, "required": t.required}
        typer.echo(json.dumps(doc | {"signing_key": t.signer.kid if t.signer else None}, indent=2))
        return
    typer.echo(detail)
    for kid, v in sorted(t.verifiers.items()):
        typer.echo(f"  trusts key {kid} for domain {v.domain}")
    if fix:
        typer.echo(f"fix: {fix}")


def register(app: typer.Typer) -> None:
    app.add_typer(trust_app, name="trust")
