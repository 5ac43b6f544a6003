"""The store's filesystem: a pyarrow.fs URI opened (or a local directory, without pyarrow), and the
generic operations every part of the store is built on: paths, atomic writes, reads, deletes, listing.

Atomic publication. On filesystems with rename (file://, hdfs://) an object is written under a
temporary name and renamed. Object stores (s3://, gs://) make an object visible only when its upload
completes, so an object is put under its final key directly; a failed upload is deleted, and since
every reader of a blob verifies its digest and refs are written last, a partial object is never used.
"""

from __future__ import annotations

import builtins  # `list` is a method of StoreFS: annotations below it name the type so
import contextlib
import errno
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import urlparse

from ..errors import StoreError
from ..redact import redact, redact_text
from .guard import META_ATTEMPTS, META_CONNECT_S, META_REQUEST_S, Breaker, Chunks, Guarded, Ranged

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    from .conditional import ConditionalS3

KEEP_NAME = ".keep"
SUPPORTED_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "")
_OBJECT_STORES = ("s3", "gcs")


def _local_root(uri: str, scheme: str) -> str | None:
    """The directory of a local store URI (a path, or file:// without a host); None for any other."""
    if scheme == "":
        return str(Path(uri).expanduser().resolve())
    parsed = urlparse(uri)
    if scheme == "file" and parsed.netloc in ("", "localhost") and not parsed.query:
        from urllib.parse import unquote

        return unquote(parsed.path) or "/"
    return None


SHARED = "blobs"  # the one top-level prefix outside every domain


@dataclass(frozen=True)
class StoredFile:
    """A file in the store: its path relative to the store's root, size and modification time."""

    rel: str
    size: int
    mtime: float


class StoreFS:
    """A directory tree at a pyarrow.fs URI (`file:///…`, `s3://bucket/prefix?endpoint_override=…`, a path).

    `Store` adds the blobs, refs and leases on top."""

    def __init__(self, uri: str, settle_s: float = 1.0) -> None:
        # `uri` is the display form (no credentials): every message uses it. The full URI, which may
        # carry a secret, stays private: it opens the filesystem and is handed to a child process
        # only through its environment or a 0600 file (`uri_with_credentials`).
        self._full_uri = uri
        self.uri = redact(uri)
        self.settle_s = settle_s
        scheme = urlparse(uri).scheme
        if scheme not in SUPPORTED_SCHEMES:
            raise StoreError(
                f"store URI {self.uri!r}: unknown scheme {scheme!r} (use file://, s3://, gs://, hdfs:// or a path)"
            )
        self._fs: pafs.FileSystem | None = None
        self._meta_fs: pafs.FileSystem | None = None  # small requests' client, where it differs (S3)
        self._meta: Guarded | None = None
        self.breaker = Breaker()  # a store that did not answer is not asked again for a while (`meta`)
        self.domain = ""  # the trust domain this view reads and writes (Store sets it); "" is the top level
        local = _local_root(uri, scheme)  # a local store opens without pyarrow (restores start faster)
        if local is not None:
            self.root = local
        else:
            import pyarrow as pa
            import pyarrow.fs as pafs

            try:
                if scheme == "s3":
                    self._fs, self._meta_fs, self.root = _open_s3(uri)
                elif scheme in ("gs", "gcs"):
                    self._fs, self.root = _open_gcs(uri)
                elif scheme in ("hdfs", "viewfs"):
                    self._fs, self.root = _open_hdfs(uri)
                else:
                    self._fs, self.root = pafs.FileSystem.from_uri(uri)
            except (StoreError, OSError, ValueError, pa.ArrowException) as e:  # pyarrow's text is useful
                raise StoreError(f"store {self.uri!r}: {_open_error(scheme, e)}") from None
        self.root = self.root.rstrip("/")
        self.kind = "local" if self._fs is None else self._fs.type_name  # "local", "s3", "gcs", "hdfs", …
        self.is_local = self.kind == "local"
        if self.is_local:
            try:
                Path(self.root).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                if e.errno in (errno.EROFS, errno.EACCES):  # under a read-only cache: empty, nothing published
                    return
                raise StoreError(f"store {self.uri!r}: cannot create {self.root}: {e.strerror}") from None

    @property
    def fs(self) -> pafs.FileSystem:
        """The pyarrow filesystem for transfers; for a local store made on first use (pyarrow costs
        ~0.3 s to import). Its failures are the caller's to retry (the stripe reader rides out a cut)."""
        if self._fs is None:
            import pyarrow.fs as pafs

            self._fs = pafs.LocalFileSystem()
        return self._fs

    @property
    def region(self) -> str:
        """The bucket's region as pyarrow resolved it ("" where the filesystem has none)."""
        return str(getattr(self.fs, "region", "") or "")

    @property
    def meta(self) -> pafs.FileSystem:
        """The filesystem for small requests (stats, refs, listings, deletes), behind the store's breaker
        (`guard`): on S3 a client whose requests give up soon (`guard.META_*`), so a store
        that never answers costs a start ~20 s once, not the transfers' long timeout per request."""
        if self._meta is None:
            self._meta = Guarded(self._meta_fs if self._meta_fs is not None else self.fs, self.breaker)
        return self._meta

    def uri_with_credentials(self) -> str:
        """The full URI, secret included: only for a child's environment or a 0600 file, never argv or text."""
        return self._full_uri

    def conditional(self) -> ConditionalS3 | None:
        """Create-if-absent and replace-if-unchanged on this store, when its server honours conditional
        writes (an S3 server, probed once per process; `conditional`); None elsewhere. Local stores have
        their own exclusive create (link), used by the leases directly."""
        if not hasattr(self, "_cas"):
            from .conditional import conditional

            self._cas = conditional(self)
        return self._cas

    # ---- generic paths -------------------------------------------------------------------------
    def scoped(self, rel: str) -> str:
        """`rel` within the store: under this view's domain, except blobs, which every domain shares
        (content-addressed and verified by digest, they need no owner)."""
        if not self.domain or rel == SHARED or rel.startswith(SHARED + "/"):
            return rel
        return f"{self.domain}/{rel}"

    def path(self, rel: str) -> str:
        s = self.scoped(rel)
        return f"{self.root}/{s}" if self.root else s

    def exists(self, rel: str) -> bool:
        import pyarrow.fs as pafs

        try:
            return self.meta.get_file_info(self.path(rel)).type != pafs.FileType.NotFound
        except OSError as e:
            raise StoreError(f"store {self.uri}: cannot stat {rel}: {client_error(e)}") from None

    def size(self, rel: str) -> int:
        import pyarrow.fs as pafs

        info = self.meta.get_file_info(self.path(rel))
        if info.type == pafs.FileType.NotFound:
            raise StoreError(f"store {self.uri}: {rel} not found")
        return int(info.size or 0)

    def _ensure_parent(self, rel: str) -> None:
        parent = self.path(rel).rsplit("/", 1)[0]
        if not self.kind.startswith(_OBJECT_STORES):
            self.fs.create_dir(parent, recursive=True)

    @contextlib.contextmanager
    def _atomic_output(self, rel: str, fs: pafs.FileSystem | None = None) -> Iterator[IO[bytes]]:
        """A stream that appears at `rel` whole or not at all (see the module docstring), written
        through `fs` (default: the transfers' client)."""
        import uuid  # lazily: it imports platform

        fs = fs if fs is not None else self.fs
        self._ensure_parent(rel)
        final = self.path(rel)
        direct = self.kind in _OBJECT_STORES
        target = final if direct else f"{final}.tmp-{uuid.uuid4().hex[:12]}"
        out = fs.open_output_stream(target)
        try:
            yield out
            out.close()
            if not direct:
                fs.move(target, final)
        except BaseException:
            # Cleanup on the way out: the original error is the one to report (pyarrow raises OSError).
            with contextlib.suppress(OSError):
                out.close()
            with contextlib.suppress(OSError):
                fs.delete_file(target)
            raise

    def put_bytes(self, rel: str, data: bytes) -> None:
        """Write a small object (a ref, a lease, a run's events) through the small requests' client: a
        silent store fails it soon, or at once once it is taken for down (`guard`)."""
        try:
            with self._atomic_output(rel, self.meta) as out:
                out.write(data)
        except OSError as e:
            self.breaker.trip(e)  # the upload itself happens at close, past the guard's call
            raise StoreError(f"store {self.uri}: cannot write {rel}: {client_error(e)}") from None

    def get_bytes(self, rel: str) -> bytes | None:
        """The whole object, or None when it does not exist."""
        if self.is_local:  # plain file I/O: no pyarrow on a local store's read path
            try:
                return Path(self.path(rel)).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as e:
                raise StoreError(f"store {self.uri}: cannot read {rel}: {client_error(e)}") from None
        try:
            with self.meta.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            if "not found" in str(e).lower() or "no such file" in str(e).lower():
                return None
            raise StoreError(f"store {self.uri}: cannot read {rel}: {client_error(e)}") from None

    def delete(self, rel: str) -> None:
        if self.kind not in _OBJECT_STORES:
            with contextlib.suppress(FileNotFoundError):
                self.meta.delete_file(self.path(rel))
            return
        if self._delete_in_one_request(rel):
            return
        self._keep_prefix(rel)
        try:
            self.meta.delete_file(self.path(rel))
        except FileNotFoundError:
            pass
        except OSError:
            # The object is deleted before pyarrow writes the parent marker; a server that refuses
            # the marker (the prefix is a real directory there) has still done the delete.
            if self.exists(rel):
                raise

    def _delete_in_one_request(self, rel: str) -> bool:
        """Delete `rel` on S3 with one DELETE (obstore), and say whether that was done.

        After a delete pyarrow checks the parent "directory" and PUTs a marker object for it; a server
        that maps keys to files (rclone's `serve s3`) answers that PUT with an error, which pyarrow
        retries with back-off: about 2 s per delete (93 of them in a quarter of the test suite), and
        one HEAD and one PUT more per delete on every server. obstore's delete writes no marker, so the
        prefix needs no `.keep` either. Without obstore, or on an error of its own, pyarrow deletes."""
        if self.kind != "s3":
            return False
        if not hasattr(self, "_one_request"):
            from .conditional import client

            self._one_request = client(self)
        if self._one_request is None:
            return False
        try:
            self._one_request.delete(rel)
        except Exception as e:  # obstore's own errors: pyarrow's path below decides
            if not type(e).__module__.startswith("obstore"):
                raise
            return False
        return True

    def _keep_prefix(self, rel: str) -> None:
        """Make sure a delete never empties its prefix on an object store.

        pyarrow writes a "directory marker" object after a delete, and S3 servers that map keys to
        files (rclone's `serve s3`) store it, when the delete emptied the prefix, as an empty *file*
        named like the prefix, after which nothing can be written under the prefix again. A hidden
        `.keep` object keeps the prefix non-empty, on every server, for one small PUT per prefix.
        """
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        keep = f"{parent}/{KEEP_NAME}" if parent else KEEP_NAME
        if not self.exists(keep):
            with self.fs.open_output_stream(self.path(keep)) as out:
                out.write(b"")

    def delete_dir(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.meta.delete_dir(self.path(rel))

    def _file_infos(self, prefix: str, recursive: bool) -> list[pafs.FileInfo]:
        """pyarrow's infos of the files under `prefix` (temporaries and prefix markers left out)."""
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self.path(prefix), allow_not_found=True, recursive=recursive)
        try:
            infos = self.meta.get_file_info(sel)
        except OSError as e:
            raise StoreError(f"store {self.uri}: cannot list {prefix}: {client_error(e)}") from None
        return [i for i in infos if i.type == pafs.FileType.File and ".tmp-" not in i.path and i.base_name != KEEP_NAME]

    def _rel(self, full: str) -> str:
        rel = full[len(self.root) + 1 :] if self.root else full
        return rel.removeprefix(f"{self.domain}/") if self.domain else rel

    def list(self, prefix: str, recursive: bool = False) -> list[str]:
        """Relative paths of the files under `prefix` (empty when it does not exist)."""
        return sorted(self._rel(i.path) for i in self._file_infos(prefix, recursive))

    def list_info(self, prefix: str) -> builtins.list[StoredFile]:
        """The files under `prefix`, recursively, with size and modification time (temporaries left out)."""
        return sorted(
            (
                StoredFile(self._rel(i.path), i.size or 0, i.mtime.timestamp() if i.mtime is not None else 0.0)
                for i in self._file_infos(prefix, True)
            ),
            key=lambda f: f.rel,
        )

    def parquet_dataset(self, rels: builtins.list[str], schema: pa.Schema | None = None) -> pads.Dataset:
        """One pyarrow dataset over the Parquet files `rels` (pyarrow reads them on its own threads)."""
        import pyarrow.dataset as ds

        return ds.dataset([self.path(r) for r in rels], format="parquet", filesystem=self.fs, schema=schema)

    def top_level(self) -> builtins.list[str]:
        """The directories at the top of the store, outside any domain (the domains and `blobs`)."""
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self.root or "/", allow_not_found=True)
        try:
            infos = self.meta.get_file_info(sel)
        except OSError as e:
            raise StoreError(f"store {self.uri}: cannot list its top level: {client_error(e)}") from None
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self.path(prefix), allow_not_found=True)
        infos = self.meta.get_file_info(sel)
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def read_chunks(self, rel: str, chunk: int, what: str) -> Chunks:
        """`rel` streamed in chunks of `chunk` bytes, each waited for at most `guard.STALL_S`: a store
        that stops sending part way fails the read soon and is taken for down (`guard.Chunks`)."""
        fs, path = self.fs, self.path(rel)
        return Chunks(lambda: fs.open_input_stream(path), chunk, self.breaker, what)

    def open_ranged(self, rel: str, what: str, breaker: Breaker | None = None) -> Ranged:
        """`rel` for ranged reads whose open, size and reads each wait at most `guard.STALL_S`; one
        that overruns marks `breaker` (default: this store's) down (`guard.Ranged`)."""
        return Ranged(lambda: self.open_input(rel), breaker or self.breaker, what)

    def open_input(self, rel: str) -> pa.NativeFile:
        """A random-access file (pyarrow NativeFile: read_at, seek, size) for ranged reads."""
        try:
            return self.fs.open_input_file(self.path(rel))
        except OSError as e:
            raise StoreError(f"store {self.uri}: cannot open {rel}: {client_error(e)}") from None


# A store client's error, as a warning or error line shows it: at most this long.
CLIENT_ERROR_MAX = 240


def client_error(e: BaseException) -> str:
    """A store client's error in one short line (issue 46: `gs://` and S3 warnings ran to ~1,300 characters).

    pyarrow passes on its clients' whole text: Google Cloud's repeats its message inside an `error_info`
    dump with a link to the authentication docs; the AWS SDK's names the key and bucket before the error.
    Kept: the status or AWS error and the underlying cause (a curl error, a refused connection)."""
    text = " ".join(redact_text(str(e)).split())
    text = text.split(" error_info=", 1)[0]
    if text.startswith("google::cloud::Status("):
        code = text[len("google::cloud::Status(") :].split(":", 1)[0]
        cause = text.rsplit("The underlying error message was:", 1)
        text = f"{code}: {cause[1].strip()}" if len(cause) == 2 else text[len("google::cloud::Status(") :]
    elif "AWS Error " in text:
        text = text[text.index("AWS Error ") :]
    return text if len(text) <= CLIENT_ERROR_MAX else text[: CLIENT_ERROR_MAX - 1] + "…"


def _open_error(scheme: str, e: Exception) -> str:
    """Why a store did not open, in one line: pyarrow's text (redacted), or, when HDFS's native
    client (libhdfs, or the JVM it needs) is missing, which it is and how to install it, instead of
    the dozens of dlopen lines pyarrow lists."""
    text = redact_text(str(e))
    if scheme in ("hdfs", "viewfs"):
        missing = next((lib for lib in ("libhdfs", "libjvm") if f"load {lib}" in text), None)
        if missing:
            return (
                f"cannot load {missing}, which pyarrow needs for HDFS: install Java and Hadoop's libhdfs, "
                "then set JAVA_HOME, ARROW_LIBHDFS_DIR (the directory of libhdfs.so) and "
                "CLASSPATH=$(hadoop classpath --glob)"
            )
    return client_error(e)


def _open_s3(uri: str) -> tuple[pafs.S3FileSystem, pafs.S3FileSystem, str]:
    """pyarrow's S3FileSystem from an `s3://` URI, with directory-existence checks turned on, and a
    second client for small requests whose timeouts are short (`guard.META_*`), unless the URI
    sets the timeouts itself; returns (transfers, small requests, root).

    `FileSystem.from_uri` cannot set `check_directory_existence_before_creation`; without it
    every delete writes a parent "directory marker", which breaks S3 servers that map keys to files
    (see `StoreFS._keep_prefix`).
    """
    from urllib.parse import parse_qsl, unquote

    import pyarrow.fs as pafs

    parsed = urlparse(uri)
    # The SDK's default request timeout (3 s without a byte) fails large transfers from a busy server.
    kwargs: dict[str, str | bool | float] = {
        "check_directory_existence_before_creation": True,
        "request_timeout": 60.0,
        "connect_timeout": 10.0,
    }
    own_timeouts = False
    if parsed.username:
        kwargs["access_key"] = unquote(parsed.username)
        kwargs["secret_key"] = unquote(parsed.password or "")
    for name, value in parse_qsl(parsed.query):
        if name in ("region", "scheme", "endpoint_override", "session_token", "role_arn", "session_name"):
            kwargs[name] = value
        elif name in ("allow_bucket_creation", "allow_bucket_deletion", "force_virtual_addressing"):
            kwargs[name] = value.lower() in ("1", "true", "yes")
        elif name in ("connect_timeout", "request_timeout"):
            kwargs[name] = float(value)
            own_timeouts = True
        else:
            raise StoreError(f"store URI {redact(uri)!r}: unknown S3 option {name!r}")
    bucket = parsed.hostname or ""
    if not bucket:
        raise StoreError(f"store URI {redact(uri)!r}: no bucket")
    fs = pafs.S3FileSystem(**kwargs)
    meta = fs
    if not own_timeouts:
        short = {"request_timeout": META_REQUEST_S, "connect_timeout": META_CONNECT_S}
        retry = pafs.AwsStandardS3RetryStrategy(max_attempts=META_ATTEMPTS)
        meta = pafs.S3FileSystem(**{**kwargs, **short}, retry_strategy=retry)
    return fs, meta, f"{bucket}{parsed.path}".rstrip("/")


# How long a GCS operation retries before it fails. The client's own default is 15 minutes, during which
# `exec` waits and the job does not start; a store that has not answered in this long is treated as
# down (the stages fall back, the job starts). `?retry_limit_seconds=` in the URI sets another bound.
GCS_RETRY_LIMIT_S = 10.0
# The HDFS client's connect timeout and retries (Hadoop's defaults add up to minutes on a dead NameNode).
HDFS_CONNECT_TIMEOUT_MS = 5000


def _open_gcs(uri: str) -> tuple[pafs.GcsFileSystem, str]:
    """pyarrow's GcsFileSystem from a `gs://` URI, with its retries bounded (`GCS_RETRY_LIMIT_S`).

    The query takes pyarrow's own options (`scheme`, `endpoint_override`, `anonymous`, `project_id`,
    `default_bucket_location`, `retry_limit_seconds`); STORAGE_EMULATOR_HOST is honoured by the client."""
    from datetime import timedelta
    from urllib.parse import parse_qsl

    import pyarrow.fs as pafs

    parsed = urlparse(uri)
    kwargs: dict[str, object] = {}
    limit = GCS_RETRY_LIMIT_S
    for name, value in parse_qsl(parsed.query):
        if name in ("scheme", "endpoint_override", "project_id", "default_bucket_location"):
            kwargs[name] = value
        elif name == "anonymous":
            kwargs[name] = value.lower() in ("1", "true", "yes")
        elif name == "retry_limit_seconds":
            try:
                limit = float(value)
            except ValueError:
                raise StoreError(f"store URI {redact(uri)!r}: retry_limit_seconds must be a number") from None
        else:
            raise StoreError(f"store URI {redact(uri)!r}: unknown GCS option {name!r}")
    bucket = parsed.hostname or ""
    if not bucket:
        raise StoreError(f"store URI {redact(uri)!r}: no bucket")
    fs = pafs.GcsFileSystem(retry_time_limit=timedelta(seconds=limit), **kwargs)
    return fs, f"{bucket}{parsed.path}".rstrip("/")


def _open_hdfs(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's HadoopFileSystem from an `hdfs://` URI, with the client's connect timeout and retries
    bounded (`HDFS_CONNECT_TIMEOUT_MS`, one retry) unless the URI's query sets them."""
    import pyarrow.fs as pafs

    bounded = {
        "ipc.client.connect.timeout": str(HDFS_CONNECT_TIMEOUT_MS),
        "ipc.client.connect.max.retries": "1",
        "ipc.client.connect.max.retries.on.timeouts": "1",
        "dfs.client.socket-timeout": "60000",
    }
    parsed = urlparse(uri)
    sep = "&" if parsed.query else ""
    extra = "&".join(f"{k}={v}" for k, v in bounded.items() if k not in parsed.query)
    full = parsed._replace(query=parsed.query + (sep + extra if extra else "")).geturl()
    return pafs.FileSystem.from_uri(full)
