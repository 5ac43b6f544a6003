"""The swarm's upkeep hooks (capability table): which torrent refs `bootseer gc` keeps, and whether
the swarm's port is free here (`bootseer doctor`)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..upkeep import Check, Doomed, Policy, Scan, digests_in

if TYPE_CHECKING:
    from ..settings import P2PSettings, Settings
    from ..store.core import Store


def gc_keep(store: Store, policy: Policy, scan: Scan) -> None:
    """A torrent ref follows its blob: kept while the blob is kept or while it is young (`p2p publish`)."""
    for f in store.list_info("refs/torrent"):
        key = f.rel.rsplit("/", 1)[1].removesuffix(".json")
        try:
            doc = store.read_ref("torrent", key) or {}
        except StoreError:
            continue
        if key in scan.live or key in scan.lease_digests or f.mtime >= policy.cutoff:
            scan.live.add(key)
            scan.live.update(digests_in(doc))
        else:
            scan.doomed.append(Doomed("torrent", key, f.size, (f.rel,), last_used=f.mtime))


def doctor(all_settings: Settings) -> list[Check]:
    """Is a port of `[p2p] port` free for the swarm, and can the swarm start here (a secret, a user)?"""
    checks = [_check_port(all_settings.p2p)]
    if all_settings.p2p.enabled:
        checks.append(_check_secret(all_settings))
    return checks


def _check_secret(all_settings: Settings) -> Check:
    """Without a swarm secret the swarm is off (secret.py); as root, the helper's user must exist."""
    from ..errors import ConfigError
    from .remote import helper_ids
    from .secret import read_secret_file

    p2p = all_settings.p2p
    try:
        if p2p.key_file:
            read_secret_file(p2p.key_file)  # checked, never shown
        elif not all_settings.trust.signing_key:
            return Check(
                "p2p secret",
                "fail",
                "no swarm secret: the swarm is off and every node reads the store",
                "set [p2p] key_file (a 0600 file shared by the job's nodes) or [trust] signing_key",
            )
        helper_ids(p2p.user)
    except ConfigError as e:
        return Check("p2p secret", "fail", str(e), "fix the [p2p] setting it names")
    source = "[p2p] key_file" if p2p.key_file else "the domain's signing key"
    return Check("p2p secret", "ok", f"swarm secret from {source}; libtorrent runs as {p2p.user} under root")


def _check_port(settings: P2PSettings) -> Check:
    spec = settings.port
    lo, _, hi = spec.partition("-")
    try:
        ports = range(int(lo), int(hi or lo) + 1)
    except ValueError:
        return Check("p2p", "fail", f"[p2p] port {spec!r} is not a port or a range", 'use e.g. port = "6881-6891"')
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return Check("p2p", "ok", f"TCP port {port} is free for the swarm")
    return Check(
        "p2p",
        "warn" if not settings.enabled else "fail",
        f"no free TCP port in {spec}",
        "pick another [p2p] port range",
    )
