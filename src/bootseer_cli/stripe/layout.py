"""The striped layout: the manifest, its validation, and the cell arithmetic every reader and writer shares.

The files of a checkpoint directory are concatenated (sorted by path) into one logical stream of
`total_size` bytes, cut into cells of `cell_size` bytes; cell `c` goes to stripe `c % K` at offset
`(c // K) * cell_size`. A stripe is therefore the concatenation of its cells, and reading `K`
consecutive cells touches all `K` stripes once: a sequential reader pulls from every target at once.

The manifest is untrusted input (it comes from the store): `Manifest.from_json` checks every field,
the paths (no `..`, no absolute paths) and that offsets, stripe sizes and the cell count agree, so the
reader and the mount can do plain arithmetic afterwards.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, IntegrityError

FORMAT = 1
MANIFEST = "manifest.json"
LATEST = "latest.json"
MIN_CELL = 512
MAX_CELL = 1 << 30
MAX_STRIPES = 4096
MAX_MTIME_NS = 1 << 62  # about the year 2116: a larger (or negative) recorded mtime is ignored
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def check_name(value: str, what: str = "name") -> str:
    """Checkpoint names and tags are one store path segment each."""
    if not _NAME_RE.match(value or ""):
        raise ConfigError(f"checkpoint {what} {value!r}: use letters, digits, '.', '_' and '-' (not first)")
    if what == "tag" and value == "latest":
        raise ConfigError("checkpoint tag 'latest' is reserved (it names the most recent tag)")
    return value


def check_relpath(path: str) -> str:
    """A relative POSIX path that stays inside the directory it is joined to."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise IntegrityError(f"checkpoint manifest: unsafe path {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise IntegrityError(f"checkpoint manifest: unsafe path {path!r}")
    return path


def ckpt_prefix(name: str) -> str:
    return f"ckpt/{check_name(name)}"


def manifest_rel(name: str, tag: str) -> str:
    return f"{ckpt_prefix(name)}/{check_name(tag, 'tag')}/{MANIFEST}"


def latest_rel(name: str) -> str:
    return f"{ckpt_prefix(name)}/{LATEST}"


@dataclass(frozen=True)
class FileEntry:
    path: str
    offset: int  # in the logical stream
    size: int
    sha256: str
    mtime_ns: int | None = None  # when it was saved (trainers pick their newest checkpoint by it); None: not recorded


@dataclass(frozen=True)
class StripeRef:
    target: str  # store URI of the target; "" means the main store (relocatable)
    digest: str  # the stripe is the blob blobs/sha256/<digest> on its target
    size: int


@dataclass
class Manifest:
    name: str
    tag: str
    cell_size: int
    stripes: list[StripeRef]
    files: list[FileEntry]
    cells: list[str]  # sha256 of each cell, in logical order
    dirs: list[str] = field(default_factory=list)  # directories, including empty ones
    created: float = 0.0

    # ---- arithmetic ----------------------------------------------------------------------------
    @property
    def k(self) -> int:
        return len(self.stripes)

    @property
    def total_size(self) -> int:
        return self.files[-1].offset + self.files[-1].size if self.files else 0

    @property
    def n_cells(self) -> int:
        return cell_count(self.total_size, self.cell_size)

    def cell_len(self, c: int) -> int:
        return min(self.cell_size, self.total_size - c * self.cell_size)

    def cell_location(self, c: int) -> tuple[int, int, int]:
        """(stripe, offset in the stripe, length) of cell `c`."""
        return c % self.k, (c // self.k) * self.cell_size, self.cell_len(c)

    def cells_in(self, lo: int, hi: int) -> range:
        """The cells that hold logical bytes [lo, hi)."""
        if hi <= lo:
            return range(0)
        return range(lo // self.cell_size, (hi - 1) // self.cell_size + 1)

    def digest(self) -> str:
        """Identifies this exact checkpoint (a pulled copy records it to know it is current)."""
        return hashlib.sha256(self.to_json()).hexdigest()

    # ---- (de)serialisation ---------------------------------------------------------------------
    def to_doc(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "tag": self.tag,
            "created": self.created,
            "cell_size": self.cell_size,
            "total_size": self.total_size,
            "stripes": [{"target": s.target, "digest": s.digest, "size": s.size} for s in self.stripes],
            "files": [_file_doc(f) for f in self.files],
            "dirs": list(self.dirs),
            "cells": list(self.cells),
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_doc(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "manifest") -> Manifest:
        try:
            doc = json.loads(data)
        except ValueError:
            raise IntegrityError(f"{where}: not valid JSON (truncated or corrupt)") from None
        return cls.from_doc_at(doc, where)

    @classmethod
    def from_doc_at(cls, doc: object, where: str = "manifest") -> Manifest:
        """`from_doc`, with errors that say which manifest (a signed document was already parsed)."""
        try:
            return cls.from_doc(doc)  # type: ignore[arg-type]
        except IntegrityError as e:
            raise IntegrityError(f"{where}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IntegrityError(f"{where}: malformed ({type(e).__name__}: {e})") from None

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Manifest:
        if not isinstance(doc, dict):
            raise IntegrityError("not a JSON object")
        if doc.get("format") != FORMAT:
            raise IntegrityError(f"format {doc.get('format')!r} is not supported (this bootseer reads {FORMAT})")
        cell = _int(doc["cell_size"], "cell_size")
        if not MIN_CELL <= cell <= MAX_CELL:
            raise IntegrityError(f"cell_size {cell} out of range")
        stripes_doc = doc["stripes"]
        if not isinstance(stripes_doc, list) or not 1 <= len(stripes_doc) <= MAX_STRIPES:
            raise IntegrityError("stripes: expected 1 to 4096 entries")
        files: list[FileEntry] = []
        offset = 0
        seen: set[str] = set()
        for f in doc["files"]:
            path = check_relpath(f["path"])
            size = _int(f["size"], "file size")
            if path in seen:
                raise IntegrityError(f"duplicate path {path!r}")
            if _int(f["offset"], "file offset") != offset:
                raise IntegrityError(f"file {path!r}: offset does not follow the previous file")
            files.append(FileEntry(path, offset, size, _hex(f["sha256"], "file sha256"), _mtime(f.get("mtime_ns"))))
            seen.add(path)
            offset += size
        if _int(doc.get("total_size", offset), "total_size") != offset:
            raise IntegrityError("total_size does not match the files")
        dirs = [check_relpath(d) for d in doc.get("dirs", [])]
        for d in dirs:
            if d in seen:
                raise IntegrityError(f"{d!r} is both a file and a directory")
        for p in seen:
            parts = p.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in seen:
                    raise IntegrityError(f"{p!r} lies under a file")
        cells = [_hex(c, "cell checksum") for c in doc["cells"]]
        if len(cells) != cell_count(offset, cell):
            raise IntegrityError(f"{len(cells)} cell checksums for {cell_count(offset, cell)} cells")
        k = len(stripes_doc)
        stripes = []
        for s, ref in enumerate(stripes_doc):
            target = ref.get("target", "")
            if not isinstance(target, str):
                raise IntegrityError("stripe target is not a string")
            size = _int(ref["size"], "stripe size")
            if size != stripe_size(offset, cell, k, s):
                raise IntegrityError(f"stripe {s}: size {size} does not match the layout")
            stripes.append(StripeRef(target, _hex(ref["digest"], "stripe digest"), size))
        created = doc.get("created", 0.0)
        return cls(
            name=check_name(str(doc["name"])),
            tag=str(doc["tag"]),
            cell_size=cell,
            stripes=stripes,
            files=files,
            cells=cells,
            dirs=dirs,
            created=float(created) if isinstance(created, (int, float)) else 0.0,
        )


def cell_count(total: int, cell: int) -> int:
    return (total + cell - 1) // cell


def stripe_size(total: int, cell: int, k: int, s: int) -> int:
    """Bytes in stripe `s`: its full cells, plus the short last cell if it falls to `s`."""
    n = cell_count(total, cell)
    count = len(range(s, n, k))
    if count and (n - 1) % k == s:
        return (count - 1) * cell + (total - (n - 1) * cell)
    return count * cell


def _file_doc(f: FileEntry) -> dict[str, Any]:
    """A file's manifest entry; `mtime_ns` only when recorded, so an older manifest re-serialises (and
    digests) exactly as before."""
    doc: dict[str, Any] = {"path": f.path, "offset": f.offset, "size": f.size, "sha256": f.sha256}
    if f.mtime_ns is not None:
        doc["mtime_ns"] = f.mtime_ns
    return doc


def _mtime(v: object) -> int | None:
    """A recorded mtime is optional and only informative: one that is not a sane integer is ignored."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_MTIME_NS:
        return v
    return None


def _int(v: object, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise IntegrityError(f"{what}: not a non-negative integer")
    return v


def _hex(v: object, what: str) -> str:
    if not isinstance(v, str) or not _HEX64.match(v):
        raise IntegrityError(f"{what}: not a sha256 hex digest")
    return v


def parse_ref(ref: str) -> tuple[str, str]:
    """`NAME[:TAG|latest]` → (name, tag)."""
    name, _, tag = ref.partition(":")
    check_name(name)
    tag = tag or "latest"
    if tag != "latest":
        check_name(tag, "tag")
    return name, tag
