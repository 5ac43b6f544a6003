"""Trust domains and signed refs: what a ref names is used only if its owner signed it.

A store is shared by many users and jobs. Blobs are content-addressed and checked against the digest a
ref names, so whoever can write a *ref* decides what every reader executes. A trust domain is a prefix
of the store (`<domain>/refs/…`, `<domain>/leases/…`, `<domain>/ckpt/…`, `<domain>/swarm/…`), by
default the job owner's user name. A reader reads its own domain and the domains it names in
`[trust] read_from`, and every ref document carries an Ed25519 signature over its canonical bytes
(the domain, the ref's path and the document), checked against the keys trusted for that domain
(`[trust] verify_keys`: public key files, each naming its domain). A ref moved to another key or
domain no longer verifies; a key removed from `verify_keys` no longer verifies anything.

Without any key configured, refs are unsigned and a reader accepts only its own domain (a user never
runs another user's code by accident; a store writer can still forge refs in it, which `bootseer
doctor` says, and a start that uses such a ref says once, on one line: `announce_unverified`). With
keys, `[trust] verify = "required"` (the default then) refuses an unsigned or wrongly signed ref: the
reader treats it as a miss and warns, never stops the job.

Signatures are Ed25519 through `cryptography` (public keys, so that a reader cannot forge what it
verifies; a well-kept library already in most Python images); it is imported only where a key is
loaded, so `exec` with nothing to do never pays for it. Key files are opened with `O_NOFOLLOW |
O_NONBLOCK`, must be regular files and are size-capped: root may be asked to read them.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .domains import check_domain, default_domain
from .errors import ConfigError
from .safeopen import read_capped

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    from .settings import Settings

SIG_FIELD = "_sig"
PUBLIC_TAG = "bootseer-ed25519"
KEY_FILE_MAX = 16 << 10


def read_key_file(path: str) -> bytes:
    """A key file's bytes, read without following a link, without blocking on a FIFO, size-capped."""
    try:
        return read_capped(path, KEY_FILE_MAX, follow=False)
    except OSError as e:
        why = f"{e.strerror}, more than a key file holds" if e.errno == errno.EFBIG else e.strerror
        raise ConfigError(f"key file {path}: {why}") from None


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


class Signer:
    """The private half of a domain's key: signs what this process publishes.

    Read from its file at once (a missing or unreadable key fails the config), parsed on first use:
    PEM parsing imports `cryptography`'s serialization layer (~8 ms), which a restart that publishes
    nothing (every stage a hit) never pays."""

    def __init__(self, pem: bytes, path: str) -> None:
        self._pem = pem
        self.path = path
        self._key: Ed25519PrivateKey | None = None
        self._kid = ""
        self._lock = threading.Lock()

    def _load(self) -> Ed25519PrivateKey:
        with self._lock:
            if self._key is None:
                self._key, self._kid = _parse_private(self._pem, self.path)
            return self._key

    @property
    def kid(self) -> str:
        self._load()
        return self._kid

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self._load().sign(data)).decode()

    def verifier(self, domain: str) -> Verifier:
        """This key's public half, trusted for `domain`: `trust sign` checks a document as a reader would,
        even on a host whose `[trust] verify_keys` does not list the key."""
        return Verifier(self._load().public_key(), self.kid, domain)


@dataclass(frozen=True)
class Verifier:
    """A public key and the domain it is trusted for."""

    key: Ed25519PublicKey
    kid: str
    domain: str


def load_signer(path: str, *, parse: bool = True) -> Signer:
    """The signing key at `path`; `parse=False` defers the parsing to the first signature."""
    signer = Signer(read_key_file(path), path)
    if parse:
        signer.kid  # noqa: B018 - parse now: a bad key fails here, with its path
    return signer


def _parse_private(data: bytes, path: str) -> tuple[Ed25519PrivateKey, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ConfigError(
            f"[trust] signing_key {path}: not a PEM private key (make one: bootseer trust keygen)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"[trust] signing_key {path}: not an Ed25519 key")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, key_id(raw)


def parse_public(text: str, where: str) -> Verifier:
    """`bootseer-ed25519 <base64 of the 32 raw bytes> <domain>`: one line, as `trust keygen` writes it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    parts = text.split()
    if len(parts) != 3 or parts[0] != PUBLIC_TAG:
        raise ConfigError(f"{where}: expected '{PUBLIC_TAG} <key> <domain>' (as bootseer trust keygen writes)")
    try:
        raw = base64.b64decode(parts[1], validate=True)
        key = Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ConfigError(f"{where}: the key is not 32 bytes of base64") from None
    return Verifier(key, key_id(raw), check_domain(parts[2], where))


def load_verifiers(paths: Sequence[str]) -> dict[str, Verifier]:
    out: dict[str, Verifier] = {}
    for p in paths:
        v = parse_public(read_key_file(p).decode("utf-8", "replace"), f"[trust] verify_keys {p}")
        out[v.kid] = v
    return out


def keygen(private_path: str, public_path: str, domain: str) -> str:
    """Write a new key pair: the private half 0600 (never over an existing file), the public half 0644.

    Returns the key id. Nothing is left half-written: each file is created under a private name and
    linked into place only when complete."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    check_domain(domain, "--domain")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    public = f"{PUBLIC_TAG} {base64.b64encode(raw).decode()} {domain}\n".encode()
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise ConfigError(f"{path} exists: keygen never overwrites a key (remove it, or name another file)")
    _write_new(private_path, pem, 0o600)
    try:
        _write_new(public_path, public, 0o644)
    except BaseException:
        os.unlink(private_path)
        raise
    return key_id(raw)


def _write_new(path: str, data: bytes, mode: int) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails rather than replace a file that appeared meanwhile
    finally:
        os.unlink(tmp)


def canonical(domain: str, rel: str, doc: Mapping[str, object]) -> bytes:
    """The bytes a signature covers: the domain, the ref's path in it and the document (without its
    signature), as sorted compact JSON. Moving a signed ref to another path or domain breaks it."""
    body = {k: v for k, v in doc.items() if k != SIG_FIELD}
    return json.dumps({"domain": domain, "rel": rel, "doc": body}, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Trust:
    """What one process trusts: its own domain (where it writes), the domains it reads, its keys."""

    domain: str
    read_from: tuple[str, ...] = ()
    signer: Signer | None = None
    verifiers: Mapping[str, Verifier] = field(default_factory=dict)
    verify: str = "auto"  # "required" | "off" | "auto" (required when verify keys are configured)

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains refs are read from, own first; without keys only the own one can be trusted."""
        if not self.verifiers and self.verify != "off":
            return (self.domain,)
        return (self.domain, *(d for d in self.read_from if d != self.domain))

    @property
    def required(self) -> bool:
        return self.verify == "required" or (self.verify == "auto" and bool(self.verifiers))

    def sign(self, domain: str, rel: str, doc: dict[str, object]) -> dict[str, object]:
        """`doc` with its signature, when this process holds a key; else as it is (unsigned)."""
        body = {k: v for k, v in doc.items() if k != SIG_FIELD}
        if self.signer is None:
            return body
        sig = self.signer.sign(canonical(domain, rel, body))
        return {**body, SIG_FIELD: {"alg": "ed25519", "key": self.signer.kid, "sig": sig}}

    def check(self, domain: str, rel: str, doc: Mapping[str, object]) -> str:
        """Why `doc`, read at `rel` in `domain`, must not be used; "" when it may be."""
        if self.verify == "off":
            return ""
        sig = doc.get(SIG_FIELD)
        if not isinstance(sig, dict):
            if self.required:
                return "unsigned"
            return "" if domain == self.domain else f"unsigned, from another domain ({domain})"
        v = self.verifiers.get(str(sig.get("key")))
        if v is None:
            if not self.required and domain == self.domain and not self.verifiers:
                return ""  # keys are not in use here: a signed ref of one's own domain is as good as unsigned
            return f"signed by key {str(sig.get('key'))[:16]}, which is not in [trust] verify_keys"
        if v.domain != domain:
            return f"signed by a key of domain {v.domain}, not of {domain}"
        try:
            raw = base64.b64decode(str(sig.get("sig")), validate=True)
            v.key.verify(raw, canonical(domain, rel, doc))
        except Exception:  # InvalidSignature, or a signature that is not base64: a forgery either way
            return f"bad signature (key {v.kid})"
        return ""


def unsigned(domain: str | None = None) -> Trust:
    """The trust of a process without keys: its own domain, unsigned."""
    return Trust(domain=domain or default_domain())


def trust_for(settings: Settings) -> Trust:
    """This process's trust, from `[store] domain` and `[trust]` (keys are loaded, and checked, here)."""
    t = settings.trust
    own = check_domain(settings.store.trust_domain())
    read_from = tuple(check_domain(d, "[trust] read_from") for d in t.read_from)
    signer = load_signer(str(t.signing_key), parse=False) if t.signing_key else None
    verifiers = load_verifiers(list(t.verify_keys)) if t.verify_keys else {}
    return Trust(own, read_from, signer, verifiers, t.verify or "auto")


def describe(trust: Trust) -> tuple[str, str, str]:
    """(status, detail, fix) for `bootseer doctor`."""
    domains = ", ".join(trust.domains)
    if trust.verify == "off":
        return (
            "warn",
            f'domain {trust.domain}; [trust] verify = "off": refs of {domains} are used unchecked',
            ('remove verify = "off" once every publisher signs'),
        )
    if not trust.verifiers:
        return (
            "warn",
            f"domain {trust.domain}; refs are unsigned: whoever can write the store can put code into its jobs",
            f'bootseer trust keygen --domain {trust.domain} --out KEY, then set [trust] signing_key = "KEY.key" '
            'and verify_keys = ["KEY.pub"]',
        )
    signs = f"signs with key {trust.signer.kid}" if trust.signer else "does not sign (no [trust] signing_key)"
    return "ok", f"domain {trust.domain}; reads {domains}; {len(trust.verifiers)} verify key(s); {signs}", ""


# Documents that name code a start runs or loads (a snapshot's files, compiled kernels, the pages of a
# hot-block record, a torrent's pieces): used unverified only with the notice below, or when the
# configuration says `[trust] verify = "off"`.
CODE_REFS = ("refs/env/", "refs/compile/", "refs/hot/", "refs/torrent/")
_announced: list[str] = []
_starting: list[bool] = []  # set by what starts a job (exec, restore): only a start runs what it reads


def starting_a_job() -> None:
    """Mark this process as a start (`exec`, `restore`): the unsigned notice is said by starts only.
    A verb that only looks (`hot show`, `env ls`) runs nothing it reads, and its one-line errors stay one
    line (`hot show` of a gone record printed the notice as a second line)."""
    _starting.append(True)


def announce_unverified(trust: Trust, domain: str, rel: str) -> None:
    """Say once per process (one start), on one line, that code from the store is used without a verified
    signature, and how to turn signing on. A downgrade must not be silent; a notice per ref would be noise.
    Nothing is said where the configuration chose `verify = "off"`, or where every use was verified."""
    if not _starting or _announced or trust.required or trust.verify == "off" or not rel.startswith(CODE_REFS):
        return
    _announced.append(domain)
    import sys

    print(
        f"bootseer: notice: running unsigned: env/compile/hot/torrent refs of domain {domain} are used without "
        "a signature (whoever can write the store can put code into this job); turn signing on: bootseer trust "
        f'keygen --domain {domain} --out KEY, then [trust] signing_key = "KEY.key", verify_keys = ["KEY.pub"] '
        '(or [trust] verify = "off" to run unsigned knowingly)',
        file=sys.stderr,
        flush=True,
    )
