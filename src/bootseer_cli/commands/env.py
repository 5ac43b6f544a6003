"""Environment-snapshot verbs: baseline, snapshot, restore, env ls|show|rm.

For setups run outside `bootseer exec`: `bootseer restore || (setup && bootseer snapshot)`, with
`bootseer baseline` run before the setup so the snapshot holds only what it changed.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import BootseerError
from ..settings import Settings
from ..units import fmt_age, fmt_bytes, fmt_time
from .options import ConfigOpt, JsonOpt, StoreOpt, load_config

if TYPE_CHECKING:
    from ..envsnap.snapshot import Captured
    from ..store import Store

SHOWN_FIELDS = ("env_key", "blob", "size", "files", "bytes", "deletions", "created", "creator", "roots", "format")


def _warn(msg: str) -> None:
    typer.echo(f"bootseer: warning: {msg}", err=True)


def baseline(config: ConfigOpt = None, store: StoreOpt = None) -> None:
    """Record the state of the env roots before a setup (for `bootseer snapshot`)."""
    from ..envsnap import manifest
    from ..envsnap.journal import recover
    from ..envsnap.lock import tree_lock
    from ..envsnap.setup import baseline_path, take_baseline
    from ..identity import keys_for

    settings = Settings.from_config(load_config(config, store))
    roots = settings.env.resolve_roots()
    # The key as of before the setup: a setup into the base prefix changes the image fingerprint, and
    # fresh nodes (which compute the key before their setup) must find the snapshot under this one.
    key = keys_for(settings).env.digest

    def say(msg: str) -> None:
        typer.echo(f"bootseer: {msg}", err=True)

    with tree_lock(roots, say, _warn):
        recover(roots, say)  # a restore killed part way: put the tree back before recording it
        m = take_baseline(roots, settings.store, say)
    manifest.save(m, baseline_path(roots), roots, {"env_key": key})
    typer.echo(f"baseline of {len(m)} entries under {', '.join(roots)} saved")


def _published(key: str, cap: Captured, took: float, as_json: bool) -> None:
    if as_json:
        doc = {"env_key": key, "blob": cap.digest, "size": cap.size, "files": cap.files, "deletions": cap.deletions}
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(
        f"published env {key[:16]}: {cap.files} files, {cap.deletions} deletions, "
        f"{fmt_bytes(cap.size)} compressed, in {took:.1f} s"
    )


def snapshot_(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Capture what changed under the env roots since `bootseer baseline` and publish it."""
    from ..cache import cache_for
    from ..envsnap import manifest, snapshot
    from ..envsnap.setup import baseline_path
    from ..envsnap.stamp import write_stamp
    from ..identity import keys_for
    from ..store import open_store

    settings = Settings.from_config(load_config(config, store))
    roots = settings.env.resolve_roots()
    path = baseline_path(roots)
    if not path.exists():
        raise BootseerError(f"no baseline for {', '.join(roots)}: run `bootseer baseline` before the setup")
    base, _, extra = manifest.load(path)
    now = keys_for(settings).env.digest
    key = str(extra.get("env_key") or now)
    st = open_store(settings.store.uri)
    cache = cache_for(settings.store)
    t0 = time.monotonic()
    cap = snapshot.capture(settings.store, roots, base, key, cache, _warn, since=path.stat().st_mtime)
    snapshot.publish(settings.p2p, st, cache, cap, key, roots)
    write_stamp(roots, [key, now], cap.digest, cap.entries, cap.deletion_paths)
    _published(key, cap, time.monotonic() - t0, as_json)


def restore(config: ConfigOpt = None, store: StoreOpt = None) -> None:
    """Restore the snapshot for the current env key: exit 0 on a hit, 3 when there is none."""
    from ..verbs.restore import restore_verb

    code = restore_verb(load_config(config, store), typer.echo, lambda m: typer.echo(m, err=True))
    if code:
        raise typer.Exit(code)


env_app = typer.Typer(help="List, show and remove environment snapshots.", no_args_is_help=True)


@env_app.command("ls")
def env_ls(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the snapshots in the store: key, size, files, age, creator."""
    from ..envsnap.catalog import list_snapshots
    from ..store import open_store

    rows = list_snapshots(open_store(Settings.from_config(load_config(config, store)).store.uri))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no env snapshots")
        return
    typer.echo(f"{'KEY':16}  {'SIZE':>9}  {'FILES':>7}  {'AGE':>5}  CREATOR")
    for r in rows:
        typer.echo(
            f"{r['env_key'][:16]}  {fmt_bytes(float(r.get('size') or 0)):>9}  {r.get('files', 0):>7}  "
            f"{fmt_age(float(r.get('created') or 0)):>5}  {r.get('creator', '')}"
        )


def _entries_doc(settings: Settings, st: Store, ref: dict[str, Any]) -> dict[str, Any]:
    """The blob's entries and deletions, as `env show --files` prints them (fetches the blob)."""
    from pathlib import Path

    from ..cache import cache_for
    from ..envsnap.format import read_meta
    from ..envsnap.snapshot import entries_hint, fetch_verified

    fetched = fetch_verified(settings.p2p, st, cache_for(settings.store), ref["blob"], ref.get("size"))
    meta = read_meta(Path(fetched.path), entries_hint(ref))
    return {"entries": [e.row() for e in meta.entries], "deletion_paths": list(meta.deletions)}


def _show_text(doc: dict[str, Any], ref: dict[str, Any], files: bool) -> None:
    for k in SHOWN_FIELDS:
        if k in doc:
            v = doc[k]
            if k == "created":
                v = f"{fmt_time(float(v))} ({fmt_age(float(v))} ago)"
            typer.echo(f"{k:10} {v}")
    for k, v in sorted(ref.items()):
        if k not in doc or k in SHOWN_FIELDS:
            continue
        typer.echo(f"{k:10} {v}")
    if files:
        for path, kind, mode, size, _mtime, extra in doc["entries"]:
            typer.echo(f"{kind} {mode:04o} {size:>10} {path}" + (f" -> {extra}" if kind in ("l", "h") else ""))
        for path in doc["deletion_paths"]:
            typer.echo(f"- {path}")


@env_app.command("show")
def env_show(
    key: Annotated[str, typer.Argument(help="The env key, or a unique prefix of it.")],
    files: Annotated[bool, typer.Option("--files", help="Also list the entries (fetches the blob).")] = False,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one snapshot's ref (and with --files its entries, deletions and per-file digests)."""
    from ..envsnap import catalog
    from ..store import open_store

    settings = Settings.from_config(load_config(config, store))
    st = open_store(settings.store.uri)
    full = catalog.match_key(st, key)
    ref = catalog.read(st, full)
    doc: dict[str, Any] = {"env_key": full, **ref}
    if files:
        doc.update(_entries_doc(settings, st, ref))
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    _show_text(doc, ref, files)


@env_app.command("rm")
def env_rm(
    keys: Annotated[list[str], typer.Argument(help="Env keys (or unique prefixes) to remove.")],
    config: ConfigOpt = None,
    store: StoreOpt = None,
) -> None:
    """Remove snapshots: the ref, and the blob when no other ref names it."""
    from ..envsnap import catalog
    from ..store import open_store

    st = open_store(Settings.from_config(load_config(config, store)).store.uri)
    for prefix in keys:
        full = catalog.match_key(st, prefix)
        catalog.remove(st, full)
        typer.echo(f"removed env {full[:16]}")


def register(app: typer.Typer) -> None:
    app.command("baseline")(baseline)
    app.command("snapshot")(snapshot_)
    app.command("restore")(restore)
    app.add_typer(env_app, name="env")
