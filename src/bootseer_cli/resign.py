"""`bootseer trust sign`: sign what a domain's jobs published before signing was turned on.

A site that sets `[trust] verify_keys` over a store its jobs filled unsigned finds every old ref
refused (trust.py): each start misses, and the first fresh node pays a full setup. Signing those refs
with the domain's key adopts them, and vouches for them: whoever could write the store could have put
them there. So a ref is signed only after every blob it names has been read back and hashed to its
content address (a ref whose blob is missing or altered is reported, and stays unsigned), only a ref
that carries no signature at all is signed (one whose signature does not verify is a forgery or another
key's, and is left as it is and reported), and only in the own domain (`[store] domain`).

What is signed: every `refs/**.json` of the domain (env, hot, compile shards, torrent, …) and each
checkpoint's `manifest.json` and `latest.json`; not swarm entries or leases, which their writers renew.
A signed document replaces the unsigned one atomically (`Store.put_doc`, as any publish writes it), and
only if it is still the bytes that were checked: one a publisher replaced meanwhile is left alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .digests import is_digest, sha256_file
from .errors import ConfigError, IntegrityError, StoreError
from .freshness import SEQ_FIELD
from .trust import SIG_FIELD, Trust
from .unverified import kind_of

if TYPE_CHECKING:
    from .settings import Settings
    from .store.core import Store
    from .stripe.catalog import Targets

CHUNK = 4 << 20

Blob = tuple[str, str]  # (stripe target as a manifest records it, "" for the store; sha256 digest)


@dataclass
class Outcome:
    """What became of one document: `signed` (or, with --dry-run, `to sign`), `already` (its signature
    verifies), `refused` (a blob it names is missing or wrong, or it is malformed), `left` (signed, but
    its signature does not verify), `gone` (removed or replaced while it was checked)."""

    rel: str
    status: str
    why: str = ""

    @property
    def kind(self) -> str:
        return kind_of(self.rel)


@dataclass
class Signing:
    """Every document's outcome, and the blobs that were read and hashed."""

    domain: str
    outcomes: list[Outcome] = field(default_factory=list)
    blobs_checked: int = 0
    bytes_checked: int = 0

    def having(self, *status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in status]


def signer_trust(settings: Settings) -> Trust:
    """This host's trust, with its signing key's own public half trusted for its domain; a one-line error
    when there is no key to sign with."""
    from .trust import trust_for

    if not settings.trust.signing_key:
        raise ConfigError(
            "trust sign: [trust] signing_key is not set (the domain's private key signs; make a pair with "
            "bootseer trust keygen)"
        )
    trust = trust_for(settings)
    assert trust.signer is not None
    own = trust.signer.verifier(trust.domain)
    listed = trust.verifiers.get(own.kid)
    if trust.verifiers and (listed is None or listed.domain != trust.domain):
        raise ConfigError(
            f"trust sign: [trust] signing_key (key {own.kid}) is not in [trust] verify_keys for domain "
            f"{trust.domain}: what it signed would not verify here (list its .pub there, or use the right key)"
        )
    return dataclasses.replace(trust, verifiers={**trust.verifiers, own.kid: own}, verify="required")


def documents(store: Store) -> list[str]:
    """The domain's signable documents, by path in it: refs, then checkpoint manifests and hints."""
    refs = [f.rel for f in store.list_info("refs") if f.rel.endswith(".json")]
    ckpt = [f.rel for f in store.list_info("ckpt") if f.rel.endswith(("/manifest.json", "/latest.json"))]
    return sorted(refs) + sorted(ckpt, key=lambda r: (r.endswith("/latest.json"), r))  # a hint after its tags


def named_blobs(rel: str, doc: dict[str, Any]) -> list[Blob]:
    """The blobs `doc` names, by the kind of document at `rel`; IntegrityError for one whose blob field
    holds something other than a digest (it would be signed naming nothing a reader can fetch)."""
    kind = kind_of(rel)
    if kind == "ckpt":
        if not rel.endswith("/manifest.json"):
            return []  # latest.json: a hint naming a tag, which a reader checks against its manifest
        from .stripe.layout import Manifest

        return [(s.target, s.digest) for s in Manifest.from_doc_at(doc, where=rel).stripes]
    if kind == "compile":
        entries = doc.get("entries")
        values = entries.values() if isinstance(entries, dict) else ()
        return [("", str(e.get("digest"))) for e in values if isinstance(e, dict) and is_digest(e.get("digest"))]
    out: list[Blob] = []
    chain = doc.get("chain")
    chain = chain if isinstance(chain, list) else []
    for part in [doc, *chain]:
        for name in ("blob", "torrent"):  # a snapshot's or a record's blob; its torrent, stored as a blob
            value = part.get(name) if isinstance(part, dict) else None
            if value is None:
                continue
            if not is_digest(value):
                raise IntegrityError(f"its {name} {str(value)[:20]!r} is not a sha256 digest")
            out.append(("", str(value)))
    from .envmount.image import image_stack  # `[env] mode = "mount"`: the images the ref names are blobs too

    return [*out, *(("", digest) for digest, _ in image_stack(doc) or [])]


class BlobCheck:
    """Reads each named blob once and hashes it (on a local store, the file in place), with progress."""

    def __init__(self, store: Store, targets: Targets, advance: Callable[[int], None]) -> None:
        self.store = store
        self.targets = targets
        self.advance = advance
        self.done: dict[Blob, str] = {}  # blob -> "" (whole) or why not
        self.count = 0
        self.bytes = 0

    def why_not(self, blob: Blob) -> str:
        if blob not in self.done:
            self.done[blob] = self._check(*blob)
        return self.done[blob]

    def _check(self, target: str, digest: str) -> str:
        from .store.core import blob_path

        short, rel = digest[:12], blob_path(digest)
        try:
            where = self.targets.get(target)  # a stripe target this host does not configure: an error
            if not where.exists(rel):
                return f"blob {short} is missing" + (f" from {target}" if target else "")
            if where.is_local:
                got = sha256_file(where.path(rel))
                self.advance(where.size(rel))
            else:
                got = self._hash(where, rel, short)
            self.count += 1
            self.bytes += where.size(rel)
        except (StoreError, OSError) as e:
            return f"blob {short} cannot be read: {e}"
        return "" if got == digest else f"blob {short} does not hash to its address (altered or torn)"

    def _hash(self, where: Store, rel: str, short: str) -> str:
        h = hashlib.sha256()
        with where.read_chunks(rel, CHUNK, f"blob {short}") as chunks:
            for chunk in chunks:
                h.update(chunk)
                self.advance(len(chunk))
        return h.hexdigest()


def sign_domain(
    settings: Settings, *, dry_run: bool = False, progress: bool | None = None, on: Callable[[Outcome], None] = print
) -> Signing:
    """Check, then sign, every unsigned document of the own domain (the module docstring says which);
    `on` hears each outcome as it comes."""
    from .progress import byte_bar
    from .store.core import open_store
    from .stripe.catalog import Targets

    trust = signer_trust(settings)
    store = open_store(settings.store.uri, trust)
    report = Signing(trust.domain)
    targets = Targets(store, list(settings.checkpoint.targets))
    found = [(rel, raw) for rel in documents(store) if (raw := store.get_bytes(rel)) is not None]
    with byte_bar(None, f"check blobs of domain {trust.domain}", enabled=progress) as advance:
        check = BlobCheck(store, targets, advance)
        for rel, raw in found:
            outcome = _one(store, trust, check, rel, raw, dry_run)
            report.outcomes.append(outcome)
            on(outcome)
    report.blobs_checked, report.bytes_checked = check.count, check.bytes
    return report


def _one(store: Store, trust: Trust, check: BlobCheck, rel: str, raw: bytes, dry_run: bool) -> Outcome:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Outcome(rel, "refused", "not a JSON object (truncated or corrupt)")
    if SIG_FIELD in doc:
        why = trust.check(trust.domain, rel, doc)
        return Outcome(rel, "left", why) if why else Outcome(rel, "already")
    try:
        blobs = named_blobs(rel, doc)
    except IntegrityError as e:
        return Outcome(rel, "refused", str(e))
    for blob in blobs:
        why = check.why_not(blob)
        if why:
            return Outcome(rel, "refused", why)
    if dry_run:
        return Outcome(rel, "to sign")
    if store.get_bytes(rel) != raw:  # a publisher replaced it (or gc removed it) while its blobs were read
        return Outcome(rel, "gone", "replaced or removed while it was checked; run again")
    store.put_doc(rel, {k: v for k, v in doc.items() if k not in (SIG_FIELD, SEQ_FIELD)})
    return Outcome(rel, "signed")
