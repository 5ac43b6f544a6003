"""Capturing an env snapshot: what changed under the roots since the baseline, written as a blob
into the node cache.

`capture()` diffs the roots against a baseline, refuses what another node could not use (editable
installs pointing outside the roots, files still open for writing), warns about what the setup
changed outside the roots, and writes the blob (in forked segments on several cores). Publishing it
is `publish.py`; the blob format is `format.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from .format import ArchiveEntry, ArchiveWriter, Written
from .manifest import FILE, Manifest, read_small, under
from .setup import excluded_paths

if TYPE_CHECKING:
    from ..cache import BlobCache
    from ..settings import StoreSettings


# Written by the container runtime (Docker, Podman, the kubelet) when it creates the container, a
# moment before the setup starts: not the setup's changes, and no other node wants this node's copy.
RUNTIME_MANAGED = frozenset(("/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/etc/mtab", "/etc/.pwd.lock"))


def editable_outside(after: Manifest, changed: list[str], roots: list[str]) -> list[str]:
    """Editable installs the setup made whose code lives outside the roots (another node lacks it)."""
    bad: list[str] = []
    for p in changed:
        if after[p].kind != FILE:
            continue
        name = os.path.basename(p)
        try:  # read as the blob's writer reads: no-follow, never blocking on a FIFO swapped in
            if name.endswith(".pth") and after[p].size < 1 << 20:
                for line in read_small(p).decode(errors="replace").splitlines():
                    line = line.strip()
                    is_path = line and not line.startswith(("#", "import ")) and os.path.isabs(line)
                    if is_path and not under(os.path.normpath(line), roots):
                        bad.append(f"{p} adds {line} to sys.path")
            elif name == "direct_url.json" and after[p].size < 1 << 20:
                doc = json.loads(read_small(p))
                url = doc.get("url", "")
                if doc.get("dir_info", {}).get("editable") and url.startswith("file://"):
                    from urllib.parse import unquote, urlparse

                    src = os.path.normpath(unquote(urlparse(url).path))
                    if not under(src, roots):
                        bad.append(f"{os.path.dirname(p)} is an editable install of {src}")
        except (OSError, ValueError, AttributeError):
            continue
    return bad


def open_for_writing(paths: set[str]) -> list[str]:
    """Which of `paths` some process holds open for writing (from /proc/<pid>/fd and fdinfo).

    A path matches only where the open file is the very file (device and inode) this process sees there."""
    found: list[str] = []
    ours: dict[str, tuple[int, int] | None] = {}
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
                if not flags & (os.O_WRONLY | os.O_RDWR):
                    continue
                theirs = os.stat(f"{fd_dir}/{fd}")  # the open file itself, whatever namespace it lives in
            except OSError:
                continue
            if _identity(target, ours) == (theirs.st_dev, theirs.st_ino):
                found.append(f"{target} (pid {pid})")
    return found


def _identity(path: str, seen: dict[str, tuple[int, int] | None]) -> tuple[int, int] | None:
    """`path`'s (device, inode) in this mount namespace, looked up once: a process in another namespace
    (another job's node with its venv mounted at the same path) can show the same path for another file."""
    if path not in seen:
        try:
            st = os.lstat(path)
            seen[path] = (st.st_dev, st.st_ino)
        except OSError:
            seen[path] = None
    return seen[path]


def _fdinfo_flags(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8)
    return 0


def _pid1_started() -> float:
    """When this (container's) PID 1 started, as a wall-clock time; 0 when unknown.

    Nothing written before it started can be the setup's work: in a container started right after its
    image was built (a CI pre-warm), the image's own files are only a second older than the setup."""
    try:
        with open("/proc/1/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0.0
    # the boot time from the two clocks (/proc/stat's btime is whole seconds: too coarse here)
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def outside_changes(since: float, roots: list[str], exclude: list[str], budget_s: float = 1.5) -> list[str]:
    """Files the setup changed outside the roots, looked for (bounded) where setups usually write.

    They will not be in the snapshot, so another node restoring it will lack them: a warning, not
    an error (many such writes are caches, e.g. pip's). Each place gets a share of the time budget
    and is walked newest directory first, so a fresh install is found before old bulk.
    """
    import sysconfig

    since = max(since, _pid1_started())
    home = os.path.expanduser("~")
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    places = [base["purelib"], base["platlib"], base["scripts"], "/usr/local", "/opt", "/etc", home]
    skip = [*roots, *exclude, "/proc", "/sys", "/dev"]
    found: list[str] = []
    seen: set[str] = set()
    places = [os.path.normpath(p) for p in places]
    places = [p for p in dict.fromkeys(places) if not under(p, skip) and os.path.isdir(p)]
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
                    if under(e.path, skip) or (d == home and e.name.startswith(".") and e.name != ".local"):
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
    """A capture in the node cache (not yet published), with what the ref and the stamp need of it."""

    blob: Path
    digest: str
    size: int
    files: int
    raw_bytes: int
    deletions: int
    entries: list[ArchiveEntry]
    deletion_paths: list[str]
    seconds: dict[str, float] = field(default_factory=dict)  # scan, write, outside_wait: for profiles


def _refuse_unportable(after: Manifest, changed: list[str], roots: list[str]) -> None:
    """What another node could not use: editable installs of code outside the roots, files still being written."""
    problems = editable_outside(after, changed, roots)
    if problems:
        raise BootseerError(
            "cannot snapshot: editable installs point outside the roots, another node would lack their code: "
            + "; ".join(problems[:5])
            + " (install them non-editable, or add their directories to [env] extra_roots)"
        )
    busy = open_for_writing({p for p in changed if after[p].kind == FILE})
    if busy:
        raise BootseerError(
            "cannot snapshot: files are still open for writing (a setup process still running?): " + ", ".join(busy[:5])
        )


def _write_blob(
    tmp: Path, after: Manifest, changed: list[str], meta: dict[str, Any], progress: bool | None
) -> tuple[Written, list[ArchiveEntry]]:
    """The blob of `changed` at `tmp` (removed again on any failure); its summary and entries.

    With several cores (and fork), contiguous segments of `changed` are written by forked workers,
    each reading, framing and compressing its own files (Python's per-file work in parallel, not
    only zstd's), and appended in order; else one writer does it all."""
    from ..progress import byte_bar
    from .manifest import hardlink_groups

    links = hardlink_groups(after, changed)
    total = sum(after[p].size for p in changed if after[p].kind == FILE)
    workers = min(os.cpu_count() or 1, max(1, len(changed) // SEGMENT_MIN_ENTRIES))
    w: ArchiveWriter | None = None
    try:
        with byte_bar(total, "capture", enabled=progress) as advance:
            w = ArchiveWriter(tmp, progress=advance)
            if workers > 1 and hasattr(os, "fork"):
                _write_segments(w, tmp, after, changed, links, workers, advance)
            else:
                for p in changed:
                    w.add(p, after[p], link_to=links.get(p))
            return w.finish(meta), w.entries
    except BaseException:
        if w is not None:
            w.abort()
        raise


SEGMENT_MIN_ENTRIES = 2000  # fewer entries per worker than this: forking costs more than it saves


def _segments(after: Manifest, changed: list[str], n: int) -> list[list[str]]:
    """`changed` cut into `n` contiguous runs of about equal bytes (each entry counts a header block)."""
    weight = [(after[p].size if after[p].kind == FILE else 0) + 512 for p in changed]
    share = sum(weight) / n
    out: list[list[str]] = [[]]
    acc = 0.0
    for p, wgt in zip(changed, weight, strict=True):
        if acc >= share * len(out) and len(out) < n:
            out.append([])
        out[-1].append(p)
        acc += wgt
    return [seg for seg in out if seg]


def _write_segments(
    w: ArchiveWriter,
    tmp: Path,
    after: Manifest,
    changed: list[str],
    links: dict[str, str],
    workers: int,
    advance: Callable[[int], None],
) -> None:
    """Fork one writer per segment, then append their outputs to `w` in order as each finishes.

    A hardlink's target is in its own or an earlier segment, so it stays ahead of the link."""
    from .format import CHUNK_BYTES

    targets = set(links.values())
    big = [
        p
        for p in changed
        if after[p].kind == FILE and after[p].size > CHUNK_BYTES // 2 and p not in links and p not in targets
    ]
    small = [p for p in changed if p not in set(big)] if big else changed
    # the small files in `workers` segments, one thread each; the large ones last, in one more worker
    # whose zstd uses every core (a 434 MB libtorch_cpu.so on one thread would outlast all the rest)
    plan = [(seg, 1) for seg in _segments(after, small, workers)] + ([(big, os.cpu_count() or 1)] if big else [])
    import gc

    kids: list[tuple[int, int, Path]] = []
    try:
        gc.freeze()  # the manifest stays shared copy-on-write: no child's collection walks (copies) it
        try:
            for k, (seg, threads) in enumerate(plan):
                part = tmp.with_name(f"{tmp.name}.part{k}")
                r, wfd = os.pipe()
                pid = os.fork()
                if pid == 0:  # pragma: no cover - runs in the child
                    gc.disable()
                    os.close(r)
                    _segment_child(part, seg, after, links, threads, wfd)
                os.close(wfd)
                kids.append((pid, r, part))
        finally:
            gc.unfreeze()
        for pid, r, part in kids:
            with os.fdopen(r, "rb") as f:
                doc = json.loads(f.read() or b'{"error": "a capture worker died"}')
            os.waitpid(pid, 0)
            if "error" in doc:
                raise BootseerError(str(doc["error"]))
            w.append_segment(part, doc)
            advance(doc["raw"])
            part.unlink(missing_ok=True)
    finally:
        for _pid, _r, part in kids:
            part.unlink(missing_ok=True)


def _segment_child(  # pragma: no cover - runs in a forked child
    part: Path, seg: list[str], after: Manifest, links: dict[str, str], threads: int, wfd: int
) -> None:
    """Write one segment and report it (or the error) as JSON on `wfd`; never returns."""
    try:
        sw = ArchiveWriter(part, threads=threads, segment=True)
        for p in seg:
            sw.add(p, after[p], link_to=links.get(p))
        payload = json.dumps(sw.end_segment())
    except BaseException as e:  # reported to the parent, which raises it
        payload = json.dumps({"error": str(e) or type(e).__name__})
    try:
        with os.fdopen(wfd, "w") as out:
            out.write(payload)
    finally:
        os._exit(0)


def capture(
    store: StoreSettings,
    roots: list[str],
    baseline: Manifest,
    env_key: str,
    cache: BlobCache,
    warn: Callable[[str], None],
    since: float | None = None,
    progress: bool | None = None,
    info: Callable[[str], None] | None = None,
) -> Captured:
    """Write the snapshot of what changed under `roots` since `baseline` into the node cache."""
    from .manifest import diff, scan

    exclude = excluded_paths(store)
    t0 = time.monotonic()
    # the look outside the roots (a warning only, up to 1.5 s of walking) runs beside the scan and the
    # blob's writing: started first, its CPU falls mostly in the scan's waits for inodes (a cold cache),
    # not on the writers' two cores
    outside: list[str] = []

    def look() -> None:
        if since is not None:
            with contextlib.suppress(OSError, ValueError):  # a warning only: never a traceback from here
                outside.extend(outside_changes(since, roots, exclude))

    looker = threading.Thread(target=look, name="bootseer-outside", daemon=True)
    looker.start()
    after = scan(roots, exclude)
    d = diff(baseline, after)
    _refuse_unportable(after, d.changed, roots)
    t1 = time.monotonic()
    tmp_dir = cache.root / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"snap-{uuid.uuid4().hex[:12]}.tar.zst"
    meta = {
        "roots": roots,
        "deletions": d.deleted,
        "env_key": env_key,
        "created": time.time(),
        "creator": socket.gethostname(),
    }
    written, entries = _write_blob(tmp, after, d.changed, meta, progress)
    t2 = time.monotonic()
    looker.join()
    _warn_outside(outside, warn, info)
    return Captured(
        tmp,
        written.digest,
        written.size,
        written.files,
        written.raw_bytes,
        len(d.deleted),
        entries,
        d.deleted,
        seconds={"scan": t1 - t0, "write": t2 - t1, "outside_wait": time.monotonic() - t2},
    )


def _warn_outside(outside: list[str], warn: Callable[[str], None], info: Callable[[str], None] | None) -> None:
    """What the setup changed outside the roots: a warning (the runtime's own files only a note)."""
    managed = [p for p in outside if p in RUNTIME_MANAGED]
    outside = [p for p in outside if p not in RUNTIME_MANAGED]
    if managed and info is not None:
        info(f"env: ignored {', '.join(managed)}: the container runtime writes them, not the setup")
    if outside:
        shown = ", ".join(outside[:8]) + (" …" if len(outside) > 8 else "")
        warn(f"the setup changed {len(outside)} file(s) outside [env] roots; they are not in the snapshot: {shown}")
