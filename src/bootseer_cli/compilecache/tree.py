"""The node-local cache directories and what is in them.

The launcher is pointed at one directory per cache (`inductor`, `triton`, `extensions`), by default
under `<cache dir>/<compile key>/`, so caches of another torch or device never share a directory.
A variable the user already set wins: the user's directory is then restored into and published
from. Paths in the store's index are "<cache>/<path inside it>", e.g. `inductor/fxgraph/ab/…`.

What a run added or changed is told apart from what the stage restored by a baseline: the size and
mtime of every file when the stage ended (written to the run directory for the agent). Its atime is
set just below its mtime, so that under `relatime` (and `strictatime`) the first read by PyTorch
moves it: the publisher then knows which restored entries were used, which is what the index's
least-recently-used pruning needs. Under `noatime` no use is seen, and an entry unused for long
enough is pruned, to be compiled and published again.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# cache name -> the variable that points PyTorch (or Triton) at it
CACHE_VARS: dict[str, str] = {
    "inductor": "TORCHINDUCTOR_CACHE_DIR",
    "triton": "TRITON_CACHE_DIR",
    "extensions": "TORCH_EXTENSIONS_DIR",
}
ATIME_BACKDATE_NS = 1_000_000_000


def cache_roots(base: Path, key: str, environ: Mapping[str, str]) -> tuple[dict[str, Path], dict[str, str]]:
    """(cache name -> directory, the variables to export). A variable set by the user is kept as is."""
    roots: dict[str, Path] = {}
    exports: dict[str, str] = {}
    for name, var in CACHE_VARS.items():
        user = environ.get(var)
        if user:
            roots[name] = Path(user).expanduser()
        else:
            roots[name] = base / key[:16] / name
            exports[var] = str(roots[name])
    return roots, exports


def make_dirs(roots: Mapping[str, Path]) -> None:
    """Create the directories private to this user (the caches hold code that will be loaded and run)."""
    for path in roots.values():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)


def skipped(rel: str) -> bool:
    """Locks and temporaries are no part of a cache: never published."""
    parts = rel.split("/")
    name = parts[-1]
    return "locks" in parts[:-1] or name.endswith((".lock", ".tmp", ".part")) or name.startswith(".") or ".tmp" in name


def walk(roots: Mapping[str, Path]) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(index path, file path, stat) of every regular file under the roots; links are not followed."""
    for name, root in roots.items():
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for fn in filenames:
                path = Path(dirpath) / fn
                rel = f"{name}/{path.relative_to(root).as_posix()}"
                if skipped(rel):
                    continue
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield rel, path, st


def local_path(roots: Mapping[str, Path], rel: str) -> Path | None:
    """Where an index path lives on this node; None for a path that is not safe to write (untrusted input)."""
    name, sep, inner = rel.partition("/")
    root = roots.get(name)
    if root is None or not sep or "\\" in inner or "\0" in inner:
        return None
    parts = inner.split("/")
    if any(p in ("", ".", "..") for p in parts) or skipped(rel):
        return None
    return root.joinpath(*parts)


@dataclass
class Baseline:
    """What the directories held when the stage ended, and the digests the index gave for them."""

    roots: dict[str, str]
    files: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # rel -> (size, mtime_ns, atime_ns)
    digests: dict[str, str] = field(default_factory=dict)  # rel -> digest, for files as the index lists them
    bad: list[str] = field(default_factory=list)  # digests whose blob failed verification

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        doc = {"roots": self.roots, "files": self.files, "digests": self.digests, "bad": self.bad}
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Baseline:
        doc = json.loads(path.read_text())
        files = {rel: (int(v[0]), int(v[1]), int(v[2])) for rel, v in doc.get("files", {}).items()}
        digests = dict(doc.get("digests", {}))
        return cls(roots=dict(doc["roots"]), files=files, digests=digests, bad=list(doc.get("bad", [])))


def take_baseline(roots: Mapping[str, Path], digests: dict[str, str], bad: list[str]) -> Baseline:
    """Stat every file the index lists (`digests`), backdating its atime so that a later read shows (see
    the module docstring). Files the index does not know are left out: the next publish sends them, so
    what an earlier run on this node compiled but never published (no agent, a failed upload) is not lost.
    """
    base = Baseline(roots={k: str(v) for k, v in roots.items()}, digests=digests, bad=bad)
    for rel, path, st in walk(roots):
        if rel not in digests:
            continue
        atime = st.st_mtime_ns - ATIME_BACKDATE_NS
        try:
            os.utime(path, ns=(atime, st.st_mtime_ns), follow_symlinks=False)
        except OSError:
            atime = st.st_atime_ns
        base.files[rel] = (st.st_size, st.st_mtime_ns, atime)
    return base
