"""The restore's journal: what an extraction is about to do, written before its first change.

`<first root>/.bootseer-env.journal` lists the undo directories, every planned move aside (the path
and where it goes) and every path the extraction will create. A restore that finishes marks it
committed, removes its undo directories, then the journal. A restore that dies part way (SIGKILL,
power loss, a dead worker) leaves it behind, and the next bootseer command that touches the roots
(the env stage, `restore`, `baseline`), under the tree lock, puts the tree back from it: it removes
the planned new paths, renames the moved originals back and removes the undo directories. A
committed journal only needs its undo directories removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .manifest import JOURNAL_NAME, UNDO_PREFIX, under


def journal_path(roots: list[str]) -> Path:
    return Path(roots[0]) / JOURNAL_NAME


def write(roots: list[str], doc: dict[str, Any]) -> None:
    """Write the journal durably (temporary name, fsync, rename): it must exist before the first change.

    A fresh container has no root yet (the restore is what makes `/opt/venv`): the first root is
    created for the journal, and an interrupted restore leaves at most that empty directory, which
    the setup then fills as it would have."""
    path = journal_path(roots)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(doc).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove(roots: list[str]) -> None:
    journal_path(roots).unlink(missing_ok=True)


def _remove_path(p: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def _read(roots: list[str]) -> dict[str, Any] | None:
    try:
        doc = json.loads(journal_path(roots).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _strs(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def undo_paths(roots: list[str], new: list[str], moves: list[tuple[str, str]]) -> int:
    """Remove the planned new paths (deepest first), then rename the moved originals back.

    Only paths under the roots, also through the symlinks on disk, are touched (the journal is a
    file in the tree, not trusted further). Returns how many paths could not be put back.
    """
    real_roots = [os.path.realpath(r) for r in roots]

    def inside(p: str) -> bool:
        return under(p, roots) and p not in roots and under(os.path.realpath(os.path.dirname(p)), real_roots)

    errors = 0
    for p in sorted(set(new), key=lambda q: q.count("/"), reverse=True):
        if inside(p):
            try:
                _remove_path(p)
            except OSError:
                errors += 1
    for path, dest in reversed(moves):
        if not (inside(path) and inside(dest)) or not os.path.lexists(dest):
            continue
        try:
            if os.path.lexists(path):
                _remove_path(path)
            os.rename(dest, path)
        except OSError:
            errors += 1
    return errors


def recover(roots: list[str], info: Callable[[str], None]) -> None:
    """Finish what a dead restore left: undo an uncommitted journal, remove the undo directories."""
    doc = _read(roots)
    if doc is None:
        _sweep_undo_dirs(roots)
        return
    undo_dirs = [d for d in _strs(doc.get("undo_dirs")) if under(d, roots) and d not in roots]
    if not doc.get("committed"):
        moves = [
            (m[0], m[1])
            for m in doc.get("moves") or []
            if isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m)
        ]
        errors = undo_paths(roots, _strs(doc.get("new")), moves)
        if errors:
            info(f"env: an interrupted restore could not be fully undone ({errors} path(s) left)")
        else:
            info("env: an interrupted restore was undone; the tree is as it was before it")
    for d in undo_dirs:
        shutil.rmtree(d, ignore_errors=True)
    remove(roots)
    _sweep_undo_dirs(roots)


def _sweep_undo_dirs(roots: list[str]) -> None:
    """Undo directories no journal names (left by a restore from before the journal): nothing can
    put them back, and under the tree lock no restore is using them."""
    for root in roots:
        with contextlib.suppress(OSError), os.scandir(root) as it:
            for e in it:
                if e.name.startswith(UNDO_PREFIX) and e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
