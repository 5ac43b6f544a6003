"""What a prewarm container hands back: the one ref the host asked for and the blobs it names.

Why: a prewarm container runs the job's setup, i.e. every build script of every dependency. It must not
hold the store's write credentials or the signing key, and nothing it makes may be signed unless the
host asked for it. So each container publishes into a store of its own, a directory inside the
container (`STAGE`, never mounted, never listed by anyone else), and after it exits the host reads out
of it, through the engine's archive API, exactly the ref it computed the key of (the env key, the
image's hot key) and the blobs that ref names. A ref is a regular file of at most `REF_MAX` bytes; a
blob is streamed into a private host directory and kept only if its bytes hash to the digest the ref
names. The host then uploads the blobs and writes the ref, signed, with its own credentials
(`publish`). A link, a device or anything else in the container is never followed: the archive
carries what the container's filesystem holds, and only regular members are read.

The next container (the probe's) gets the env snapshot the same way back in: `seed_archive` writes a
tar of the ref and its blobs, streamed into the container before it starts.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, overload

from ..errors import BootseerError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from docker.models.containers import Container

    from ..store.core import Store

STAGE = "/bootseer/staging"  # the container's own store (file://), inside its filesystem only
STAGE_DOMAIN = "prewarm"
REF_MAX = 1 << 20


def stage_uri() -> str:
    return f"file://{STAGE}"


def _ref_rel(kind: str, key: str) -> str:
    return f"{STAGE_DOMAIN}/refs/{kind}/{key}.json"


def _blob_rel(digest: str) -> str:
    return f"blobs/sha256/{digest[:2]}/{digest}"


class _Chunks(io.RawIOBase):
    """The engine's archive stream (an iterator of byte chunks) as a file for `tarfile`'s stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf: WriteableBuffer) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        with memoryview(buf) as view:
            n = min(len(view), len(self._rest))
            view[:n], self._rest = self._rest[:n], self._rest[n:]
        return n


class Handback:
    """The host's side: a private directory for what the containers hand back, and the reads out of them."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bootseer-prewarm-"))  # 0700, this process's
        self.refs: dict[tuple[str, str], dict[str, Any]] = {}
        self.blobs: dict[str, Path] = {}

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)

    def take(self, container: Container, kind: str, key: str) -> None:
        """Read ref `kind/key` and the blobs it names out of `container`'s stage (see the module doc);
        nothing when the container published no such ref (the caller says what is missing)."""
        try:
            raw = self._member(container, f"{STAGE}/{_ref_rel(kind, key)}", REF_MAX, None)
        except NotHandedBack:
            return
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise BootseerError(f"the container's {kind} ref for {key[:16]} is not a JSON object")
        for digest in blobs_of(doc, f"the container's {kind} ref for {key[:16]}"):
            if digest not in self.blobs:
                self.blobs[digest] = self._member(container, f"{STAGE}/{_blob_rel(digest)}", None, digest)
        self.refs[(kind, key)] = doc

    @overload
    def _member(self, container: Container, path: str, cap: int, digest: None) -> bytes: ...

    @overload
    def _member(self, container: Container, path: str, cap: None, digest: str) -> Path: ...

    def _member(self, container: Container, path: str, cap: int | None, digest: str | None) -> bytes | Path:
        """The one regular file at `path` in the container: its bytes (`cap`), or, for a blob, a host
        file whose sha256 is `digest`. Anything else (missing, a link, a directory) is refused."""
        import docker.errors

        try:
            stream, _ = container.get_archive(path)
        except docker.errors.NotFound:
            raise NotHandedBack(f"the container did not produce {path}") from None
        with tarfile.open(fileobj=io.BufferedReader(_Chunks(iter(stream))), mode="r|") as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise BootseerError(f"{path} in the container is not a regular file")
            if cap is not None and member.size > cap:
                raise BootseerError(f"{path} in the container holds more than {cap} bytes")
            f = tar.extractfile(member)
            assert f is not None  # a regular member always has its data
            return f.read() if digest is None else self._blob_file(f, digest, path)

    def _blob_file(self, src: IO[bytes], digest: str, path: str) -> Path:
        h = hashlib.sha256()
        dest = self.dir / digest
        with open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as out:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != digest:
            dest.unlink()
            raise BootseerError(f"{path} in the container does not hash to the digest its ref names")
        return dest

    def add(self, store: Store, kind: str, key: str, doc: dict[str, Any]) -> None:
        """A ref already in the real store (verified by `store`), with its blobs, to seed the next container."""
        for digest in blobs_of(doc, f"{kind} ref {key[:16]} in {store.uri}"):
            if digest not in self.blobs:
                dest = self.dir / digest
                store.fetch_blob(digest, dest)  # verified against its digest
                self.blobs[digest] = dest
        self.refs[(kind, key)] = doc

    def seed_archive(self, kind: str, key: str) -> Path | None:
        """A tar (on disk) that puts ref `kind/key` and its blobs into a container's stage; None without one."""
        doc = self.refs.get((kind, key))
        if doc is None:
            return None
        path = self.dir / f"seed-{kind}-{key[:16]}.tar"
        body = json.dumps(doc, sort_keys=True).encode()
        with tarfile.open(path, "w") as tar:
            _add_bytes(tar, f"{STAGE}/{_ref_rel(kind, key)}", body)
            for digest in blobs_of(doc, kind):
                info = tar.gettarinfo(str(self.blobs[digest]), arcname=f"{STAGE}/{_blob_rel(digest)}".lstrip("/"))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                _add_dirs(tar, info.name)
                with open(self.blobs[digest], "rb") as f:
                    tar.addfile(info, f)
        return path

    def publish(self, store: Store, kind: str, key: str) -> dict[str, Any]:
        """Upload the blobs of ref `kind/key` with this host's credentials, then write the ref (signed
        where this process holds the key), last, as every publisher does."""
        doc = self.refs[(kind, key)]
        for digest in blobs_of(doc, kind):
            store.put_blob_file(self.blobs[digest], digest)
        store.write_ref(kind, key, doc)
        return doc


class NotHandedBack(BootseerError):
    """The container holds no file at the path asked for."""


def blobs_of(doc: dict[str, Any], what: str) -> list[str]:
    """The blobs a ref names: its `blob`, after those of its `chain` (an env layer's). Other digests in
    it (the hashes of requirement files an env ref keeps as its inputs) name no blob."""
    from ..digests import is_digest

    chain = doc.get("chain")
    chain = chain if isinstance(chain, list) else []
    out = [d.get("blob") if isinstance(d, dict) else None for d in chain] + [doc.get("blob")]
    if not all(is_digest(d) for d in out):
        raise BootseerError(f"{what} names a blob that is not a sha256 digest")
    return list(dict.fromkeys(str(d) for d in out))


def _add_dirs(tar: tarfile.TarFile, name: str) -> None:
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in tar.getnames():
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(info)


def _add_bytes(tar: tarfile.TarFile, path: str, data: bytes) -> None:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    _add_dirs(tar, info.name)
    tar.addfile(info, io.BytesIO(data))
