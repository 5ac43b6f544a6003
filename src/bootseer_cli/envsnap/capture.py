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
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BootseerError
from ..gcpause import collector_paused
from .format import ArchiveEntry
from .manifest import FILE, Diff, Manifest, read_small, under
from .segments import BigWriter, write_blob
from .setup import excluded_paths

if TYPE_CHECKING:
    from ..settings import StoreSettings
    from ..store.cache import BlobCache
    from .setupwrites import Written


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
                data = read_small(p)
                if b"\0" in data:  # a torch.save file named .pth (torchmetrics ships some), not a path file
                    continue
                for line in data.decode(errors="replace").splitlines():
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


OUTSIDE_BUDGET_S = 1.5  # the look outside the roots: a warning only, so a bounded walk


def outside_places(
    roots: list[str], exclude: list[str], since: float | None = None
) -> tuple[list[str], list[str], set[str]]:
    """Where setups usually write outside the roots (the places to look), what not to descend into,
    and the directories whose own entries alone are looked at (`shallow`).

    The base interpreter's site-packages and scripts are written by installers, and an install,
    upgrade or removal there always changes the directory itself (pip writes or renames a `.dist-info`
    at its top, a script in `bin`): one whose mtime and ctime are older than `since` holds no new
    install. Its own entries are still looked at (a `.pth` appended to in place), not its packages: a
    large one spent its whole share of the budget in them otherwise, on every capture (0.27 s of a
    small layer's 0.3 s).

    Computed by the caller's process: `sysconfig` is imported here, never in a forked child (an
    import lock another thread held at the fork would hang it)."""
    import sysconfig

    from .setupwrites import look_places

    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    installs = {os.path.normpath(base[k]) for k in ("purelib", "platlib", "scripts")}
    places = look_places()  # the setup's mounts there are the ones watched (setupwrites.py)
    skip = [*roots, *exclude, "/proc", "/sys", "/dev"]
    # as a place, or met inside another (/usr/local holds a Docker image's site-packages)
    shallow = {p for p in installs if not _changed_since(p, since)} if since is not None else set()
    places = [os.path.normpath(p) for p in places]
    return [p for p in dict.fromkeys(places) if not under(p, skip) and os.path.isdir(p)], skip, shallow


def _changed_since(path: str, since: float) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return True  # not known: looked at as before
    return st.st_mtime >= since or st.st_ctime >= since


def walk_outside(
    since: float,
    places: list[str],
    skip: list[str],
    home: str,
    budget_s: float = OUTSIDE_BUDGET_S,
    shallow: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """Files the setup changed outside the roots, looked for (bounded) where setups usually write.

    They will not be in the snapshot, so another node restoring it will lack them: a warning, not
    an error (many such writes are caches, e.g. pip's). Each place gets a share of the time budget
    and is walked newest directory first, so a fresh install is found before old bulk. A `shallow`
    directory's files are looked at, not its subdirectories (`outside_places`).
    """
    found: list[str] = []
    seen: set[str] = set()
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
                        if d not in shallow:
                            subdirs.append((st.st_mtime, e.path))
                    elif st.st_ctime >= since or st.st_mtime >= since:
                        found.append(e.path)
            stack.extend(p for _, p in sorted(subdirs))  # newest last: popped first
    return found


class OutsideLook:
    """`walk_outside` in a forked child at the lowest CPU priority, beside the scan and the blob.

    A thread of the capturing process held the GIL against the scan (0.4 s of scan took 0.75 s) and
    took its CPU from the segment writers; a child at nice 19 walks on whatever core is idle (the
    scan waits for inodes on a cold cache) and yields to the writers. What it found by `result()`
    is the warning; a child that outlives its budget by `grace_s` is killed and found nothing."""

    def __init__(self, since: float | None, roots: list[str], exclude: list[str], grace_s: float = 2.0) -> None:
        self.pid = 0
        self.fd = -1
        self.deadline = time.monotonic() + OUTSIDE_BUDGET_S + grace_s
        self.found: list[str] = []
        if since is None:
            return
        since, home = max(since, _pid1_started()), os.path.expanduser("~")
        places, skip, shallow = outside_places(roots, exclude, since)
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            raise
        if pid == 0:  # pragma: no cover - runs in the child
            payload = b"[]"
            try:
                os.close(r)
                os.nice(19)
                payload = json.dumps(walk_outside(since, places, skip, home, shallow=shallow)).encode()
            except BaseException:  # a warning only: an error here finds nothing
                pass
            finally:
                with contextlib.suppress(OSError):
                    os.write(w, payload)  # at most 50 paths: within one pipe buffer
                os._exit(0)
        os.close(w)
        self.pid, self.fd = pid, r

    def result(self) -> list[str]:
        """What the child found (waiting for it until its deadline); the child is reaped."""
        if self.fd < 0:
            return self.found
        import select

        data = b""
        try:
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                    data = b""  # past its deadline: nothing (a warning only)
                    break
                piece = os.read(self.fd, 1 << 16)
                if not piece:
                    break
                data += piece
            with contextlib.suppress(ValueError, TypeError):
                self.found = [p for p in json.loads(data or b"[]") if isinstance(p, str)]
        finally:
            self.close()
        return self.found

    def close(self) -> None:
        """Stop the child (if it still walks) and reap it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, 9)
            with contextlib.suppress(OSError):
                os.waitpid(self.pid, 0)
            self.pid = 0


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
    # files a layer's setup rewrote with its parent's bytes (rewrites.py): not in the blob, in the stamp
    unchanged: list[ArchiveEntry] = field(default_factory=list)
    # the blob holds every path under the roots (bootseer's per-tree files aside) and deletes nothing:
    # it is the whole tree, and the env image (envmount/image.py) is packed from it as it is
    whole: bool = False


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


@collector_paused()
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
    parents: Sequence[tuple[str, Path | None]] = (),
    setup_writes: Written | None = None,
) -> Captured:
    """Write the snapshot of what changed under `roots` since `baseline` into the node cache.

    `parents`: a layer's chain, newest first (digest, the blob's local path or None): files rewritten
    with the bytes the chain holds for them are left out (rewrites.py). `setup_writes`: the files the
    setup's processes wrote, which the warning about changes outside the roots is limited to
    (setupwrites.py; None: unknown). The cyclic collector is paused
    meanwhile: the scan's and the diff's tens of thousands of entries form no cycles (gcpause.py)."""
    from .manifest import diff, scan

    exclude = excluded_paths(store)
    t0 = time.monotonic()
    tmp = _tmp_blob(cache)
    # the look outside the roots (a warning only) runs beside the scan and the blob's writing; the large
    # changed files are written while the scan goes on (`segments.BigWriter`)
    look = _look_outside(since, roots, exclude)
    big = BigWriter(tmp.with_name(f"{tmp.name}.partbig"), baseline, roots, defer_same_size=bool(parents))
    try:
        after = scan(roots, exclude, on_entry=big.offer)
        d = diff(baseline, after)
        unchanged = _leave_out_identical(baseline, after, d, parents)
        _refuse_unportable(after, d.changed, roots)
        t1 = time.monotonic()
        meta = {"roots": roots, "deletions": d.deleted, "env_key": env_key, "created": time.time()}
        meta["creator"] = os.uname().nodename  # what socket.gethostname() returns
        written, entries = write_blob(tmp, after, d.changed, meta, progress, big)
        t2 = time.monotonic()
        outside = look.result()
    finally:
        big.abort()
        look.close()
    from .setupwrites import attribute

    _warn_outside(attribute(outside, setup_writes), warn, info)
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
        unchanged=unchanged,
        whole=_is_whole(after, d.changed, d.deleted, roots),
    )


def _is_whole(after: Manifest, changed: list[str], deleted: list[str], roots: list[str]) -> bool:
    """Whether the blob of `changed` is the whole tree `after` (its per-tree `.bootseer-env.*` files aside)."""
    from ..envmount.image import OWN_PREFIX

    if deleted:
        return False
    own = tuple(os.path.join(r, OWN_PREFIX) for r in roots)
    tree = {p for p in after if not p.startswith(own)}
    return len(changed) == len(tree) and tree.issuperset(changed)


def _tmp_blob(cache: BlobCache) -> Path:
    """Where the snapshot is written, in the node cache's tmp (renamed into the cache once published)."""
    tmp_dir = cache.root / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    return tmp_dir / f"snap-{os.urandom(6).hex()}.tar.zst"  # not uuid/socket: ~10 ms of imports before the scan


def _look_outside(since: float | None, roots: list[str], exclude: list[str]) -> OutsideLook:
    """The look outside the roots (a warning only, up to 1.5 s of walking), started in a child at the
    lowest priority; without a fork (a process limit) the warning is skipped and the capture goes on."""
    try:
        return OutsideLook(since, roots, exclude)
    except OSError:
        return OutsideLook(None, roots, exclude)


def _leave_out_identical(
    baseline: Manifest, after: Manifest, d: Diff, parents: Sequence[tuple[str, Path | None]]
) -> list[ArchiveEntry]:
    """Drop from `d` the files rewritten with the parent's bytes; their entries, for the stamp."""
    if not parents:
        return []
    from .rewrites import identical_rewrites

    same = identical_rewrites(baseline, after, d.changed, parents)
    if not same:
        return []
    d.changed = [p for p in d.changed if p not in same]
    return [ArchiveEntry(p, FILE, after[p].mode, after[p].size, after[p].mtime_ns // 10**9, "") for p in sorted(same)]


def _warn_outside(outside: list[str], warn: Callable[[str], None], info: Callable[[str], None] | None) -> None:
    """What the setup changed outside the roots: a warning (the runtime's own files only a note)."""
    managed = [p for p in outside if p in RUNTIME_MANAGED]
    outside = [p for p in outside if p not in RUNTIME_MANAGED]
    if managed and info is not None:
        info(f"env: ignored {', '.join(managed)}: the container runtime writes them, not the setup")
    if outside:
        shown = ", ".join(outside[:8]) + (" …" if len(outside) > 8 else "")
        warn(f"the setup changed {len(outside)} file(s) outside [env] roots; they are not in the snapshot: {shown}")
