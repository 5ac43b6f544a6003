"""The swarm's secret: info-hashes that the store alone does not give away, and keys for the transport.

Why this and not libtorrent's SSL torrents: an SSL torrent needs a CA per torrent (or per domain), a
certificate and key on every node signed by it, and an SSL listen socket, i.e. a second PKI next
to the trust domain's Ed25519 keys. The secret below needs nothing the nodes do not have already.

    stored torrent (refs/torrent → blob)           public: piece hashes, the blob's name and size
    swarm torrent  = stored torrent + info["x-bootseer-swarm"] = HMAC-SHA256(secret, digest), private
    info-hash      = sha1(swarm torrent's info)    known only to holders of the secret

Every connection is then forced to libtorrent's protocol encryption (`swarm.session_settings`: in
and out `pe_forced`, RC4 only). Its handshake is a Diffie-Hellman exchange whose RC4 keys mix in the
info-hash (BEP 8 / MSE: keyA = sha1("keyA", S, SKEY)), and a responder accepts a connection only
for an info-hash it serves. So a host that read every document in the store (the stored torrent,
the swarm entries, the leases) can neither join the swarm nor read what its members exchange, and
the info-hash never crosses the wire in the clear. A peer's pieces are still checked against the
piece hashes and the whole blob against its sha256, as before.

Where the secret comes from, first found wins (it never goes to argv, an event, a message, the
store, or the unprivileged helper: the helper gets the swarm torrent, whose salt is per blob):
1. `[p2p] key_file`: a per-job secret (e.g. written by the launcher, 0600), read with O_NOFOLLOW
   and O_NONBLOCK, a regular file of 16 bytes to 4 KiB, not readable by group or others;
2. the trust domain's signing key: sha256 of its Ed25519 signature over a fixed label and the
   domain (Ed25519 signatures are deterministic, so every holder of the key derives the same
   secret; the key is what lets a node write swarm entries in the first place);
3. neither: no swarm (the store serves the blob, with a note saying why).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..safeopen import read_capped

if TYPE_CHECKING:
    from ..settings import P2PSettings
    from ..store.core import Store

LABEL = b"bootseer p2p swarm secret v1\0"
SALT_FIELD = b"x-bootseer-swarm"
MIN_BYTES, MAX_BYTES = 16, 4096


def read_secret_file(path: Path) -> bytes:
    """The secret file's contents, refused when it is a link, not a regular file, too short or too
    long, or readable by others (a secret others can read is not one): read through `safeopen`."""
    where = f"[p2p] key_file {str(path)!r}"
    try:
        data = read_capped(path, MAX_BYTES, follow=False, private=True)
    except OSError as e:
        if e.errno == errno.EFBIG:
            raise ConfigError(f"{where} must hold {MIN_BYTES} bytes to {MAX_BYTES} bytes") from None
        raise ConfigError(f"{where}: {e.strerror}") from None
    if not MIN_BYTES <= len(data) <= MAX_BYTES:
        raise ConfigError(f"{where} must hold {MIN_BYTES} bytes to {MAX_BYTES} bytes")
    return hashlib.sha256(b"bootseer p2p secret file\0" + data).digest()


def swarm_secret(p2p: P2PSettings, store: Store) -> bytes | None:
    """The swarm secret of this job (see the module docstring), or None when there is none."""
    if p2p.key_file:
        return read_secret_file(Path(p2p.key_file))
    signer = store.trust.signer
    if signer is None:
        return None
    sig = base64.b64decode(signer.sign(LABEL + store.domain.encode()))
    return hashlib.sha256(LABEL + sig).digest()


def blob_salt(secret: bytes, digest: str) -> bytes:
    return hmac.new(secret, b"blob\0" + digest.encode(), hashlib.sha256).digest()


def swarm_torrent(torrent: bytes, digest: str, secret: bytes) -> bytes:
    """The torrent the nodes actually join: the stored one, private, with the blob's secret salt in
    its info dictionary (so its info-hash follows from the secret, not from the store)."""
    import libtorrent as lt

    doc: object = lt.bdecode(torrent)
    info = doc.get(b"info") if isinstance(doc, dict) else None
    if not isinstance(info, dict):
        raise ValueError("the blob's torrent has no info dictionary")
    salted: dict[bytes, Any] = {b"info": {**info, b"private": 1, SALT_FIELD: blob_salt(secret, digest)}}
    return bytes(lt.bencode(salted))
