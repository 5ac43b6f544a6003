"""`bootseer trust`: the keys that sign and verify refs, and what this node trusts (trust.py says why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings

if TYPE_CHECKING:
    from ..resign import Signing

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


@trust_app.command("sign")
def sign(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check every blob and list what would be signed; write nothing.")
    ] = False,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Sign your domain's unsigned refs after checking their blobs, so that verifying starts use them again.

    For a store filled before signing was on: a start that requires signatures refuses its refs and says
    how many, naming this command. It signs with [trust] signing_key, and only refs of the own domain
    ([store] domain) that carry no signature: env snapshots, hot-block records, compile-cache shards,
    torrents, checkpoint manifests and their latest hints. Each is signed only after every blob it names
    has been read back and hashed to its address; a ref whose blob is missing or altered is reported and
    stays unsigned, as does one whose signature does not verify (a forgery, or another key's). Signing
    vouches for what unsigned writers put there: run it over a store that only your own jobs wrote. Each
    ref is replaced atomically, and only if unchanged since it was checked. Exit status 1 when a ref was
    refused. Run it where the key is (CI's pre-warm, the domain's publisher), never in a job.
    """
    from ..resign import Outcome, sign_domain

    def say(o: Outcome) -> None:
        if o.status in ("refused", "left", "gone") and not as_json:
            typer.echo(f"{'not signed' if o.status != 'gone' else 'skipped'}: {o.rel}: {o.why}", err=True)

    done = sign_domain(load_settings(config, store), dry_run=dry_run, on=say)
    refused = done.having("refused")
    if as_json:
        rows = [{"ref": o.rel, "status": o.status, "why": o.why or None} for o in done.outcomes]
        typer.echo(json.dumps({"domain": done.domain, "dry_run": dry_run, "refs": rows}, indent=2))
    else:
        typer.echo(_sign_summary(done, dry_run))
    if refused:
        raise typer.Exit(1)


def _sign_summary(done: Signing, dry_run: bool) -> str:
    from ..units import count, fmt_bytes

    signed = done.having("to sign" if dry_run else "signed")
    kinds: dict[str, int] = {}
    for o in signed:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    by_kind = f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if kinds else ""
    verb = "would sign" if dry_run else "signed"
    parts = [f"{verb} {count(len(signed), 'ref')} of domain {done.domain}{by_kind}"]
    parts.append(f"{count(done.blobs_checked, 'blob')} checked ({fmt_bytes(done.bytes_checked)})")
    for status, words in (("already", "already signed"), ("refused", "refused"), ("left", "left with a bad signature")):
        n = len(done.having(status))
        if n:
            parts.append(f"{n} {words}")
    gone = len(done.having("gone"))
    if gone:
        parts.append(f"{gone} changed meanwhile (run again)")
    return "; ".join(parts)


def register(app: typer.Typer) -> None:
    app.add_typer(trust_app, name="trust")
