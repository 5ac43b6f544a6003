"""Finding checkpoints in the store: targets, `latest`, listing and removal.

Layout in the main store::

    ckpt/<name>/<tag>/manifest.json    written last by push: a tag exists once its manifest does
    ckpt/<name>/latest.json            {"tag": …}: a hint written after the manifest

`latest` reads the hint and, when it is missing or names a removed tag, falls back to the manifest
with the newest `created` time, so a lost or stale hint costs a listing, never a wrong answer.

Stripes are blobs (`blobs/sha256/…`) on their targets. A manifest records a target as its URI with
any credentials removed (`""` for the main store), and a reader maps it back to the configured URI
that carries them, so no secret is ever written into the store.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlparse, urlunparse

from ..errors import IntegrityError, StoreError
from ..store.core import Store, blob_path
from ..unverified import Reader, Refused, refused
from .layout import LATEST, MANIFEST, Manifest, check_name, ckpt_prefix, latest_rel, manifest_rel


def public_uri(uri: str) -> str:
    """The URI without user:password and with secret-looking query values masked, as recorded in a
    manifest (the same for a full URI and for a `Store.uri`, which is already redacted)."""
    from ..redact import redact

    p = urlparse(uri)
    if p.username or p.password:
        host = p.hostname or ""
        if p.port:
            host = f"{host}:{p.port}"
        uri = urlunparse(p._replace(netloc=host))
    return redact(uri)


def target_key(uri: str) -> str:
    """What identifies a target when matching a manifest's record: scheme, host (or bucket), path and
    the endpoint (`endpoint_override`: two S3 servers may each have a `bucket/stripes`).

    User info and every other query value are left out: a manifest comes from a shared store and is
    not trusted, so what a target is opened with always comes from this node's configuration. The
    endpoint only selects among configured targets; a recorded endpoint is never connected to itself.
    """
    p = urlparse(uri)
    if p.scheme in ("", "file"):
        return "file://" + os.path.normpath(os.path.abspath(p.path)) if p.path else ""
    host = (p.hostname or "") + (f":{p.port}" if p.port else "")
    endpoint = dict(parse_qsl(p.query)).get("endpoint_override", "").lower()
    return f"{p.scheme}://{host}/{p.path.strip('/')}" + (f" at {endpoint}" if endpoint else "")


class Targets:
    """Opens each stripe target once, through this node's configuration only.

    A manifest's target URI is untrusted: it is matched (by `target_key`) to the main store or to a
    configured `[checkpoint] targets` entry and opened through that entry's URI. A target that matches
    neither is refused before anything is opened, so a manifest can neither make this node create a
    directory nor send a request (with its credentials) to a host the manifest chose.
    """

    def __init__(self, store: Store, configured: list[str] | None = None) -> None:
        self.store = store
        self.configured = {target_key(u): u for u in (configured or [])}
        self._open: dict[str, Store] = {}

    def get(self, recorded: str) -> Store:
        if recorded == "":
            return self.store
        key = target_key(recorded)
        if key == target_key(self.store.uri):
            return self.store
        if key not in self.configured:
            raise StoreError(
                f"checkpoint stripe target {key} is neither the store nor a configured [checkpoint] targets "
                "entry; add it to [checkpoint] targets if it is yours"
            )
        if key not in self._open:
            self._open[key] = Store(self.configured[key])
        return self._open[key]

    def check(self, m: Manifest) -> None:
        """Refuse a manifest naming an unknown target before any stripe is read (see `get`)."""
        for recorded in {s.target for s in m.stripes}:
            self.get(recorded)


class NoCheckpoint(StoreError):
    """The store holds no such checkpoint (yet): a job's first start, before its first push."""


class Unverified(NoCheckpoint):
    """The checkpoint is there, but its manifest does not verify (trust.py): not used, and said so."""


def load_manifest(store: Store, name: str, tag: str = "latest") -> Manifest:
    """The manifest of NAME:TAG (TAG may be `latest`); a clear error when there is none."""
    check_name(name)
    if tag == "latest":
        tag = resolve_latest(store, name)
    rel = manifest_rel(name, tag)
    whys: list[str] = []
    doc = store.get_doc(rel, tell=_told(whys, count=True))  # this domain's, else one it reads from; verified
    if doc is None and whys:  # there, but not to be used: said as such, never as "not found"
        raise Unverified(f"checkpoint {name}:{tag} in {store.uri} is not used: {whys[0]}")
    if doc is None:
        raise NoCheckpoint(f"checkpoint {name}:{tag} not found in {store.uri}")
    m = Manifest.from_doc_at(doc, where=f"checkpoint {name}:{tag} manifest")
    if m.name != name or m.tag != tag:
        raise IntegrityError(f"checkpoint {name}:{tag}: its manifest names {m.name}:{m.tag}")
    return m


def resolve_latest(store: Store, name: str) -> str:
    """The newest tag of `name` that verifies. Where every tag is refused (turning signing on over a store
    of unsigned checkpoints), the newest of them is named, with why, so that the warning a start prints
    names the tag it would have used (issue 46), not the last in alphabetical order."""
    with contextlib.suppress(IntegrityError):
        hint = store.get_doc(latest_rel(name))
        tag = hint.get("tag") if hint else None
        if isinstance(tag, str) and store.get_doc(manifest_rel(name, tag)) is not None:
            return tag
    entries = list_tags(store, name)
    if not entries:
        raise NoCheckpoint(f"checkpoint {name}: no tags in {store.uri}")
    usable = [e for e in entries if not e.error]
    return (usable or entries)[-1].tag


@dataclass
class Entry:
    name: str
    tag: str
    created: float
    size: int
    files: int
    stripes: int
    cell_size: int
    error: str = ""


def list_names(store: Store) -> list[str]:
    return store.list_dirs("ckpt")


def list_tags(store: Store, name: str) -> list[Entry]:
    """Every readable tag of `name`, oldest first (unreadable manifests are listed with their error)."""
    out = []
    for tag in store.list_dirs(ckpt_prefix(name)):
        rel = f"{ckpt_prefix(name)}/{tag}/{MANIFEST}"
        whys: list[str] = []
        try:
            doc = store.get_doc(rel, across=False, tell=_told(whys))
            if doc is None:
                if whys:
                    out.append(Entry(name, tag, _created(store, rel), 0, 0, 0, 0, error=f"unverified: {whys[0]}"))
                continue  # a push in progress, or a removal: no manifest, no tag
            m = Manifest.from_doc_at(doc)
        except IntegrityError as e:
            out.append(Entry(name, tag, 0.0, 0, 0, 0, 0, error=str(e)))
            continue
        out.append(Entry(name, tag, m.created, m.total_size, len(m.files), m.k, m.cell_size))
    return sorted(out, key=lambda e: (e.created, e.tag))


def _told(whys: list[str], count: bool = False) -> Refused:
    """A `Store.get_doc` listener that keeps why a document was refused, for the caller to say in its own
    words (a tag's row, a checkpoint stage's warning); `count`: also in the start's line (unverified.py)."""

    def tell(store: Reader, rel: str, domain: str, why: str) -> None:
        whys.append(why)
        if count:
            refused(store, rel, domain, why)

    return tell


def _created(store: Store, rel: str) -> float:
    """When an unverified manifest says it was pushed: for the order of a listing only, nothing else."""
    with contextlib.suppress(ValueError, StoreError):
        created = json.loads(store.get_bytes(rel) or b"{}").get("created")
        if isinstance(created, int | float) and not isinstance(created, bool):
            return float(created)
    return 0.0


def write_latest(store: Store, name: str, tag: str, created: float) -> None:
    store.put_doc(latest_rel(name), {"tag": tag, "created": created})


def remove(store: Store, name: str, tag: str, configured_targets: list[str] | None = None) -> int:
    """Remove NAME:TAG: the manifest first (readers stop seeing it), then the stripes no other tag uses.

    Stripes are content-addressed, so two tags (even of different names) may share one; the set of
    stripes still referenced is gathered from every manifest in the store before anything is deleted.
    Returns the number of stripe objects deleted.
    """
    m = load_manifest(store, name, tag)
    store.delete(manifest_rel(name, m.tag))
    if store.is_local or store.kind == "hdfs":
        store.delete_dir(f"{ckpt_prefix(name)}/{m.tag}")  # object stores have no directories to remove
    still: set[tuple[str, str]] = set()
    for other in list_names(store):
        for t in store.list_dirs(ckpt_prefix(other)):
            data = store.get_bytes(f"{ckpt_prefix(other)}/{t}/{MANIFEST}")
            if data is None:
                continue
            with contextlib.suppress(IntegrityError):
                for s in Manifest.from_json(data).stripes:
                    still.add((s.target, s.digest))
    targets = Targets(store, configured_targets)
    deleted = 0
    for target, digest in {(s.target, s.digest) for s in m.stripes} - still:
        try:
            targets.get(target).delete(blob_path(digest))
            deleted += 1
        except (StoreError, OSError):
            pass  # an unreachable target keeps an orphan stripe; the manifest is already gone
    remaining = list_tags(store, name)
    if remaining:
        newest = remaining[-1]
        write_latest(store, name, newest.tag, newest.created)
    else:
        store.delete(latest_rel(name))
    return deleted


def describe(m: Manifest) -> dict[str, Any]:
    return {
        "name": m.name,
        "tag": m.tag,
        "created": m.created,
        "size": m.total_size,
        "files": len(m.files),
        "stripes": m.k,
        "cell_size": m.cell_size,
        "targets": sorted({s.target or "(store)" for s in m.stripes}),
    }


__all__ = ["LATEST", "Targets", "describe", "list_names", "list_tags", "load_manifest", "remove", "write_latest"]
