"""Environment-snapshot verbs: baseline, snapshot, restore, env ls|show|rm.

For setups run outside `bootseer exec`: `bootseer restore || (setup && bootseer snapshot)`, with
`bootseer baseline` run before the setup so the snapshot holds only what it changed.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from ..errors import BootseerError
from .options import ConfigOpt, JsonOpt, StoreOpt, load_config


def _age(ts: float) -> str:
    s = max(0.0, time.time() - ts)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit}"
    return f"{s:.0f}s"


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _warn(msg: str) -> None:
    typer.echo(f"bootseer: warning: {msg}", err=True)


def _match_key(store: Any, prefix: str) -> str:
    keys = [k for k in store.list_refs("env") if k.startswith(prefix)]
    if not keys:
        raise BootseerError(f"no env snapshot with a key starting {prefix!r} (see `bootseer env ls`)")
    if len(keys) > 1:
        raise BootseerError(f"{prefix!r} names {len(keys)} snapshots; give more of the key")
    return keys[0]


def baseline(config: ConfigOpt = None, store: StoreOpt = None) -> None:
    """Record the state of the env roots before a setup (for `bootseer snapshot`)."""
    from ..envsnap import manifest, snapshot

    cfg = load_config(config, store)
    roots = snapshot.resolve_roots(cfg)
    from ..keys import compute

    snapshot.remove_stamp(roots)
    snapshot.strip_carried(roots, lambda m: typer.echo(f"bootseer: {m}", err=True))
    m = manifest.scan(roots, snapshot.excluded_paths(cfg))
    path = snapshot.baseline_path(roots)
    # The key as of before the setup: a setup into the base prefix changes the image fingerprint, and
    # fresh nodes (which compute the key before their setup) must find the snapshot under this one.
    manifest.save(m, path, roots, {"env_key": compute(cfg).env.digest})
    typer.echo(f"baseline of {len(m)} entries under {', '.join(roots)} saved")


def snapshot_(config: ConfigOpt = None, store: StoreOpt = None, json_: JsonOpt = False) -> None:
    """Capture what changed under the env roots since `bootseer baseline` and publish it."""
    from ..cache import cache_from_config
    from ..envsnap import manifest, snapshot
    from ..keys import compute

    cfg = load_config(config, store)
    roots = snapshot.resolve_roots(cfg)
    path = snapshot.baseline_path(roots)
    if not path.exists():
        raise BootseerError(f"no baseline for {', '.join(roots)}: run `bootseer baseline` before the setup")
    base, _, extra = manifest.load(path)
    now = compute(cfg).env.digest
    key = str(extra.get("env_key") or now)
    from ..store import store_from_config

    st = store_from_config(cfg)
    t0 = time.monotonic()
    cap = snapshot.capture(cfg, roots, base, key, cache_from_config(cfg), _warn, since=path.stat().st_mtime)
    snapshot.publish(cfg, st, cap, key, roots)
    snapshot.write_stamp(roots, [key, now], cap.digest, cap.entries, cap.deletion_paths)
    took = time.monotonic() - t0
    if json_:
        doc = {"env_key": key, "blob": cap.digest, "size": cap.size, "files": cap.files, "deletions": cap.deletions}
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(
        f"published env {key[:16]}: {cap.files} files, {cap.deletions} deletions, "
        f"{_size(cap.size)} compressed, in {took:.1f} s"
    )


def restore(config: ConfigOpt = None, store: StoreOpt = None) -> None:
    """Restore the snapshot for the current env key: exit 0 on a hit, 3 when there is none."""
    from ..envsnap.snapshot import restore_verb

    code = restore_verb(load_config(config, store), typer.echo, lambda m: typer.echo(m, err=True))
    if code:
        raise typer.Exit(code)


env_app = typer.Typer(help="List, show and remove environment snapshots.", no_args_is_help=True)


@env_app.command("ls")
def env_ls(config: ConfigOpt = None, store: StoreOpt = None, json_: JsonOpt = False) -> None:
    """List the snapshots in the store: key, size, files, age, creator."""
    from ..store import store_from_config

    st = store_from_config(load_config(config, store))
    rows = []
    for key in st.list_refs("env"):
        ref = st.read_ref("env", key) or {}
        rows.append({"env_key": key, **ref})
    rows.sort(key=lambda r: -float(r.get("created") or 0))
    if json_:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no env snapshots")
        return
    typer.echo(f"{'KEY':16}  {'SIZE':>9}  {'FILES':>7}  {'AGE':>5}  CREATOR")
    for r in rows:
        typer.echo(
            f"{r['env_key'][:16]}  {_size(float(r.get('size') or 0)):>9}  {r.get('files', 0):>7}  "
            f"{_age(float(r.get('created') or 0)):>5}  {r.get('creator', '')}"
        )


@env_app.command("show")
def env_show(
    key: Annotated[str, typer.Argument(help="The env key, or a unique prefix of it.")],
    files: Annotated[bool, typer.Option("--files", help="Also list the entries (fetches the blob).")] = False,
    config: ConfigOpt = None,
    store: StoreOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Show one snapshot's ref (and with --files its entries, deletions and per-file digests)."""
    from ..store import store_from_config

    cfg = load_config(config, store)
    st = store_from_config(cfg)
    full = _match_key(st, key)
    ref = st.read_ref("env", full) or {}
    doc: dict[str, Any] = {"env_key": full, **ref}
    if files:
        from pathlib import Path

        from ..envsnap.archive import read_meta
        from ..envsnap.snapshot import fetch_verified

        meta = read_meta(Path(fetch_verified(cfg, st, ref["blob"], ref.get("size")).path))
        doc["entries"] = meta["entries"]
        doc["deletion_paths"] = meta["deletions"]
    if json_:
        typer.echo(json.dumps(doc, indent=2))
        return
    for k in ("env_key", "blob", "size", "files", "bytes", "deletions", "created", "creator", "roots", "format"):
        if k in doc:
            v = doc[k]
            if k == "created":
                v = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(v)))} ({_age(float(v))} ago)"
            typer.echo(f"{k:10} {v}")
    for k, v in sorted(ref.items()):
        if k not in doc or k in ("env_key",):
            continue
        if k not in ("blob", "size", "files", "bytes", "deletions", "created", "creator", "roots", "format"):
            typer.echo(f"{k:10} {v}")
    if files:
        for path, kind, mode, size, _mtime, extra in doc["entries"]:
            typer.echo(f"{kind} {mode:04o} {size:>10} {path}" + (f" -> {extra}" if kind in ("l", "h") else ""))
        for path in doc["deletion_paths"]:
            typer.echo(f"- {path}")


@env_app.command("rm")
def env_rm(
    keys: Annotated[list[str], typer.Argument(help="Env keys (or unique prefixes) to remove.")],
    config: ConfigOpt = None,
    store: StoreOpt = None,
) -> None:
    """Remove snapshots: the ref, and the blob when no other ref names it."""
    from ..store import store_from_config

    st = store_from_config(load_config(config, store))
    for prefix in keys:
        full = _match_key(st, prefix)
        ref = st.read_ref("env", full) or {}
        st.delete_ref("env", full)
        blob = ref.get("blob")
        still = any((st.read_ref("env", k) or {}).get("blob") == blob for k in st.list_refs("env"))
        if isinstance(blob, str) and not still:
            st.delete_blob(blob)
        typer.echo(f"removed env {full[:16]}")


def register(app: typer.Typer) -> None:
    app.command("baseline")(baseline)
    app.command("snapshot")(snapshot_)
    app.command("restore")(restore)
    app.add_typer(env_app, name="env")
