"""The agent's "seed" task: keep serving the blobs this node fetched while the job's other nodes still need them.

`exec` hands over the blobs its swarm fetched (`delivery.handoff`); the agent starts a fresh
session on the same port range, in an unprivileged helper (remote.py), and adds each blob from the
node cache in seed mode as a read-only descriptor (the file was verified against its sha256, so
libtorrent need not re-hash it before serving) under its secret swarm torrent, re-announces it
in the store, and serves for `[p2p] seed_s` after the launcher started, or until the agent stops.
Every few seconds it writes `p2p.json` in the run directory, which `bootseer p2p status` reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from .discovery import Announcer, static_peers, swarm_peers

if TYPE_CHECKING:
    from ..agent import Agent
    from ..settings import P2PSettings
    from ..store.cache import BlobCache
    from ..store.core import Store
    from .remote import RemoteHandle, RemoteSwarm

STATUS_NAME = "p2p.json"
DISCOVER_EVERY_S = 2.0

Seeding = list[tuple[str, "RemoteHandle", Announcer]]  # (blob digest, libtorrent handle, this node's swarm entry)


def _write_status(run_dir: Path, doc: dict[str, Any]) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{STATUS_NAME}.tmp-", dir=run_dir)  # O_EXCL, unguessable: no link followed
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, run_dir / STATUS_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class SeedTask:
    """The blobs to keep seeding (`{"digest", "torrent"}` each, both in the node cache) and what the
    swarm fetched before exec (for `bootseer p2p status`), as `p2p.fetch.shutdown` returns them."""

    blobs: list[dict[str, str]] = field(default_factory=list)
    fetches: list[dict[str, Any]] = field(default_factory=list)


def run_seed(task: SeedTask, agent: Agent) -> None:
    """The agent task: serve `task.blobs` from the node cache for `[p2p] seed_s`, or until the agent stops."""
    from ..store.cache import cache_for
    from .fetch import NoSwarm, start_swarm

    settings = agent.settings
    p2p = settings.p2p
    started = time.time()
    status: dict[str, Any] = {
        "state": "starting",
        "pid": os.getpid(),
        "started": started,
        "seed_until": started + p2p.seed_s,
        "fetches": task.fetches,
        "blobs": [],
    }
    _write_status(agent.run_dir, status)
    if p2p.seed_s <= 0:
        status["state"] = "done"
        _write_status(agent.run_dir, status)
        return
    store = agent.store
    cache = cache_for(settings.store)
    try:
        swarm, secret = start_swarm(p2p, store, cache.root / ".p2p")
    except NoSwarm as e:
        agent.log(f"seed: not seeding: {e}")
        status["state"] = "done"
        _write_status(agent.run_dir, status)
        return
    seeding: Seeding = []
    try:
        _add_blobs(task.blobs, cache, swarm, secret, store, agent, seeding)
        host = swarm.announce_host
        agent.log(f"seed: serving {len(seeding)} blob(s) on {host}:{swarm.port} for {p2p.seed_s:g} s")
        _serve(seeding, swarm, store, p2p, agent, status)
    finally:
        _stop(seeding, swarm, agent, status)


def _add_blobs(
    blobs: list[dict[str, str]],
    cache: BlobCache,
    swarm: RemoteSwarm,
    secret: bytes,
    store: Store,
    agent: Agent,
    seeding: Seeding,
) -> None:
    """Add each handed-over blob in seed mode from the node cache and announce it (into `seeding`, so
    the caller's cleanup sees the blobs added before a failure)."""
    from .secret import swarm_torrent

    for blob in blobs:
        digest, tdigest = blob["digest"], blob["torrent"]
        path, tpath = cache.get(digest), cache.get(tdigest)
        if path is None or tpath is None:
            agent.log(f"seed: blob {digest[:12]} or its torrent left the cache; not seeding it")
            continue
        handle = swarm.add(swarm_torrent(tpath.read_bytes(), digest, secret), digest, seed_path=path)
        ann = Announcer(store, digest, swarm.announce_host, swarm.port)
        with contextlib.suppress(StoreError, OSError):  # static peers and refreshes still find this node
            ann.write("seed")
        seeding.append((digest, handle, ann))


def _serve(
    seeding: Seeding, swarm: RemoteSwarm, store: Store, p2p: P2PSettings, agent: Agent, status: dict[str, Any]
) -> None:
    """Serve until `seed_s` after the start or the agent stops; every few seconds connect to the nodes
    still downloading, refresh this node's entries and write the status file."""
    started = float(status["started"])
    last_discover = 0.0
    while seeding and time.time() - started < p2p.seed_s:
        swarm.pump()
        if time.time() - last_discover >= DISCOVER_EVERY_S:
            last_discover = time.time()
            for digest, handle, ann in seeding:
                eps = [(e.host, e.port) for e in static_peers(p2p)]
                with contextlib.suppress(StoreError, OSError):
                    eps += [(e.host, e.port) for e in swarm_peers(store, digest, ann.name) if e.state != "seed"]
                swarm.connect(handle, eps)
                ann.refresh()
            status.update(state="seeding", updated=time.time(), blobs=_blob_status(seeding, swarm))
            _write_status(agent.run_dir, status)
        if agent.wait(0.5):
            break


def _stop(seeding: Seeding, swarm: RemoteSwarm, agent: Agent, status: dict[str, Any]) -> None:
    """Leave every swarm, close the session and write the final status."""
    status.update(state="done", updated=time.time(), blobs=_blob_status(seeding, swarm))
    for _, handle, ann in seeding:
        ann.remove()
        swarm.remove(handle)
    swarm.close()
    _write_status(agent.run_dir, status)
    agent.log("seed: stopped")


def _blob_status(seeding: Seeding, swarm: RemoteSwarm) -> list[dict[str, Any]]:
    out = []
    for digest, handle, ann in seeding:
        try:
            st = handle.status()
            peers = [
                {"ip": f"{p.ip}:{p.port}", "seed": p.seed, "uploaded": p.total_upload} for p in handle.get_peer_info()
            ]
            out.append(
                {
                    "digest": digest,
                    "endpoint": f"{ann.host}:{ann.port}",
                    "uploaded": int(st.total_payload_upload),
                    "peers": peers,
                    "hash_failures": swarm.hash_failures.get(handle.info_hash(), 0),
                }
            )
        except (RuntimeError, OSError) as e:  # a removed handle, a helper gone: report it, don't fail the status
            out.append({"digest": digest, "error": str(e)})
    return out


def find_status(run_dir: Path | None = None) -> Path | None:
    """The status file of `run_dir`, else of $BOOTSEER_RUN_DIR, else of the most recent run that has one."""
    from ..paths import runs_dir

    if run_dir is None and os.environ.get("BOOTSEER_RUN_DIR"):
        run_dir = Path(os.environ["BOOTSEER_RUN_DIR"])
    if run_dir is not None:
        p = run_dir / STATUS_NAME
        return p if p.exists() else None
    if not runs_dir().exists():
        return None
    candidates = sorted(runs_dir().glob(f"*/{STATUS_NAME}"), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None
