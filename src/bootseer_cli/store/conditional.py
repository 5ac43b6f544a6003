"""Conditional writes on object stores, for the single-flight leases (issue 28, item 4).

pyarrow.fs writes an object unconditionally, so on S3 a lease was taken by writing, waiting a settle
time and reading back, and a node that stalled between its check and its write (seconds: a GC pause,
a slow request) overwrote a lease another node had meanwhile taken: both held it. S3 (since 2024) and
S3-compatible servers such as MinIO and Ceph take the HTTP preconditions on PUT: `If-None-Match: *`
creates an object only if there is none, `If-Match: <etag>` replaces it only if it is still the
version that was read. With them a lease is compare-and-swap: exactly one of several takers wins,
however long any of them stalls.

The client is `obstore` (Python bindings of the Rust `object_store` crate that Arrow's Rust side and
DataFusion use): one small wheel without dependencies, which exposes exactly these modes (`put(...,
mode="create")`, `mode={"e_tag": ...}`) for S3, GCS and Azure. boto3 would do for S3, but is a large
pure-Python stack with its own import cost; pyarrow.fs has no conditional put at all. It is imported
only here, and only when a lease is taken on an object store: blobs, refs and everything else still
go through pyarrow.fs.

A server that ignores the headers (rclone's `serve s3`, older MinIO and Ceph) would make a
conditional write silently unconditional, so support is probed once per process and server (a
create over an existing object must fail, and so must a replace of a version that is not there);
without it the store takes leases with a claim per taker and Lamport's bakery (`leases.py`),
which `bootseer doctor` says. GCS and HDFS keep that protocol too (not probed here yet).

This module is the client only: the lease protocols over it live in `leases.py`, and `fs.StoreFS`
uses it for one-request deletes. It sees the store through `S3Location` (what `StoreFS` offers), not
the class itself, so that the filesystem adapter can import it without a circle.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol
from urllib.parse import parse_qsl, unquote, urlparse

# A lease request is small: a server that has not answered in this long is down (the stage falls back).
REQUEST_TIMEOUT_S = 10.0
_probed: dict[str, bool] = {}
_probe_lock = threading.Lock()


class S3Location(Protocol):
    """What the client needs of the store it talks to (a `fs.StoreFS` has it all)."""

    @property
    def kind(self) -> str: ...

    @property
    def region(self) -> str: ...

    def path(self, rel: str) -> str: ...

    def uri_with_credentials(self) -> str: ...


class Unsupported(Exception):
    """This store (or this client) offers no conditional writes."""


@dataclass
class Versioned:
    """An object's bytes and the version (ETag) they were read at."""

    data: bytes
    etag: str


class ConditionalS3:
    """Create-if-absent and replace-if-unchanged on the S3 store a `StoreFS` is opened on."""

    def __init__(self, fs: S3Location) -> None:
        try:
            import obstore
            import obstore.exceptions as oe
            from obstore.store import S3Store
        except ImportError as e:  # an install without it: the old protocol
            raise Unsupported(f"obstore is not installed ({e})") from None
        self._ob, self._oe = obstore, oe
        self._fs = fs
        full = fs.uri_with_credentials()
        parsed = urlparse(full)
        query = dict(parse_qsl(parsed.query))
        config: dict[str, object] = {"conditional_put": "etag"}
        region = query.get("region") or fs.region  # pyarrow resolved the bucket's region
        if region:
            config["region"] = region
        if query.get("force_virtual_addressing", "").lower() in ("1", "true", "yes"):
            config["virtual_hosted_style_request"] = True
        if "endpoint_override" in query:
            scheme = query.get("scheme", "https")
            config["endpoint"] = f"{scheme}://{query['endpoint_override']}"
        if parsed.username:
            config["access_key_id"] = unquote(parsed.username)
            config["secret_access_key"] = unquote(parsed.password or "")
            if "session_token" in query:
                config["session_token"] = query["session_token"]
        self.key = f"{config.get('endpoint', 'aws')}/{parsed.hostname}"  # which server and bucket (no secret)
        self._store = S3Store(
            parsed.hostname or "",
            config=config,  # type: ignore[arg-type]
            client_options={
                "allow_http": query.get("scheme") == "http",
                "timeout": timedelta(seconds=REQUEST_TIMEOUT_S),
                "connect_timeout": timedelta(seconds=REQUEST_TIMEOUT_S / 2),
            },
            retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=REQUEST_TIMEOUT_S)},
        )

    def _key(self, rel: str) -> str:
        """The object key of `rel` (the store's root holds the bucket, then the prefix)."""
        return self._fs.path(rel).split("/", 1)[1]

    def create(self, rel: str, data: bytes) -> str | None:
        """Create `rel` if no object is there; its ETag, or None when one exists."""
        try:
            res = self._ob.put(self._store, self._key(rel), data, mode="create")
        except (self._oe.AlreadyExistsError, self._oe.PreconditionError):
            return None
        return str(res["e_tag"] or "")

    def replace(self, rel: str, data: bytes, etag: str) -> str | None:
        """Replace `rel` only if it is still at version `etag`; the new ETag, or None when it is not."""
        try:
            res = self._ob.put(self._store, self._key(rel), data, mode={"e_tag": etag})
        except (self._oe.PreconditionError, self._oe.NotFoundError, self._oe.AlreadyExistsError):
            return None
        return str(res["e_tag"] or "")

    def read(self, rel: str) -> Versioned | None:
        """The object and its ETag; None when there is none."""
        try:
            got = self._ob.get(self._store, self._key(rel))
            data = bytes(got.bytes())
        except self._oe.NotFoundError:
            return None
        return Versioned(data, str(got.meta.get("e_tag") or ""))

    def delete(self, rel: str) -> None:
        with contextlib.suppress(self._oe.NotFoundError):
            self._ob.delete(self._store, self._key(rel))

    def honoured(self) -> bool:
        """Whether the server enforces the preconditions (probed once per process and server): a create
        over an existing object and a replace of a version that is not there must both be refused."""
        with _probe_lock:
            if self.key not in _probed:
                _probed[self.key] = self._probe()
            return _probed[self.key]

    def _probe(self) -> bool:
        rel = f"leases/.cas-probe-{uuid.uuid4().hex[:12]}"
        try:
            if self.create(rel, b"1") is None:
                return False
            try:
                return self.create(rel, b"2") is None and self.replace(rel, b"3", '"not-its-etag"') is None
            finally:
                self.delete(rel)
        except self._oe.BaseError:  # NotSupported, a refused header, a server that failed: no CAS
            return False


def client(fs: S3Location) -> ConditionalS3 | None:
    """An obstore client of this S3 store, not probed (plain reads, puts and deletes need no
    preconditions); None when obstore is missing or rejects the store's configuration."""
    if fs.kind != "s3":
        return None
    try:
        return ConditionalS3(fs)
    except (Unsupported, ValueError, OSError):
        return None
    except Exception as e:  # obstore's own errors (a configuration it rejects)
        if type(e).__module__.startswith("obstore"):
            return None
        raise


def conditional(fs: S3Location) -> ConditionalS3 | None:
    """The conditional writer of this store when it has one that its server honours, else None (claims
    and Lamport's bakery, `leases`). Any failure to set it up or to probe means None."""
    cas = client(fs)
    try:
        return cas if cas is not None and cas.honoured() else None
    except (Unsupported, ValueError, OSError):
        return None
    except Exception as e:  # obstore's own errors: the old protocol
        if type(e).__module__.startswith("obstore"):
            return None
        raise
