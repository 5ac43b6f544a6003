"""Stamps: which env a tree carries, and what that env put into it.

The stamp (`<first root>/.bootseer-env.json`) says which env keys a tree carries, with the size and
mtime of a few sentinel files (the dist-infos' RECORDs) so a tree changed since is not trusted.
Beside it, `.bootseer-env.paths` lists what the env added and deleted, so that a later switch to
another env (or a setup on this tree) can remove this one's files first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from .format import ArchiveEntry, Meta
from .manifest import CARRIED_NAME, DIR, FILE, STAMP_NAME, Manifest, under

MAX_SENTINELS = 512


def stamp_path(roots: list[str]) -> Path:
    return Path(roots[0]) / STAMP_NAME


def carried_path(roots: list[str]) -> Path:
    return Path(roots[0]) / CARRIED_NAME


def _sentinels(entries: Sequence[ArchiveEntry]) -> list[str]:
    """The files whose size and mtime stand for the whole tree: RECORDs first, else a spread sample."""
    files = [e.path for e in entries if e.kind == FILE]
    picks = [p for p in files if p.endswith(".dist-info/RECORD")][:MAX_SENTINELS]
    if len(picks) < 16 and files:
        step = max(1, len(files) // 16)
        picks += [p for p in files[::step] if p not in picks][: 16 - len(picks)]
    return picks


def read_carried(roots: list[str]) -> dict[str, Any] | None:
    """What bootseer put into this tree beyond the image: {"blob", "paths", "deletions"}, or None."""
    try:
        doc = json.loads(carried_path(roots).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), list):
        return None
    return doc


def strip_carried(roots: list[str], info: Callable[[str], None]) -> None:
    """Before a setup on a tree that carries another env: remove what that env added (so the new
    baseline is the image again, and the new snapshot does not lean on the old env's files).

    Files and links go first; then the directories the env created, deepest first, each once it is
    empty (bytecode caches Python wrote into them since count as the env's).
    """
    doc = read_carried(roots)
    if doc is None:
        return
    paths = [p for p in doc["paths"] if isinstance(p, str) and under(p, roots) and p not in roots]
    removed = 0
    dirs = []
    for p in paths:
        if not os.path.lexists(p):
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            dirs.append(p)
            continue
        with contextlib.suppress(OSError):
            os.unlink(p)
            removed += 1
    for d in sorted(dirs, key=lambda q: q.count("/"), reverse=True):
        if _remove_if_empty(d):
            removed += 1
    carried_path(roots).unlink(missing_ok=True)
    if removed:
        info(f"env: removed {removed} path(s) of the env this tree carried before")


def _remove_if_empty(d: str) -> bool:
    """Remove directory `d` if nothing but bytecode caches is left in it."""
    with contextlib.suppress(OSError):
        pycache = os.path.join(d, "__pycache__")
        only_bytecode = os.path.isdir(pycache) and not os.path.islink(pycache)
        if only_bytecode and all(n.endswith((".pyc", ".pyo")) for n in os.listdir(pycache)):
            shutil.rmtree(pycache)
        os.rmdir(d)
        return True
    return False


def switch_deletions(roots: list[str], meta: Meta, digest: str) -> list[str]:
    """Paths of the env the tree carries now that the snapshot being restored does not have.

    Raises IntegrityError when the old env deleted files of the image that the new one keeps: they
    cannot be brought back from a snapshot (the setup must run instead).
    """
    doc = read_carried(roots)
    if doc is None or doc.get("blob") == digest:
        return []
    new_paths = {e.path for e in meta.entries}
    new_deleted = set(meta.deletions)
    lost = [p for p in doc.get("deletions") or [] if p not in new_deleted and p not in new_paths]
    lost = [p for p in lost if not any(p == d or p.startswith(d + "/") for d in new_deleted)]
    if lost:
        raise IntegrityError(
            f"this tree carries another env that deleted {len(lost)} file(s) of the image (e.g. {lost[0]}), "
            "which the snapshot cannot bring back"
        )
    return sorted(p for p in doc["paths"] if isinstance(p, str) and p not in new_paths)


def _replace_json(path: Path, doc: dict[str, Any]) -> None:
    """Write by temporary name and rename, so a reader sees the old file or the new one."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def write_stamp(
    roots: list[str],
    keys: list[str],
    digest: str | None,
    entries: Sequence[ArchiveEntry],
    deletions: Sequence[str] | None = None,
) -> None:
    """Say, last of all, that this tree carries the env for `keys` (and what the env put in it)."""
    cpath = carried_path(roots)
    if cpath.parent.is_dir():
        _replace_json(cpath, {"blob": digest, "paths": [e.path for e in entries], "deletions": list(deletions or [])})
    sentinels: dict[str, list[int]] = {}
    for p in _sentinels(entries):
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            sentinels[p] = [st.st_size, st.st_mtime_ns]
    doc = {"env_keys": list(dict.fromkeys(keys)), "blob": digest, "written": time.time(), "sentinels": sentinels}
    path = stamp_path(roots)
    if path.parent.is_dir():
        _replace_json(path, doc)


def remove_stamp(roots: list[str]) -> None:
    stamp_path(roots).unlink(missing_ok=True)


def stamp_state(roots: list[str], env_key: str) -> tuple[bool, str]:
    """(True, "") when the tree carries `env_key` and its sentinel files are untouched; else the reason."""
    try:
        doc = json.loads(stamp_path(roots).read_text())
    except FileNotFoundError:
        return False, "no stamp"
    except (OSError, ValueError):
        return False, "unreadable stamp"
    if not isinstance(doc, dict) or env_key not in (doc.get("env_keys") or []):
        return False, "stamp for another env key"
    for p, (size, mtime_ns) in (doc.get("sentinels") or {}).items():
        try:
            st = os.lstat(p)
        except OSError:
            return False, f"stale stamp: {p} is gone"
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            return False, f"stale stamp: {p} changed"
    return True, ""


def entries_of(after: Manifest, changed: list[str], before: Manifest) -> list[ArchiveEntry]:
    """Entries (as the archive lists them) for a stamp written without an archive: what the setup
    changed, directories included when the setup created them (not in `before`), so that switching
    away from this env removes them too."""
    return [
        ArchiveEntry(p, after[p].kind, after[p].mode, after[p].size, 0, "")
        for p in changed
        if after[p].kind != DIR or p not in before
    ]
