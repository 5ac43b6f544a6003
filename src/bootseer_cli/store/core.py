"""The store: content-addressed blobs, small JSON refs and single-flight leases over any pyarrow.fs
(the filesystem itself, with its atomic writes and listing, is `fs.StoreFS`).

Layout (DESIGN.md section 3)::

    blobs/sha256/ab/<digest>      immutable, verified against the digest on every read
    refs/<kind>/<key>.json        written last, after the blobs they name
    leases/<key>                  single-flight: owner, expiry
    ckpt/…, events/…              owned by their modules, through the generic put/get/list helpers

Blobs and refs are published atomically (see `fs`): a reader never uses a partial object.

Leases are compare-and-swap where the store offers it. On file:// a lease is created with link(),
which fails if it exists (atomic). On S3 servers that honour conditional writes (`conditional`) a lease
is created with `If-None-Match: *` and renewed, taken over or released with `If-Match: <etag>`: of
several takers exactly one wins, however long any of them stalls. Elsewhere (GCS, HDFS, an S3 server
that ignores the headers; `bootseer doctor` says which) pyarrow exposes no create-if-absent, so a
lease is taken with a claim object per taker and Lamport's bakery (`leases`): exactly one of
several takers wins however long any of them stalls, as long as its claim lives (a TTL). Expired
leases are taken over the same way.
A lease records its TTL; its holder renews it (every TTL/3 in the keepers) and releases it only
while it is still the owner (compare, then write), and a reader allows for clock skew: see
`Store.lease_live` and `LEASE_SKEW_S`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..settings import Settings

from ..digests import sha256_file
from ..errors import BlobMissing, IntegrityError, StoreError
from ..freshness import SEQ_FIELD, Seen, next_seq
from ..trust import SIG_FIELD, Trust, announce_unverified, unsigned
from ..unverified import Refused, refused
from .fs import SHARED, StoreFS, client_error
from .leases import LEASE_SKEW_S, Lease, drop_claim, renew_claim, swap_lease, take_by_claims, take_lease

CHUNK = 4 << 20

Progress = Callable[[int], None]


# Top-level names of the layout before trust domains: their documents are read by gc only (to keep
# the blobs they name), never used by a stage.
LEGACY_TOPS = frozenset({"refs", "leases", "ckpt", "events", "swarm"})


def _warn_once(msg: str) -> None:
    """A refused document is a miss, said once per process (a stage may look at it several times)."""
    from ..redact import warn

    warn(msg, once=True)


def blob_path(digest: str) -> str:
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise IntegrityError(f"not a sha256 digest: {digest!r}")
    return f"blobs/sha256/{digest[:2]}/{digest}"


def _safe_key(key: str) -> str:
    """Ref and lease names come from digests and user names; keep them one path segment each."""
    if not key or key.startswith(".") or "/" in key or "\\" in key or "\0" in key:
        raise StoreError(f"invalid store key: {key!r}")
    return key


class Store(StoreFS):
    """A bootseer store at a pyarrow.fs URI (`file:///…`, `s3://bucket/prefix?endpoint_override=…`), seen
    from one trust domain: refs, leases, checkpoints, swarm entries and events are read and written
    under `<domain>/`, blobs are shared (trust.py). Without `use_trust`, the domain is the user's and
    documents are unsigned."""

    def __init__(self, uri: str, settle_s: float = 1.0) -> None:
        super().__init__(uri, settle_s)
        self.use_trust(unsigned())
        self.seen: Seen | None = None  # the node's high-water marks of signed documents (freshness.py)

    # ---- blobs ---------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return self.exists(blob_path(digest))

    def put_blob_file(
        self, path: Path, digest: str | None = None, progress: Progress | None = None, own: bool = False
    ) -> str:
        """Upload a local file as a blob; returns its digest. A blob already present is not re-sent.

        On a local store "present" is checked by digest, not size: the node cache hard-links the
        store's blobs, so a byte flipped in one is flipped in both, and a republish must mend it.
        `own`: the file is bootseer's own, just written into the node cache and adopted into it next
        (a capture, an env image), which links the stored copy anyway (`BlobCache.adopt`); a local
        store on the same filesystem then takes a hard link of it, not a copy of its bytes (a 260 MB
        image cost 2.5 s to copy here). Never for a file a job can name (a checkpoint's)."""
        digest = digest or sha256_file(path)
        rel = blob_path(digest)
        if self.exists(rel) and self.size(rel) == path.stat().st_size and self._present_whole(rel, digest):
            if progress:
                progress(path.stat().st_size)
            return digest
        if own and self.is_local and self._link_in(path, rel):
            if progress:
                progress(path.stat().st_size)
            return digest
        try:
            with open(path, "rb") as src, self._atomic_output(rel) as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    if progress:
                        progress(len(chunk))
        except OSError as e:
            raise StoreError(f"store {self.uri}: cannot upload blob {digest[:12]}: {client_error(e)}") from None
        return digest

    def _link_in(self, path: Path, rel: str) -> bool:
        """Link our own `path` in at `rel` of this local store (a temporary name, then a rename, as
        every write here is whole or absent); False where a link cannot be made (another filesystem,
        links refused): the caller copies. The link keeps the file's mode, which was made, as a copy
        would be, from the umask."""
        import uuid  # lazily: it imports platform

        self._ensure_parent(rel)
        final = self.path(rel)
        tmp = f"{final}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            os.link(path, tmp, follow_symlinks=False)
        except OSError:
            return False
        try:
            os.replace(tmp, final)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        return True

    def _present_whole(self, rel: str, digest: str) -> bool:
        """Whether the stored object of the right size is whole: by digest on a local store (a local
        read), by size alone on an object store (a download would cost what the upload saves)."""
        if not self.is_local:
            return True
        try:
            return sha256_file(self.path(rel)) == digest
        except OSError:
            return False

    def put_blob_stream(
        self, digest: str, chunks: Iterable[bytes], size: int | None = None, progress: Progress | None = None
    ) -> str:
        """Upload a blob whose digest is known in advance from an iterable of chunks (no local copy).

        For data assembled on the fly (checkpoint stripes are cut from many files). The bytes are
        hashed again on the way; a mismatch removes the object and raises IntegrityError.
        """
        rel = blob_path(digest)
        if self.exists(rel) and (size is None or self.size(rel) == size) and self._present_whole(rel, digest):
            if progress and size:
                progress(size)
            return digest
        h = hashlib.sha256()
        try:
            with self._atomic_output(rel) as out:
                for chunk in chunks:
                    h.update(chunk)
                    out.write(chunk)
                    if progress:
                        progress(len(chunk))
                if h.hexdigest() != digest:
                    raise IntegrityError(f"blob {digest[:12]}: the data changed while it was uploaded")
        except IntegrityError:
            with contextlib.suppress(StoreError, OSError):  # the IntegrityError is the one to report
                self.delete(rel)
            raise
        except OSError as e:
            raise StoreError(f"store {self.uri}: cannot upload blob {digest[:12]}: {client_error(e)}") from None
        return digest

    def put_blob_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        rel = blob_path(digest)
        if not (self.exists(rel) and self.size(rel) == len(data) and self._present_whole(rel, digest)):
            self.put_bytes(rel, data)
        return digest

    def get_blob_bytes(self, digest: str) -> bytes:
        data = self.get_bytes(blob_path(digest))
        if data is None:
            raise BlobMissing(f"store {self.uri}: blob {digest[:12]} not found")
        if hashlib.sha256(data).hexdigest() != digest:
            raise IntegrityError(f"blob {digest[:12]} in {self.uri} does not match its digest")
        return data

    def fetch_blob(
        self,
        digest: str,
        dest: Path,
        progress: Progress | None = None,
        *,
        link: bool = False,
        base: Path | None = None,
    ) -> int:
        """Download a blob to `dest`, verified; `dest` appears only if the digest matches.

        `link=True` (the node cache, which never writes to its files): on a local store `dest` becomes a
        hard link to the stored blob, verified in place, so the default store and the cache share one
        copy on disk; across filesystems (or where links are refused) the blob is copied as usual.

        `base` (the node cache's root): every directory between it and `dest` is entered without
        following links and must be the acting uid's (`cachedir`), so a user's `sha256/86 -> /etc`
        never makes a more privileged fetch write there. The temporary file, the rename and the
        cleanup all act on that one directory descriptor, by name.
        """
        from .cachedir import download_into, link_into, parent_fd

        rel = blob_path(digest)
        with parent_fd(dest, base) as dfd:
            if link and self.is_local:
                n = link_into(self.path(rel), dfd, dest.name, digest, self.uri)
                if n is not None:
                    if progress:
                        progress(n)
                    return n
            chunks = self.read_chunks(rel, CHUNK, f"blob {digest[:12]}")
            return download_into(chunks, dfd, dest.name, digest, self.uri, progress)

    def delete_blob(self, digest: str) -> None:
        self.delete(blob_path(digest))

    # ---- trust domains and signed documents ---------------------------------------------------
    def use_trust(self, trust: Trust) -> Store:
        """Read and write as `trust` says: its domain is this view's (trust.py)."""
        self.trust = trust
        self.domain = trust.domain
        return self

    def in_domain(self, domain: str) -> Store:
        """A view of another domain of the same store, reading its documents unchecked: for gc, which
        keeps what any domain names and deletes only in its own."""
        view = copy.copy(self)
        view.trust = Trust(domain, verify="off")
        view.domain = domain
        return view

    def domains(self) -> list[str]:
        """Every domain that holds something in this store ("" for documents of the layout before domains)."""
        tops = [d for d in self.top_level() if d != SHARED]
        legacy = [d for d in tops if d in LEGACY_TOPS]
        return ([""] if legacy else []) + [d for d in tops if d not in LEGACY_TOPS]

    @property
    def can_publish(self) -> bool:
        """Whether what this process writes would be used: readers of a domain with verify keys refuse
        unsigned documents, so a node without the key (a training pod, a job) publishes nothing."""
        return self.trust.signer is not None or not self.trust.required

    def put_doc(self, rel: str, doc: Mapping[str, object]) -> None:
        """Write a JSON document in this view's domain, signed when this process holds the domain's key."""
        if not self.can_publish:
            raise StoreError(
                f"not published: {rel} would be unsigned, and readers of domain {self.domain} require a signature "
                "([trust] signing_key is where the key is; jobs without it only read)"
            )
        body = dict(doc)
        if self.trust.signer is not None:  # above the replaced document's: a replay of that one is older
            body[SEQ_FIELD] = next_seq(self.get_bytes(rel))
        signed = self.trust.sign(self.domain, rel, body)
        self.put_bytes(rel, json.dumps(signed, indent=1, sort_keys=True).encode())

    def get_doc(self, rel: str, *, across: bool = True, tell: Refused | None = None) -> dict[str, Any] | None:
        """The JSON document at `rel`, from this domain or (`across`) the next domain it reads from, used
        only if it verifies (trust.py). A forged or unsigned one is a miss, with a warning (unverified.py),
        or told to `tell` instead (a listing that shows it)."""
        for domain in self.trust.domains if across else (self.domain,):
            view = self if domain == self.domain else self._reader(domain)
            data = view.get_bytes(rel)
            if data is None:
                continue
            try:
                doc = json.loads(data)
            except ValueError:
                doc = "not valid JSON"
            if not isinstance(doc, dict):
                if domain == self.domain:
                    what = doc if isinstance(doc, str) else "not a JSON object"
                    raise IntegrityError(f"{rel} in {self.uri} is {what} (truncated or corrupt)")
                continue
            why = self.trust.check(domain, rel, doc)
            if not why and self.seen is not None and self.trust.verifiers and SIG_FIELD in doc:
                why = self.seen.stale(self.uri, domain, rel, doc)
            if why:
                (tell or refused)(self, rel, domain, why)
                continue
            announce_unverified(self.trust, domain, rel)
            doc.pop(SIG_FIELD, None)
            doc.pop(SEQ_FIELD, None)
            return doc
        return None

    def _reader(self, domain: str) -> Store:
        view = copy.copy(self)
        view.domain = domain
        return view

    # ---- refs ----------------------------------------------------------------------------------
    def ref_path(self, kind: str, key: str) -> str:
        return f"refs/{_safe_key(kind)}/{_safe_key(key)}.json"

    def write_ref(self, kind: str, key: str, doc: Mapping[str, object]) -> None:
        self.put_doc(self.ref_path(kind, key), {k: v for k, v in doc.items() if not k.startswith("_")})

    def read_ref(self, kind: str, key: str) -> dict[str, Any] | None:
        """The ref `kind/key` of this domain, else of the first domain read from that has it, verified."""
        return self.get_doc(self.ref_path(kind, key))

    def delete_ref(self, kind: str, key: str) -> None:
        self.delete(self.ref_path(kind, key))

    def list_refs(self, kind: str) -> list[str]:
        """The keys of `kind` in every domain this view reads (each is verified when read)."""
        keys: set[str] = set()
        for domain in self.trust.domains:
            view = self if domain == self.domain else self._reader(domain)
            keys.update(
                p.rsplit("/", 1)[1][: -len(".json")]
                for p in view.list(f"refs/{_safe_key(kind)}")
                if p.endswith(".json")
            )
        return sorted(keys)

    # ---- leases --------------------------------------------------------------------------------
    def _lease_rel(self, key: str) -> str:
        return f"leases/{_safe_key(key)}"

    def _lease_doc(self, key: str, owner: str, expires: float, ttl_s: float) -> bytes:
        import socket

        doc = {"owner": owner, "expires": expires, "ttl": ttl_s, "host": socket.gethostname(), "pid": os.getpid()}
        return json.dumps(self.trust.sign(self.domain, self._lease_rel(key), doc)).encode()

    def read_lease(self, key: str) -> dict[str, Any] | None:
        """The lease document, or a stale one in its place: a torn lease, or one that does not verify
        (a forged lease must not hold anyone back; it is taken over like an expired one)."""
        data = self.get_bytes(self._lease_rel(key))
        return None if data is None else self._lease_from(key, data)

    def _lease_from(self, key: str, data: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(data)
        except ValueError:
            return {"owner": "", "expires": 0.0}  # a torn lease is a stale lease
        if not isinstance(doc, dict):
            return {"owner": "", "expires": 0.0}
        why = self.trust.check(self.domain, self._lease_rel(key), doc)
        if why:
            _warn_once(f"lease {key[:24]} in {self.uri} is ignored: {why}")
            return {"owner": "", "expires": 0.0, "forged": True}
        return doc

    def lease_live(self, key: str, doc: dict[str, Any] | None, ttl_s: float, now: float | None = None) -> bool:
        """Whether a lease document still holds, by this node's clock, allowing for clock skew.

        `ttl_s` is the reader's own TTL for this kind of lease (its settings, never the document's):
        a lease is held for at most that long since it was last written, whatever `ttl` or `expires`
        the document claims, so a forged or buggy lease (`ttl: 4e9`) holds nobody back for longer
        than one TTL of the reader's. Within that, a lease holds until `expires + skew`, skew =
        min(TTL/2, LEASE_SKEW_S): a node whose clock runs ahead of the holder's by less than that
        never takes a live lease. An expiry more than TTL + skew in the future (the writer's clock
        runs ahead, or the document lies) holds only until TTL + skew after the store's own
        modification time of the lease object.
        """
        if not doc:
            return False
        now = time.time() if now is None else now
        try:
            expires, ttl = float(doc.get("expires") or 0), float(doc.get("ttl") or 0)
        except (TypeError, ValueError):
            return False
        if expires != expires or ttl != ttl:  # NaN compares false with everything: a torn lease
            return False
        ttl = min(ttl, ttl_s) if ttl > 0 else ttl_s
        skew = min(ttl / 2, LEASE_SKEW_S)
        if now > expires + skew:
            return False
        if expires > now + ttl + skew:
            written = self._mtime(self._lease_rel(key))
            return written is not None and now <= written + ttl + skew  # unknown mtime: nothing bounds it
        return True

    def _mtime(self, rel: str) -> float | None:
        try:
            info = self.meta.get_file_info(self.path(rel))
        except OSError:
            return None
        return info.mtime.timestamp() if info.mtime is not None else None

    def try_lease(self, key: str, ttl_s: float) -> Lease | None:
        """Take the single-flight lease for `key`, or None if another live owner holds it."""
        import socket
        import uuid  # lazily: it imports platform

        owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        expires = time.time() + ttl_s
        doc = self._lease_doc(key, owner, expires, ttl_s)
        if self.is_local:
            full = Path(self.path(self._lease_rel(key)))
            try:
                full.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # a store under a read-only node cache: read, never written (issue 46)
                raise StoreError(f"store {self.uri}: {e.strerror}; no snapshot can be published there") from None
            for _ in range(2):
                # Write the whole document under a private name, then hard-link it into place:
                # link() fails if the lease exists, and a reader never sees a half-written lease.
                tmp = full.with_name(f".{full.name}.{uuid.uuid4().hex[:8]}")
                tmp.write_bytes(doc)
                try:
                    os.link(tmp, full)
                except FileExistsError:
                    current = self.read_lease(key)
                    if self.lease_live(key, current, ttl_s):
                        return None
                    self._remove_stale_local(key, full, (current or {}).get("owner"), ttl_s)
                    continue
                finally:
                    tmp.unlink(missing_ok=True)
                return Lease(self, key, owner, expires, ttl_s)
            return None
        cas = self.conditional()
        if cas is not None:
            etag = take_lease(self, cas, key, owner, ttl_s, doc)
            return None if etag is None else Lease(self, key, owner, expires, ttl_s, etag=etag)
        if self.lease_live(key, self.read_lease(key), ttl_s):
            return None
        try:  # no conditional writes: a claim per taker, Lamport's bakery
            won = take_by_claims(self, key, owner, ttl_s, doc)
        except StoreError:  # a server may refuse one of several racing writes (rclone's `serve s3` did):
            if self.lease_live(key, self.read_lease(key), ttl_s):  # a race lost, when another's lease is there
                return None
            raise
        return Lease(self, key, owner, expires, ttl_s) if won else None

    def _remove_stale_local(self, key: str, full: Path, stale_owner: str | None, ttl_s: float) -> None:
        """Move a stale lease aside (rename is atomic: one taker wins); if what was moved turns out
        to be a fresh lease that another taker created meanwhile, put it back."""
        aside = self._move_aside(full)
        if aside is None:
            return
        moved = self._lease_from(key, aside.read_bytes())
        if moved.get("owner") != stale_owner and self.lease_live(key, moved, ttl_s):
            with contextlib.suppress(FileExistsError):
                os.link(aside, full)
        aside.unlink(missing_ok=True)

    @staticmethod
    def _move_aside(full: Path) -> Path | None:
        """Rename the lease file to a private name: of several processes, exactly one gets it."""
        import uuid  # lazily: it imports platform

        aside = full.with_name(f".{full.name}.aside-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(full, aside)
        except FileNotFoundError:
            return None
        return aside

    def _still_ours(self, lease: Lease) -> bool:
        """Compare before a write: the lease names this owner and has not expired by this clock
        (an expired lease may be in the middle of being taken over, so it is not ours to touch)."""
        current = self.read_lease(lease.key)
        return (
            current is not None
            and bool(current)
            and current.get("owner") == lease.owner
            and float(current.get("expires") or 0) > time.time()
        )

    def renew_lease(self, lease: Lease, ttl_s: float) -> bool:
        """Extend `lease` if it is still ours (compare, then write); False and `lease.lost` otherwise.

        On a local store the compare and the write are atomic: the lease file is renamed aside (one
        process gets it), checked, and the renewed document linked into place, which fails rather
        than overwrite a lease another node created meanwhile. With conditional writes (`conditional`)
        it is one request, If-Match the version this holder wrote. On any other object store the read
        and the write are two requests; a taker only acts on an expired lease (by its clock, with the skew
        allowance), and the owner renews only a lease that has not expired by its own clock, so the
        window needs a clock skew beyond the allowance.
        """
        if lease.etag:
            return swap_lease(self, lease, ttl_s)
        if lease.lost or not self._still_ours(lease):
            lease.lost = True
            return False
        expires = time.time() + ttl_s
        doc = self._lease_doc(lease.key, lease.owner, expires, ttl_s)
        if self.is_local:
            if not self._swap_local(lease, doc):
                lease.lost = True
                return False
        else:
            self.put_bytes(self._lease_rel(lease.key), doc)
            renew_claim(self, lease.key, lease.owner, ttl_s)
        lease.expires, lease.ttl_s = expires, ttl_s
        return True

    def _swap_local(self, lease: Lease, doc: bytes | None) -> bool:
        """Atomically replace (or, `doc` None, remove) our own lease file; False: it was not ours."""
        import uuid  # lazily: it imports platform

        full = Path(self.path(self._lease_rel(lease.key)))
        aside = self._move_aside(full)
        if aside is None:
            return False
        try:
            try:
                moved = json.loads(aside.read_text() or "{}")
            except ValueError:
                moved = {}
            if moved.get("owner") != lease.owner:
                with contextlib.suppress(FileExistsError):
                    os.link(aside, full)  # someone else's: put it back
                return False
            if doc is None:
                return True
            tmp = full.with_name(f".{full.name}.{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(doc)
            try:
                os.link(tmp, full)  # fails if a taker created a lease in the instant it was aside
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)
            return True
        finally:
            aside.unlink(missing_ok=True)

    def release_lease(self, lease: Lease) -> None:
        """Remove the lease if it is still ours; never a lease another node has taken over.

        Local store: atomic (rename aside, check, remove). Object store: compare, then delete; the
        delete is skipped once the lease has expired by this clock (a taker may be acting on it),
        so deleting a taker's lease needs a clock skew beyond the allowance (see `lease_live`).
        """
        if lease.etag:  # a released lease stays as an expired version (a delete cannot be conditional here)
            swap_lease(self, lease, 0.0, release=True)
            return
        if lease.lost or not self._still_ours(lease):
            return
        if self.is_local:
            self._swap_local(lease, None)
        else:
            self.delete(self._lease_rel(lease.key))
            drop_claim(self, lease.key, lease.owner)

    # ---- health --------------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Write, read back and delete a probe object (used by `doctor`)."""
        import uuid  # lazily: it imports platform

        rel = f"leases/.probe-{uuid.uuid4().hex[:12]}"
        payload = uuid.uuid4().bytes
        self.put_bytes(rel, payload)
        try:
            if self.get_bytes(rel) != payload:
                raise StoreError(f"store {self.uri}: a probe object did not read back")
        finally:
            self.delete(rel)


def open_store(uri: str | None, trust: Trust | None = None) -> Store:
    """The store at `uri` (`[store] uri`), or the embedded local store when None, seen from `trust`'s
    domain (default: the user's, unsigned)."""
    from ..paths import default_store_uri

    store = Store(uri or default_store_uri())
    return store.use_trust(trust) if trust is not None else store


def open_store_for(settings: Settings) -> Store:
    """The configured store, seen as `[store] domain` and `[trust]` say (keys loaded here)."""
    from ..paths import blob_cache_dir
    from ..trust import trust_for

    store = open_store(settings.store.uri, trust_for(settings))
    store.seen = Seen(settings.store.cache_dir or blob_cache_dir())
    return store
