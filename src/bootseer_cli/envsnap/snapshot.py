"""Capture, publish and restore environment snapshots; stamps; the setup runner.

The library behind both `bootseer exec` (stage.py) and the `baseline`/`snapshot`/`restore` verbs:

- `capture()` diffs the roots against a baseline, refuses what another node could not use
  (editable installs pointing outside the roots, files still open for writing), warns about what
  the setup changed outside the roots, and writes the blob into the node cache;
- `publish()` uploads it and writes `refs/env/<env_key>.json` last;
- `restore()` fetches (cache → swarm → store), verifies, extracts all-or-nothing, stamps;
- the stamp (`<first root>/.bootseer-env.json`) says which env keys a tree carries, with the size
  and mtime of a few sentinel files (the dist-infos' RECORDs) so a tree changed since is not trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BootseerError, IntegrityError
from .manifest import CARRIED_NAME, DIR, FILE, STAMP_NAME, Manifest

REF_KIND = "env"
FORMAT = 1
MAX_SENTINELS = 512


def lease_key(env_key: str) -> str:
    return f"env-{env_key}"


# ---- roots ---------------------------------------------------------------------------------------


def resolve_roots(cfg: Any) -> list[str]:
    """`[env] roots` (default: the running interpreter's prefix) plus `extra_roots`, normalised.

    A root nested inside another is dropped (it is scanned as part of its parent).
    """
    roots = list(cfg.get("env", "roots") or [sys.prefix]) + list(cfg.get("env", "extra_roots") or [])
    out: list[str] = []
    for r in roots:
        p = os.path.normpath(os.path.abspath(str(cfg.resolve_path(r))))
        if p == "/":
            raise BootseerError("[env] roots: '/' cannot be a root (name the directories the setup writes into)")
        if p not in out:
            out.append(p)
    return [r for r in out if not any(r != o and r.startswith(o + "/") for o in out)]


def excluded_paths(cfg: Any) -> list[str]:
    """bootseer's own state (cache, local store), which must never end up in a snapshot."""
    from ..paths import cache_root

    out = [str(cache_root())]
    if cfg.get("store", "cache_dir"):
        out.append(str(Path(cfg.get("store", "cache_dir")).expanduser()))
    uri = cfg.get("store", "uri") or ""
    if uri.startswith("file://"):
        from urllib.parse import urlparse

        out.append(urlparse(uri).path)
    elif uri and "://" not in uri:
        out.append(os.path.abspath(os.path.expanduser(uri)))
    return [os.path.normpath(p) for p in out]


def baseline_path(roots: list[str]) -> Path:
    from ..paths import cache_root

    tag = hashlib.sha256("\n".join(roots).encode()).hexdigest()[:16]
    return cache_root() / "env-baseline" / f"{tag}.manifest"


# ---- the setup -------------------------------------------------------------------------------------


def setup_environ() -> dict[str, str]:
    """The setup's environment: the running interpreter's environment comes first.

    The snapshot captures the interpreter's prefix, so `python -m pip …` or `uv pip install …` in
    the setup must install there even when bootseer was started as `/opt/venv/bin/bootseer` from a
    shell that never activated the venv.
    """
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join([bindir, *[p for p in env.get("PATH", "").split(os.pathsep) if p != bindir]])
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return env


def run_setup(cfg: Any, info: Callable[[str], None]) -> None:
    """Run each `[env] setup` command through the shell in the config file's directory.

    Output goes to our stderr (stdout belongs to the launcher). A failing command stops here with
    its exit status, which `bootseer exec` passes on.
    """
    from ..launch import StageFatal

    env = setup_environ()
    for cmd in cfg.get("env", "setup"):
        info(f"env setup: {cmd}")
        sys.stderr.flush()
        rc = subprocess.run(
            cmd, shell=True, cwd=cfg.base_dir, stdout=sys.stderr.fileno(), check=False, env=env
        ).returncode
        if rc != 0:
            code = 128 - rc if rc < 0 else rc
            raise StageFatal(f"[env] setup command failed (exit {code}): {cmd}", code)


class LeaseKeeper:
    """Renews a single-flight lease in the background while a long setup runs."""

    def __init__(self, lease: Any, ttl_s: float) -> None:
        self.lease = lease
        self.ttl_s = ttl_s
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="bootseer-lease", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            with contextlib.suppress(Exception):
                self.lease.renew(self.ttl_s)

    def __enter__(self) -> LeaseKeeper:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop renewing and release, waiting a few seconds at most: the ref is written before this,
        so a slow store only delays the lease's expiry for others, never their restore."""
        self._stop.set()

        def release() -> None:
            with contextlib.suppress(Exception):
                self.lease.release()

        t = threading.Thread(target=release, name="bootseer-lease-release", daemon=True)
        t.start()
        t.join(3.0)


# ---- capture ---------------------------------------------------------------------------------------


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def editable_outside(after: Manifest, changed: list[str], roots: list[str]) -> list[str]:
    """Editable installs the setup made whose code lives outside the roots (another node lacks it)."""
    bad: list[str] = []
    for p in changed:
        if after[p].kind != FILE:
            continue
        name = os.path.basename(p)
        try:
            if name.endswith(".pth") and after[p].size < 1 << 20:
                for line in Path(p).read_text(errors="replace").splitlines():
                    line = line.strip()
                    is_path = line and not line.startswith(("#", "import ")) and os.path.isabs(line)
                    if is_path and not _under(os.path.normpath(line), roots):
                        bad.append(f"{p} adds {line} to sys.path")
            elif name == "direct_url.json" and after[p].size < 1 << 20:
                doc = json.loads(Path(p).read_text())
                url = doc.get("url", "")
                if doc.get("dir_info", {}).get("editable") and url.startswith("file://"):
                    from urllib.parse import unquote, urlparse

                    src = os.path.normpath(unquote(urlparse(url).path))
                    if not _under(src, roots):
                        bad.append(f"{os.path.dirname(p)} is an editable install of {src}")
        except (OSError, ValueError, AttributeError):
            continue
    return bad


def open_for_writing(paths: set[str]) -> list[str]:
    """Which of `paths` some process holds open for writing (from /proc/<pid>/fd and fdinfo)."""
    found: list[str] = []
    me = os.getpid()
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target not in paths:
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags = _fdinfo_flags(f.read())
            except OSError:
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                found.append(f"{target} (pid {pid})")
    return found


def _fdinfo_flags(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8)
    return 0


def outside_changes(since: float, roots: list[str], exclude: list[str], budget_s: float = 1.5) -> list[str]:
    """Files the setup changed outside the roots, looked for (bounded) where setups usually write.

    They will not be in the snapshot, so another node restoring it will lack them: a warning, not
    an error (many such writes are caches, e.g. pip's). Each place gets a share of the time budget
    and is walked newest directory first, so a fresh install is found before old bulk.
    """
    import sysconfig

    home = os.path.expanduser("~")
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    places = [base["purelib"], base["platlib"], base["scripts"], "/usr/local", "/opt", "/etc", home]
    skip = [*roots, *exclude, "/proc", "/sys", "/dev"]
    found: list[str] = []
    seen: set[str] = set()
    places = [os.path.normpath(p) for p in places]
    places = [p for p in dict.fromkeys(places) if not _under(p, skip) and os.path.isdir(p)]
    for top in places:
        t_end = time.monotonic() + budget_s / max(1, len(places))
        stack = [top]
        while stack and time.monotonic() < t_end and len(found) < 50:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            try:
                it = os.scandir(d)
            except OSError:
                continue
            subdirs: list[tuple[float, str]] = []
            with it:
                for e in it:
                    if _under(e.path, skip) or (d == home and e.name.startswith(".") and e.name != ".local"):
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append((st.st_mtime, e.path))
                    elif st.st_ctime >= since or st.st_mtime >= since:
                        found.append(e.path)
            stack.extend(p for _, p in sorted(subdirs))  # newest last: popped first
    return found


@dataclass
class Captured:
    blob: Path
    digest: str
    size: int
    files: int
    raw_bytes: int
    deletions: int
    entries: list[list[Any]]
    deletion_paths: list[str]


def capture(
    cfg: Any,
    roots: list[str],
    baseline: Manifest,
    env_key: str,
    cache: Any,
    warn: Callable[[str], None],
    since: float | None = None,
    progress: bool | None = None,
) -> Captured:
    """Write the snapshot of what changed under `roots` since `baseline` into the node cache."""
    from ..progress import byte_bar
    from .archive import ArchiveWriter
    from .manifest import diff, hardlink_groups, scan

    exclude = excluded_paths(cfg)
    after = scan(roots, exclude)
    d = diff(baseline, after)
    problems = editable_outside(after, d.changed, roots)
    if problems:
        raise BootseerError(
            "cannot snapshot: editable installs point outside the roots, another node would lack their code: "
            + "; ".join(problems[:5])
            + " (install them non-editable, or add their directories to [env] extra_roots)"
        )
    busy = open_for_writing({p for p in d.changed if after[p].kind == FILE})
    if busy:
        raise BootseerError(
            "cannot snapshot: files are still open for writing (a setup process still running?): " + ", ".join(busy[:5])
        )
    if since is not None:
        outside = outside_changes(since, roots, exclude)
        if outside:
            shown = ", ".join(outside[:8]) + (" …" if len(outside) > 8 else "")
            warn(f"the setup changed {len(outside)} file(s) outside [env] roots; they are not in the snapshot: {shown}")
    links = hardlink_groups(after, d.changed)
    tmp_dir = cache.root / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"snap-{uuid.uuid4().hex[:12]}.tar.zst"
    total = sum(after[p].size for p in d.changed if after[p].kind == FILE)
    w = ArchiveWriter(tmp)
    try:
        with byte_bar(total, "capture", enabled=progress) as advance:
            w._progress = advance
            for p in d.changed:
                w.add(p, after[p], link_to=links.get(p))
        meta = {
            "roots": roots,
            "deletions": d.deleted,
            "env_key": env_key,
            "created": time.time(),
            "creator": socket.gethostname(),
        }
        written = w.finish(meta)
    except BaseException:
        w.abort()
        raise
    return Captured(
        tmp, written.digest, written.size, written.files, written.raw_bytes, len(d.deleted), w.entries, d.deleted
    )


def publish(cfg: Any, store: Any, cap: Captured, env_key: str, roots: list[str], progress: bool | None = None) -> Path:
    """Upload the blob, adopt it into the node cache, then write the ref (last). Returns the cached path."""
    from .. import delivery
    from ..cache import cache_from_config
    from ..progress import byte_bar

    with byte_bar(cap.size, "upload", enabled=progress) as advance:
        store.put_blob_file(cap.blob, cap.digest, progress=advance)
    path = cache_from_config(cfg).adopt(cap.blob, cap.digest)
    extra = delivery.after_publish(cfg, store, cap.digest, path) or {}
    doc = {
        "blob": cap.digest,
        "size": cap.size,
        "files": cap.files,
        "bytes": cap.raw_bytes,
        "deletions": cap.deletions,
        "created": time.time(),
        "creator": socket.gethostname(),
        "roots": roots,
        "format": FORMAT,
        **extra,
    }
    store.write_ref(REF_KIND, env_key, doc)
    return path


# ---- restore ---------------------------------------------------------------------------------------


@dataclass
class Restored:
    digest: str
    files: int
    raw_bytes: int
    source: str
    bytes_from_store: int
    bytes_from_peers: int
    seconds_fetch: float
    seconds_extract: float
    fetch_note: str = ""  # why the swarm was not used, when it was enabled


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch_verified(cfg: Any, store: Any, digest: str, size: int | None, progress: bool | None = None) -> Any:
    """The blob on local disk, its digest checked (a cached copy is re-checked; a bad one refetched)."""
    from .. import delivery
    from ..cache import cache_from_config
    from ..progress import byte_bar

    cache = cache_from_config(cfg)
    for attempt in range(2):
        with byte_bar(size, "download", enabled=progress) as advance:
            fetched = delivery.fetch_blob(cfg, store, digest, advance, cache=cache)
        if fetched.source == "store" or _sha256_file(fetched.path) == digest:
            return fetched
        Path(fetched.path).unlink(missing_ok=True)  # a corrupt cached copy: drop it, fetch again
        if attempt:
            break
    raise IntegrityError(f"blob {digest[:12]} does not match its digest")


def restore(
    cfg: Any,
    store: Any,
    env_key: str,
    roots: list[str],
    ref: dict[str, Any] | None = None,
    progress: bool | None = None,
    extra_keys: tuple[str, ...] = (),
) -> Restored | None:
    """Restore the snapshot for `env_key` under `roots`; None when the store has none.

    Raises IntegrityError/UnsafeArchive/RestoreError when the snapshot cannot be used; the tree is
    then as it was before (the message says so).
    """
    from ..progress import byte_bar
    from .archive import extract, read_meta

    if ref is None:
        ref = store.read_ref(REF_KIND, env_key)
        if ref is None:
            return None
    digest = ref.get("blob")
    if not isinstance(digest, str) or ref.get("format") != FORMAT:
        raise IntegrityError(f"ref env/{env_key[:16]} is malformed or of an unknown format")
    t0 = time.monotonic()
    try:
        fetched = fetch_verified(cfg, store, digest, ref.get("size"), progress)
    except IntegrityError:
        with contextlib.suppress(Exception):
            store.delete_blob(digest)  # a bad blob in the store: let the next capture replace it
        raise
    t1 = time.monotonic()
    meta = read_meta(Path(fetched.path))
    outside = [r for r in meta["roots"] if not _under(r, roots)]
    if outside:
        raise IntegrityError(
            f"the snapshot was captured for roots {', '.join(meta['roots'])}, which this node's roots "
            f"({', '.join(roots)}) do not contain; nothing restored"
        )
    switch = _switch_deletions(roots, meta, digest)
    remove_stamp(roots)
    plan_meta = dict(meta, deletions=[*meta["deletions"], *switch]) if switch else meta
    with byte_bar(int(ref.get("bytes") or 0) or None, "restore", enabled=progress) as advance:
        ex = extract(Path(fetched.path), plan_meta, roots, progress=advance)
    t2 = time.monotonic()
    write_stamp(roots, [env_key, *extra_keys], digest, meta["entries"], meta["deletions"])
    return Restored(
        digest,
        ex.files,
        ex.raw_bytes,
        fetched.source,
        fetched.bytes_from_store,
        fetched.bytes_from_peers,
        t1 - t0,
        t2 - t1,
        fetched.note,
    )


EXIT_MISS = 3


def restore_verb(cfg: Any, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """`bootseer restore`: 0 when the env is present or restored, 3 when the store has no snapshot.

    Kept free of typer so the entry point can run it without the CLI framework's import cost.
    """
    from ..keys import compute
    from ..store import store_from_config

    roots = resolve_roots(cfg)
    key = compute(cfg).env.digest
    ok, why = stamp_state(roots, key)
    if ok:
        out(f"env {key[:16]} already present")
        return 0
    if why.startswith("stale"):
        err(f"bootseer: warning: {why}")
    r = restore(cfg, store_from_config(cfg), key, roots)
    if r is None:
        err(f"no snapshot for env {key[:16]}")
        return EXIT_MISS
    mb = r.raw_bytes / 1e6
    out(
        f"restored env {key[:16]}: {r.files} files ({mb:.1f} MB) from {r.source} "
        f"in {r.seconds_fetch + r.seconds_extract:.2f} s (fetch {r.seconds_fetch:.2f} s, "
        f"extract {r.seconds_extract:.2f} s)"
    )
    return 0


# ---- stamps ----------------------------------------------------------------------------------------


def stamp_path(roots: list[str]) -> Path:
    return Path(roots[0]) / STAMP_NAME


def _sentinels(entries: list[list[Any]]) -> list[str]:
    files = [e[0] for e in entries if e[1] == FILE]
    picks = [p for p in files if p.endswith(".dist-info/RECORD")][:MAX_SENTINELS]
    if len(picks) < 16 and files:
        step = max(1, len(files) // 16)
        picks += [p for p in files[::step] if p not in picks][: 16 - len(picks)]
    return picks


def carried_path(roots: list[str]) -> Path:
    return Path(roots[0]) / CARRIED_NAME


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
    baseline is the image again, and the new snapshot does not lean on the old env's files)."""
    import shutil

    doc = read_carried(roots)
    if doc is None:
        return
    paths = [p for p in doc["paths"] if isinstance(p, str) and _under(p, roots) and p not in roots]
    removed = 0
    for p in sorted(paths, key=lambda q: q.count("/")):
        if not os.path.lexists(p):
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)
        removed += 1
    carried_path(roots).unlink(missing_ok=True)
    if removed:
        info(f"env: removed {removed} path(s) of the env this tree carried before")


def _switch_deletions(roots: list[str], meta: dict[str, Any], digest: str) -> list[str]:
    """Paths of the env the tree carries now that the snapshot being restored does not have.

    Raises IntegrityError when the old env deleted files of the image that the new one keeps: they
    cannot be brought back from a snapshot (the setup must run instead).
    """
    doc = read_carried(roots)
    if doc is None or doc.get("blob") == digest:
        return []
    new_paths = {e[0] for e in meta["entries"]}
    new_deleted = set(meta["deletions"])
    lost = [p for p in doc.get("deletions") or [] if p not in new_deleted and p not in new_paths]
    lost = [p for p in lost if not any(p == d or p.startswith(d + "/") for d in new_deleted)]
    if lost:
        raise IntegrityError(
            f"this tree carries another env that deleted {len(lost)} file(s) of the image (e.g. {lost[0]}), "
            "which the snapshot cannot bring back"
        )
    return sorted(p for p in doc["paths"] if isinstance(p, str) and p not in new_paths)


def write_stamp(
    roots: list[str], keys: list[str], digest: str | None, entries: list[list[Any]], deletions: list[str] | None = None
) -> None:
    """Say, last of all, that this tree carries the env for `keys` (temporary name, then rename).

    Beside the stamp, `.bootseer-env.paths` lists what the env added and deleted, so that a later
    switch to another env can remove this one's files first.
    """
    carried = {"blob": digest, "paths": [e[0] for e in entries], "deletions": list(deletions or [])}
    cpath = carried_path(roots)
    if cpath.parent.is_dir():
        ctmp = cpath.with_name(f"{cpath.name}.tmp-{os.getpid()}")
        ctmp.write_text(json.dumps(carried))
        os.replace(ctmp, cpath)
    sentinels: dict[str, list[int]] = {}
    for p in _sentinels(entries):
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            sentinels[p] = [st.st_size, st.st_mtime_ns]
    doc = {"env_keys": list(dict.fromkeys(keys)), "blob": digest, "written": time.time(), "sentinels": sentinels}
    path = stamp_path(roots)
    if not path.parent.is_dir():
        return
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


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


def entries_of(after: Manifest, changed: list[str]) -> list[list[Any]]:
    """Entry rows (as the archive lists them) for a stamp written without an archive."""
    return [[p, after[p].kind, after[p].mode, after[p].size, 0, ""] for p in changed if after[p].kind != DIR]
