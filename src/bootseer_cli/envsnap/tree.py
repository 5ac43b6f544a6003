"""One env tree as one value: its roots, bootseer's own files in it, and what it carries, read once.

Before, `roots: list[str]` went through every module, and each one that needed what the tree carries
(`.bootseer-env.paths`: a row per env path, ~30 MB of JSON for 200k paths) read and parsed it again: a
start that found a stale tree read it three times (the stamp check, the chain's prefix, the switch), a
layered restore once more per layer, the check of a parent to build over three times. An `EnvTree` reads
it on the first ask and keeps it until bootseer itself changes it: every write or removal of the file
goes through `write_own`/`unlink_own` here, which drop what was kept, and a stamp just written is kept
as written (`keep_carried`). The one other writer of a tree is the user's setup, and nothing reads the
carried document between a setup and the stamp that follows it (which writes it); a later process (the
agent, `bootseer restore`) makes a tree of its own. `locked` is the lock and the journal's recovery that
every command changing the tree starts with (lock.py, journal.py: both per roots).

The file I/O itself is `treefiles.py`'s, unchanged: opened from a descriptor of the first root,
no link followed, regular files only, size-capped, written by unguessable temporary and rename.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import treefiles
from .manifest import CARRIED_NAME
from .treefiles import CARRIED_MAX

_UNREAD: dict[str, Any] = {}  # marks "not read yet" (a parsed document is never this very object)


class EnvTree:
    """The roots of one env tree (the first holds bootseer's files) and its carried document, cached.

    The carried document returned by `carried()` is shared by every caller of this tree: read it,
    never change it (a merged stamp makes new rows: `stamp.merged_carried`)."""

    __slots__ = ("_carried", "_roots", "carried_reads")

    def __init__(self, roots: Sequence[str]) -> None:
        self._roots = list(roots)
        self._carried: dict[str, Any] | None = _UNREAD
        self.carried_reads = 0  # how many times the carried file was read and parsed (tests count it)

    @property
    def roots(self) -> list[str]:
        """The configured roots, in their configured order (a copy: the tree's stay as they are)."""
        return list(self._roots)

    def __repr__(self) -> str:
        return f"EnvTree({self._roots!r})"

    @contextlib.contextmanager
    def locked(self, info: Callable[[str], None], warn: Callable[[str], None]) -> Iterator[EnvTree]:
        """Hold the tree's node-local lock (lock.py), then put back a restore that died part way
        (journal.py): what the env stage, `restore` and `baseline` do before they look at the tree.
        The carried document is read after that, never before (recovery may change the tree)."""
        from .journal import recover
        from .lock import tree_lock

        with tree_lock(self._roots, info, warn):
            recover(self._roots, info)
            self.forget_carried()
            yield self

    def read_own(self, name: str, cap: int) -> bytes:
        """bootseer's file `name` at the top of the first root (treefiles.read_own)."""
        return treefiles.read_own(self._roots[0], name, cap)

    def write_own(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """Replace bootseer's file `name` (treefiles.write_own); the carried document is read again after."""
        if name == CARRIED_NAME:
            self.forget_carried()
        treefiles.write_own(self._roots[0], name, data, mode)

    def unlink_own(self, name: str) -> None:
        """Remove bootseer's file `name` (treefiles.unlink_own); the carried document is read again after."""
        if name == CARRIED_NAME:
            self.forget_carried()
        treefiles.unlink_own(self._roots[0], name)

    def keep_carried(self, doc: dict[str, Any]) -> None:
        """`doc` is what bootseer just wrote to the carried file (`stamp.write_drafted_stamp`): kept as
        read, so the next layer of a chain applies over it without parsing it back."""
        self._carried = doc

    def forget_carried(self) -> None:
        """Drop the kept carried document: the next `carried()` reads the file again."""
        self._carried = _UNREAD

    def carried(self) -> dict[str, Any] | None:
        """What bootseer put into this tree beyond the image: {"blob", "entries", "deletions"}, or None.

        `entries` rows are `[path, kind, size, mtime_s, link]` as the env left them (a symlink's target,
        a hardlink's size and mtime are its target's), so that what someone changed since can be told
        from what bootseer wrote. A file written by an older bootseer lists bare `paths`: nothing of it
        can be checked, so nothing of it is ever removed. Read on the first call, then kept."""
        if self._carried is _UNREAD:
            self.carried_reads += 1
            self._carried = _parse_carried(self._roots[0])
        return self._carried


def _parse_carried(root: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(treefiles.read_own(root, CARRIED_NAME, CARRIED_MAX))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    rows = doc.get("entries")
    if isinstance(rows, list):
        doc["entries"] = [r for r in rows if isinstance(r, list) and len(r) == 5 and isinstance(r[0], str)]
    elif isinstance(doc.get("paths"), list):
        doc["entries"] = [[p, "?", 0, 0, ""] for p in doc["paths"] if isinstance(p, str)]
    else:
        return None
    return doc
