"""Environment-snapshot verbs: baseline, snapshot, restore, env ls|show|rm.

For setups run outside `bootseer exec`: `bootseer restore || (setup && bootseer snapshot)`, with
`bootseer baseline` run before the setup so the snapshot holds only what it changed.
The work is `envsnap/actions.py` (and `envsnap/catalog.py` for `env`); these print its facts.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..redact import warn
from ..settings import Settings
from ..units import count, fmt_age, fmt_bytes, fmt_time
from .options import ConfigOpt, JsonOpt, StoreOpt, load_config

if TYPE_CHECKING:
    from ..envsnap.actions import Published
    from ..store.core import Store

SHOWN_FIELDS = ("env_key", "blob", "size", "files", "bytes", "deletions", "created", "creator", "roots", "format")


def baseline(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Record the state of the env roots before a setup (for `bootseer snapshot`). The tree's stamp is
    removed, as the tree is about to change: `bootseer snapshot` stamps it again, and a start before that
    restores the env or runs the setup. No package is removed."""
    from ..envsnap.actions import baseline_here

    def say(msg: str) -> None:
        from ..redact import redact_text

        typer.echo(f"bootseer: {redact_text(msg)}", err=True)

    taken = baseline_here(Settings.from_config(load_config(config, store)), say, warn)
    if as_json:
        doc = {
            "entries": taken.entries,
            "roots": list(taken.roots),
            "carried": taken.carried or None,
            "stamp_removed": taken.unstamped,
        }
        typer.echo(json.dumps(doc, indent=2))
    else:
        typer.echo(f"baseline of {taken.entries} entries under {', '.join(taken.roots)} saved")
        if taken.unstamped:
            typer.echo(
                "the tree's stamp was removed (the tree is about to change): `bootseer snapshot` stamps it "
                "again; a start before that restores the env or runs the setup"
            )
    if taken.carried:
        warn(
            f"the tree carries {taken.carried}: `bootseer snapshot` will refuse to publish what the setup "
            "adds to it (use a fresh venv of the image, or `bootseer exec`)"
        )


def _published(p: Published, as_json: bool) -> None:
    if as_json:
        doc = {"env_key": p.env_key, "blob": p.digest, "size": p.size, "files": p.files, "deletions": p.deletions}
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(
        f"published env {p.env_key[:16]}: {count(p.files, 'file')}, {count(p.deletions, 'deletion')}, "
        f"{fmt_bytes(p.size)} compressed, in {p.seconds:.1f} s"
    )


def snapshot_(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Capture what changed under the env roots since `bootseer baseline` and publish it."""
    from ..envsnap.actions import snapshot_here

    _published(snapshot_here(Settings.from_config(load_config(config, store)), warn), as_json)


def restore(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Restore the snapshot for the current env key: exit 0 on a hit, 3 when there is none."""
    from ..verbs.restore import restore_verb

    code = restore_verb(load_config(config, store), typer.echo, lambda m: typer.echo(m, err=True), as_json)
    if code:
        raise typer.Exit(code)


env_app = typer.Typer(help="List, show and remove environment snapshots.", no_args_is_help=True)


@env_app.command("ls")
def env_ls(config: ConfigOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the snapshots in the store: key, size, files, age, creator."""
    from ..envsnap.catalog import list_snapshots
    from ..store.core import open_store_for

    rows = list_snapshots(open_store_for(Settings.from_config(load_config(config, store))))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no env snapshots")
        return
    typer.echo(f"{'KEY':16}  {'SIZE':>9}  {'FILES':>7}  {'AGE':>5}  CREATOR")
    for r in rows:
        if "unverified" in r:  # nothing of it is shown: a start would not use it, and its numbers are unchecked
            typer.echo(f"{r['env_key'][:16]}  {'-':>9}  {'-':>7}  {'-':>5}  unverified: {r['unverified']}")
            continue
        typer.echo(
            f"{r['env_key'][:16]}  {fmt_bytes(float(r.get('size') or 0)):>9}  {r.get('files', 0):>7}  "
            f"{fmt_age(float(r.get('created') or 0)):>5}  {r.get('creator', '')}"
        )
    refused = sum("unverified" in r for r in rows)
    if refused:
        typer.echo(f"{count(refused, 'snapshot')} unverified: no start uses them (see bootseer trust sign)", err=True)


def _entries_doc(settings: Settings, st: Store, ref: dict[str, Any]) -> dict[str, Any]:
    """The blob's entries and deletions, as `env show --files` prints them (fetches the blob)."""
    from ..envsnap.actions import snapshot_entries

    listed = snapshot_entries(settings, st, ref)
    return {"entries": [e.row() for e in listed.entries], "deletion_paths": list(listed.deletions)}


# How `env show` writes a ref's numbers for people: sizes in decimal SI units (units.py), labelled
# compressed (the blob) or unpacked (the files); times as dates with their age; lists joined.
_SIZE_LABELS = {"size": "compressed", "bytes": "unpacked"}
_TIMES = ("created", "used")


def _show_value(k: str, v: object) -> str:
    """One field of a ref as `env show` prints it (the JSON form keeps the raw values)."""
    number = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    if k in _SIZE_LABELS and number is not None:
        return f"{fmt_bytes(number)} {_SIZE_LABELS[k]}"
    if k in _TIMES and number is not None:
        return f"{fmt_time(number)} ({fmt_age(number)} ago)"
    if isinstance(v, list | tuple):
        return ", ".join(str(x) for x in v) if v else "(none)"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _show_text(doc: dict[str, Any], ref: dict[str, Any], files: bool) -> None:
    for k in SHOWN_FIELDS:
        if k in doc:
            typer.echo(f"{k:10} {_show_value(k, doc[k])}")
    for k, v in sorted(ref.items()):
        if k not in doc or k in SHOWN_FIELDS or k in ("chain", "inputs"):
            continue
        typer.echo(f"{k:10} {_show_value(k, v)}")
    if files:
        for path, kind, mode, size, _mtime, extra in doc["entries"]:
            shown = fmt_bytes(size) if kind == "f" else "-"
            typer.echo(f"{kind} {mode:04o} {shown:>9} {path}" + (f" -> {extra}" if kind in ("l", "h") else ""))
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
    from ..store.core import open_store_for

    settings = Settings.from_config(load_config(config, store))
    st = open_store_for(settings)
    full = catalog.match_key(st, key)
    ref = catalog.shown(st, full)
    doc: dict[str, Any] = {"env_key": full, **ref}
    if isinstance(ref.get("chain"), list):
        from ..envsnap.chain import layer_sizes

        doc["layers"] = layer_sizes(full, ref)
    if files:
        doc.update(_entries_doc(settings, st, ref))
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    _show_text(doc, ref, files)
    for row in doc.get("layers") or []:
        own, total = fmt_bytes(float(row["size"])), fmt_bytes(float(row["cumulative"]))
        typer.echo(f"layer {row['layer']:<3} {row['key'][:16]}  own {own:>9}  cumulative {total:>9}")


@env_app.command("rm")
def env_rm(
    keys: Annotated[list[str], typer.Argument(help="Env keys (or unique prefixes) to remove.")],
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove snapshots: the ref, and the blob when no other ref names it."""
    from ..envsnap import catalog
    from ..store.core import open_store_for

    st = open_store_for(Settings.from_config(load_config(config, store)))
    removed: list[str] = []
    for prefix in keys:
        full = catalog.match_key(st, prefix)
        catalog.remove(st, full)
        removed.append(full)
        if not as_json:
            typer.echo(f"removed env {full[:16]}")
    if as_json:
        typer.echo(json.dumps({"removed": removed}, indent=2))


def register(app: typer.Typer) -> None:
    app.command("baseline")(baseline)
    app.command("snapshot")(snapshot_)
    app.command("restore")(restore)
    app.add_typer(env_app, name="env")
