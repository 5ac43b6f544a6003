"""`bootseer p2p status|publish|fetch`: the swarm delivery, by hand (status during a run; tests, benchmarks)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..units import fmt_bytes
from .options import ConfigOpt, JsonOpt, StoreOpt, load_settings

p2p = typer.Typer(help="Peer-to-peer delivery of blobs between the job's nodes (libtorrent).", no_args_is_help=True)


@p2p.command("status")
def status(
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="Run directory (default $BOOTSEER_RUN_DIR, else the latest).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Peers and bytes from the store vs from peers, for this node's current (or latest) run."""
    from ..errors import BootseerError
    from ..p2p.seed import find_status

    path = find_status(run_dir)
    if path is None:
        raise BootseerError("no P2P status here: no run with [p2p] enabled has fetched a blob through the swarm", 1)
    doc = json.loads(path.read_text())
    if as_json:
        typer.echo(json.dumps(doc, indent=1, sort_keys=True))
        return
    left = max(0.0, float(doc.get("seed_until", 0)) - time.time())
    more = f", seeding {left:.0f} s more" if left and doc.get("state") == "seeding" else ""
    typer.echo(f"run {path.parent.name}: agent {doc.get('state', '?')}{more}")
    for f in doc.get("fetches", []):
        role = "origin" if f.get("origin") else "peer"
        note = f" ({f['note']})" if f.get("note") else ""
        typer.echo(
            f"  fetched {f['digest'][:12]} as {role}: {fmt_bytes(f['bytes_from_store'])} from the store, "
            f"{fmt_bytes(f['bytes_from_peers'])} from peers{note}"
        )
    for b in doc.get("blobs", []):
        if "error" in b:
            typer.echo(f"  seeding {b['digest'][:12]}: {b['error']}")
            continue
        peers = b.get("peers", [])
        typer.echo(
            f"  seeding {b['digest'][:12]} on {b.get('endpoint')}: {len(peers)} peer(s) "
            f"({sum(1 for p in peers if not p['seed'])} downloading), {fmt_bytes(b.get('uploaded', 0))} uploaded"
        )
        for p in peers:
            typer.echo(
                f"    {p['ip']:<22} {'seed' if p['seed'] else 'downloading':<12} {fmt_bytes(p['uploaded'])} sent"
            )


@p2p.command("publish")
def publish(
    file: Annotated[Path, typer.Argument(help="File to publish as a blob, with its torrent.")],
    config: ConfigOpt = None,
    store: StoreOpt = None,
) -> None:
    """Upload FILE as a blob and its torrent; prints the blob's digest (then the torrent's)."""
    from ..errors import BootseerError
    from ..p2p.publish import publish_file
    from ..store.core import open_store_for

    if not file.is_file():
        raise BootseerError(f"{file}: not a file", 2)
    digest, tdigest = publish_file(open_store_for(load_settings(config, store)), file)
    typer.echo(f"{digest} {tdigest}")


@p2p.command("fetch")
def fetch(
    digest: Annotated[str, typer.Argument(help="The blob's sha256.")],
    config: ConfigOpt = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fetch one blob into the node cache (cache → swarm → store), then serve peers until they are done."""
    from ..delivery import fetch_blob, handoff
    from ..store.cache import cache_for
    from ..store.core import blob_path, open_store_for

    blob_path(digest)  # a clear error for a malformed digest
    settings = load_settings(config, store)
    st = open_store_for(settings)
    t0 = time.time()
    got = fetch_blob(settings.p2p, st, digest, cache=cache_for(settings.store))
    doc = {
        "digest": digest,
        "path": str(got.path),
        "source": got.source,
        "bytes_from_store": got.bytes_from_store,
        "bytes_from_peers": got.bytes_from_peers,
        "note": got.note,
        "seconds": round(time.time() - t0, 3),
        "done_at": time.time(),
    }
    if as_json:
        typer.echo(json.dumps(doc, sort_keys=True))
    else:
        note = f" ({got.note})" if got.note else ""
        typer.echo(
            f"{digest[:12]} from {got.source} in {doc['seconds']} s: {fmt_bytes(got.bytes_from_store)} from the store, "
            f"{fmt_bytes(got.bytes_from_peers)} from peers{note}"
        )
    sys.stdout.flush()
    handoff(None)  # no agent follows: serve the peers still downloading, up to [p2p] deadline_s


def register(app: typer.Typer) -> None:
    app.add_typer(p2p, name="p2p")
