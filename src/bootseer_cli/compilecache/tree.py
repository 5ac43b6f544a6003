"""The node-local cache directories and what is in them.

The launcher is pointed at one directory per cache (`inductor`, `triton`, `extensions`, `cuda`), by default
under `<cache dir>/<compile key>/`, so caches of another torch or device never share a directory.
A variable the user already set wins: the user's directory is then restored into and published
from. Paths in the store's index are "<cache>/<path inside it>", e.g. `inductor/fxgraph/ab/…`.

One more cache has no variable: Inductor's precompiled headers (`headers`, a `.gch` of ~150 MB for
the CPU backend) are kept in Inductor's *default* cache directory, `$TMPDIR/torchinductor_<user>/
precompiled_headers`, whatever TORCHINDUCTOR_CACHE_DIR says, and Inductor builds the header (seconds)
on every start that loads a C++ kernel, even one whose kernels all come from the cache. The stage
restores them there (the directory the launcher's Inductor computes: its TMPDIR and user), so a hit
does not depend on what TMPDIR holds; GCC uses a header moved to another directory (checked with
`-Winvalid-pch -H`). Header names are content hashes of the header, the compiler and its flags, and
that directory is shared by every compile key on the node: what it held before the stage is not
this key's to publish (see `take_baseline`). They are fetched only when the key's last run compiled
(`Index.compiled`, `publish.compiled`): a job started without torch.compile never reads them.

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
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .nofollow import acceptable_root, make_root, open_tree
from .nofollow import walk as nofollow_walk

# cache name -> the variable that points PyTorch (or Triton) at it
CACHE_VARS: dict[str, str] = {
    "inductor": "TORCHINDUCTOR_CACHE_DIR",
    "triton": "TRITON_CACHE_DIR",
    "extensions": "TORCH_EXTENSIONS_DIR",
    # The CUDA driver's JIT cache (PTX compiled for this GPU; by default ~/.nv/ComputeCache). A node
    # whose other caches all hit still JIT-compiled here on an H200 (six files under HOME, the one
    # thing the fresh node wrote that the warm node did not). The compile key names the GPUs and the
    # driver, so one cache per key is valid wherever it is restored.
    "cuda": "CUDA_CACHE_PATH",
}
HEADERS = "headers"
# Roots shared with the other compile keys (and other runs) of the node, not under `<cache dir>/<key>`.
SHARED_ROOTS = frozenset({HEADERS})
ATIME_BACKDATE_NS = 1_000_000_000


def temp_dir(environ: Mapping[str, str]) -> Path:
    """`tempfile.gettempdir()` as a process with `environ` computes it (TMPDIR, TEMP, TMP, then the
    usual directories; the first writable one), without the process-wide cache of `tempfile`."""
    candidates = [environ.get(var, "") for var in ("TMPDIR", "TEMP", "TMP")] + ["/tmp", "/var/tmp", "/usr/tmp"]
    for d in candidates:
        if d and os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            return Path(os.path.abspath(d))
    return Path(os.getcwd())


def user_name(environ: Mapping[str, str]) -> str:
    """`getpass.getuser()` as a process with `environ` computes it, sanitized as Inductor does."""
    name = next((environ[v] for v in ("LOGNAME", "USER", "LNAME", "USERNAME") if environ.get(v)), "")
    if not name:
        try:
            import pwd

            name = pwd.getpwuid(os.getuid()).pw_name
        except (ImportError, KeyError, OSError):
            name = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return re.sub(r'[\\/:*?"<>|]', "_", name)


def header_dir(environ: Mapping[str, str]) -> Path:
    """Where Inductor keeps its precompiled headers: `torch._inductor.codecache._HEADER_DIR`, i.e.
    `<default_cache_dir()>/precompiled_headers` (torch/_inductor/runtime/cache_dir_utils.py), computed
    without importing torch."""
    return temp_dir(environ) / f"torchinductor_{user_name(environ)}" / "precompiled_headers"


def cache_roots(base: Path, key: str, environ: Mapping[str, str]) -> tuple[dict[str, Path], dict[str, str]]:
    """(cache name -> directory, the variables to export). A variable set by the user is kept as is.
    `environ` is the launcher's environment (where its TMPDIR and user name come from)."""
    roots: dict[str, Path] = {}
    exports: dict[str, str] = {}
    for name, var in CACHE_VARS.items():
        user = environ.get(var)
        if user:
            roots[name] = Path(user).expanduser()
        else:
            roots[name] = base / key[:16] / name
            exports[var] = str(roots[name])
    headers = header_dir(environ)
    # A user's TORCHINDUCTOR_CACHE_DIR may be Inductor's default directory: the headers are in it already.
    if not any(headers == r or r in headers.parents for r in map(_absolute, roots.values())):
        roots[HEADERS] = headers
    return roots, exports


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))


def make_dirs(roots: Mapping[str, Path]) -> dict[str, Path]:
    """Create the directories private to this user (the caches hold code that will be loaded and run);
    returns the roots to use. A root that exists must be a directory of this user (for root: of any
    uid, which root then acts as, see `nofollow`): a directory of another user is left out. A shared
    root (in TMPDIR, where anyone may create a directory first) is left out unless the directories the
    stage would write below TMPDIR are real directories of this user: a file restored there is read by
    the compiler."""
    usable: dict[str, Path] = {}
    for name, path in roots.items():
        if name in SHARED_ROOTS:
            if not _own_dirs(path, levels=2, missing_ok=True):  # before mkdir, which follows links
                continue
            try:
                path.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError:
                continue
            if not _own_dirs(path, levels=2):
                continue
        else:
            make_root(str(path))
            if not acceptable_root(str(path)):
                continue
        usable[name] = path
    return usable


def _own_dirs(path: Path, levels: int, missing_ok: bool = False) -> bool:
    """`path` and its `levels - 1` parents are directories (not links) owned by this user (or missing)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    for p in [path, *path.parents][:levels]:
        try:
            st = p.lstat()
        except FileNotFoundError:
            if missing_ok:
                continue
            return False
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid):
            return False
    return True


def skipped(rel: str) -> bool:
    """Locks and temporaries are no part of a cache: never published."""
    parts = rel.split("/")
    name = parts[-1]
    return "locks" in parts[:-1] or name.endswith((".lock", ".tmp", ".part")) or name.startswith(".") or ".tmp" in name


def walk_fds(roots: Mapping[str, Path]) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """(index path, directory descriptor, name, lstat) of every usable file under the roots, reached
    without following links (`nofollow.walk`); the descriptor is valid only until the next item."""
    for name, root in roots.items():
        try:
            tree = open_tree(str(root))
        except OSError:
            continue
        try:
            for parts, dfd, fn, st in nofollow_walk(tree):
                rel = "/".join((name, *parts, fn))
                if not skipped(rel):
                    yield rel, dfd, fn, st
        finally:
            tree.close()


def walk(roots: Mapping[str, Path]) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(index path, file path, stat) of every usable file under the roots; links are not followed. The
    path is for messages: files are read through `nofollow.open_file`, never by it."""
    for rel, _dfd, _fn, st in walk_fds(roots):
        name, _, inner = rel.partition("/")
        yield rel, roots[name] / inner, st


def index_parts(roots: Mapping[str, Path], rel: str) -> tuple[str, list[str]] | None:
    """(cache name, path components inside its root) of an index path; None when unsafe (untrusted input)."""
    name, sep, inner = rel.partition("/")
    if name not in roots or not sep or "\\" in inner or "\0" in inner:
        return None
    parts = inner.split("/")
    if any(p in ("", ".", "..") for p in parts) or skipped(rel):
        return None
    return name, parts


@dataclass
class Baseline:
    """What the directories held when the stage ended, and the digests the index gave for them."""

    roots: dict[str, str]
    files: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # rel -> (size, mtime_ns, atime_ns)
    digests: dict[str, str] = field(default_factory=dict)  # rel -> digest, for files as the index lists them
    bad: list[str] = field(default_factory=list)  # digests whose blob failed verification
    compiled: bool = False  # the run has been seen compiling (publish.compiled), by an earlier publish too

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        doc = {
            "roots": self.roots,
            "files": self.files,
            "digests": self.digests,
            "bad": self.bad,
            "compiled": self.compiled,
        }
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Baseline:
        doc = json.loads(path.read_text())
        files = {rel: (int(v[0]), int(v[1]), int(v[2])) for rel, v in doc.get("files", {}).items()}
        digests = dict(doc.get("digests", {}))
        base = cls(roots=dict(doc["roots"]), files=files, digests=digests, bad=list(doc.get("bad", [])))
        base.compiled = doc.get("compiled") is True
        return base


def take_baseline(roots: Mapping[str, Path], digests: dict[str, str], bad: list[str]) -> Baseline:
    """Stat every file the index lists (`digests`), backdating its atime so that a later read shows (see
    the module docstring). Files the index does not know are left out: the next publish sends them, so
    what an earlier run on this node compiled but never published (no agent, a failed upload) is not lost.
    In a shared root every file is taken: what other keys (another torch, in the same TMPDIR) left there
    is not published under this key; a header this key needs and the index lacks is published by the
    next node that has to build it.
    """
    base = Baseline(roots={k: str(v) for k, v in roots.items()}, digests=digests, bad=bad)
    for rel, dfd, fn, st in walk_fds(roots):
        if rel not in digests and rel.partition("/")[0] not in SHARED_ROOTS:
            continue
        atime = st.st_mtime_ns - ATIME_BACKDATE_NS
        try:
            os.utime(fn, ns=(atime, st.st_mtime_ns), dir_fd=dfd, follow_symlinks=False)
        except OSError:
            atime = st.st_atime_ns
        base.files[rel] = (st.st_size, st.st_mtime_ns, atime)
    return base
