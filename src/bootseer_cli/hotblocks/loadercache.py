"""Does a loader whose tree drops pages at every open keep a disk cache of its own? Timed, not guessed.

The probe (probe.py) tells trees that keep a file's pages across opens from trees that drop them. A
replay into the page cache of the second kind is thrown away when the program opens the file, so the
image stage used to skip it there. But several loaders that drop pages keep the bytes they fetched on
their own disk (rclone `--vfs-cache-mode full`, JuiceFS's cache dir, Nydus's blob cache, stargz over
fscache): a replay fills that cache, which is what the program then reads (issue 28: `import torch`
through rclone full, 7.35 s cold against 2.12 s on the same mount again).

What decides is whether a re-read through the mount is served without the network. For a few extents
of the record (`samples` in its ref: files other than the probe's, so the first read is cold) this
module times a read through a fresh open, then the same read again, each time through its own open
(the page cache is dropped at every open, so each is a request to the loader), up to `AGAIN_READS`
times and until one re-read shows a cache: a loader that keeps what it fetched answers the re-read
from its disk, in a fraction of the first read's time (measured through rclone: 0.3-0.5 ms against
4-27 ms for 64 KiB); one that keeps nothing fetches again (3-19 ms, 1.4-3x faster than the first read,
which also paid for the connection). The fastest re-read counts: on a busy node a re-read from
rclone's disk took 12.1 ms once (against 51.8 ms first) and 0.2-0.3 ms the next times, and a loader
that fetches again never answers faster than its network. Each sample votes; two agreeing votes
decide. A sample whose reads are all as fast as a local disk (under `FETCH_MIN_S`) votes for
nothing: the loader serves it from a cache already (a warm mount) or the network is as fast as one,
and either way a replay there gains nothing this start.

The decision is kept in the store next to the record (`refs/hot-loader/<image_key>.json`, per record
and per mount: mount point, filesystem type and source), as status.py keeps the never-slower verdict
(written by the agent: `take_pending`), so a start pays for the reads only once per record. "Keeps a
cache" stands until the record changes (if the replay then does not pay, the never-slower rule turns
it off); "keeps none" is judged again after `RECHECK_S`, since a remount with another cache mode looks
the same in the mount table.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import StoreError
from .probe import mount_of

if TYPE_CHECKING:
    from ..store.core import Store

KIND = "hot-loader"
SAMPLES = 3  # extents a record's ref names for the judgement
READ_BYTES = 64 << 10  # read of each sample: a few pages, one request to the loader
# Re-reads of a sample at most; they stop at the first that shows a cache, so a loader that keeps one
# is usually read twice per sample, and one that keeps none (a "no" stands for RECHECK_S, for every
# node using the store) only after this many chances to be fast.
AGAIN_READS = 4
KEEPS_RATIO = 6.0  # a re-read this many times faster than the first read was served locally...
KEEPS_GAIN_S = 0.001  # ...and saved at least this much
FETCH_RATIO = 4.0  # a re-read within this factor of the first read was fetched again...
FETCH_MIN_S = 0.002  # ...and took at least this long (a FUSE read from local disk takes well under it)
RECHECK_S = 6 * 3600.0  # a "keeps no cache" decision is judged again after this long

_DECIDED: dict[tuple[str, str], Judgement] = {}  # (mount, record) -> judgement, for this process
_PENDING: list[Judgement] = []  # timed here, decisive, not yet handed on to be kept (`take_pending`)


@dataclass(frozen=True)
class Judgement:
    """Whether the loader behind `mount` keeps what it fetched (`own_cache` None: could not tell)."""

    mount: str
    own_cache: bool | None
    first_ms: tuple[float, ...] = ()
    again_ms: tuple[float, ...] = ()
    cached: bool = False  # read from the store, not timed by this start

    def figures(self) -> str:
        pairs = ", ".join(f"{a:.1f} ms against {f:.1f} ms" for f, a in zip(self.first_ms, self.again_ms, strict=True))
        return f"re-read {pairs}" if pairs else "no sample to time"

    def line(self) -> str:
        """One line for the stage's output: what was decided and on which figures."""
        how = " (decided by an earlier start)" if self.cached else ""
        if self.own_cache:
            return f"its loader keeps a cache of its own ({self.figures()} for the first read){how}"
        if self.own_cache is False:
            return f"its loader keeps no cache of its own: a re-read is fetched again ({self.figures()}){how}"
        return f"cannot tell whether its loader keeps a cache of its own ({self.figures()})"


def pick_samples(extents: list[tuple[str, int, int]], avoid: str | None) -> list[tuple[str, int, int]]:
    """Up to `SAMPLES` (path, offset, length) of distinct files other than `avoid` (the probe's file,
    whose first page the probe reads), the longest extents first: what a new ref names for `judge`."""
    longest: dict[str, tuple[int, int]] = {}
    for path, off, n in extents:
        if path != avoid and n > longest.get(path, (0, 0))[1]:
            longest[path] = (off, n)
    ranked = sorted(longest.items(), key=lambda kv: (-kv[1][1], kv[0]))[:SAMPLES]
    return [(path, off, min(n, READ_BYTES)) for path, (off, n) in ranked]


def _timed_read(path: str, offset: int, length: int) -> float:
    """Seconds for an open, a read of `length` bytes at `offset`, and a close (OSError when it fails)."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        got = 0
        while got < length:
            k = len(os.pread(fd, length - got, offset + got))
            if k <= 0:
                break
            got += k
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _vote(first: float, again: float) -> bool | None:
    """True: the re-read was served by the loader's own cache; False: it was fetched again; None: no telling.

    A re-read counts as served locally only if it also took less than a request to the loader's
    network ever does (FETCH_MIN_S): a ratio alone judged s3fs, which keeps nothing, to keep a cache on
    a busy node, where its first read (a HEAD and a GET, 40 ms) came out 8 times its fastest re-read
    (one GET, 5 ms) (issue 46, under `.ci/run --under-load`)."""
    if first >= KEEPS_RATIO * again and first - again >= KEEPS_GAIN_S and again < FETCH_MIN_S:
        return True
    if again >= FETCH_MIN_S and first <= FETCH_RATIO * again:
        return False
    return None


def _fastest_again(path: str, offset: int, length: int, first: float) -> float:
    """The fastest of up to AGAIN_READS re-reads, stopping at the first that votes "keeps a cache"."""
    again = _timed_read(path, offset, length)
    for _ in range(AGAIN_READS - 1):
        if _vote(first, again) is True:
            break
        again = min(again, _timed_read(path, offset, length))
    return again


def judge(mount: str, samples: list[tuple[str, int, int]]) -> Judgement:
    """Time a first read and the re-reads of each sample until two votes agree (module doc)."""
    firsts: list[float] = []
    agains: list[float] = []
    votes: list[bool] = []
    for path, offset, length in samples[:SAMPLES]:
        try:
            first = _timed_read(path, offset, length)
            again = _fastest_again(path, offset, length, first)
        except OSError:
            continue
        firsts.append(first * 1e3)
        agains.append(again * 1e3)
        vote = _vote(first, again)
        if vote is not None:
            votes.append(vote)
        for side in (True, False):
            if votes.count(side) >= 2 or (votes.count(side) == 1 and len(samples) == 1):
                return Judgement(mount, side, tuple(firsts), tuple(agains))
    return Judgement(mount, None, tuple(firsts), tuple(agains))


def mount_key(path: str) -> str:
    """What names a mount across starts and nodes: its mount point, filesystem type and source."""
    point, fstype, source = mount_of(path)
    return f"{point} {fstype} {source}"


def _read_cached(store: Store, image_key: str, record: str, key: str) -> Judgement | None:
    try:
        doc = store.read_ref(KIND, image_key)
    except (StoreError, OSError):
        return None
    if not doc or doc.get("record") != record:
        return None
    entry = (doc.get("mounts") or {}).get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("own_cache"), bool):
        return None
    if not entry["own_cache"] and time.time() - float(entry.get("at", 0.0)) > RECHECK_S:
        return None
    first = tuple(float(x) for x in entry.get("first_ms", []))
    again = tuple(float(x) for x in entry.get("again_ms", []))
    if len(first) != len(again):
        first = again = ()
    return Judgement(key, entry["own_cache"], first, again, cached=True)


def take_pending() -> list[dict[str, object]]:
    """The decisive judgements this process timed and has not handed on, as documents for `remember`.

    The stage hands them to the agent (the "hot-judge" task), which writes them after the start: a ref
    write imports pyarrow.fs (0.3-0.75 s), which a start that skips replay must not pay."""
    out: list[dict[str, object]] = [
        {
            "mount": j.mount,
            "own_cache": j.own_cache,
            "first_ms": [round(x, 3) for x in j.first_ms],
            "again_ms": [round(x, 3) for x in j.again_ms],
            "at": time.time(),
        }
        for j in _PENDING
    ]
    _PENDING.clear()
    return out


def remember(store: Store, image_key: str, record: str, judged: list[dict[str, object]]) -> None:
    """Keep decisive judgements (from `take_pending`) for the next starts; a store that cannot be written
    costs the next start a judgement, nothing else."""
    if not judged or not record:
        return
    try:
        doc = store.read_ref(KIND, image_key)
        mounts = dict(doc.get("mounts") or {}) if doc and doc.get("record") == record else {}
        for entry in judged:
            mounts[str(entry["mount"])] = {k: v for k, v in entry.items() if k != "mount"}
        store.write_ref(KIND, image_key, {"record": record, "mounts": mounts})
    except (StoreError, OSError):
        pass


def decide(store: Store, image_key: str, record: str, root: str, samples: list[tuple[str, int, int]]) -> Judgement:
    """Whether the loader under `root` keeps a cache of its own, for this record: from this process's
    answer, else the store's, else timed now with the samples under `root` (decisive answers are kept:
    see `take_pending`)."""
    key = mount_key(root)
    done = _DECIDED.get((key, record))
    if done is not None:
        return done
    found = _read_cached(store, image_key, record, key) if record else None
    if found is None:
        prefix = os.path.realpath(root).rstrip("/") + "/"
        mine = [s for s in samples if os.path.realpath(s[0]).startswith(prefix) or s[0] == root]
        found = judge(key, mine)
        if found.own_cache is not None and record:
            _PENDING.append(found)
    _DECIDED[(key, record)] = found
    return found


def known_to_keep(store: Store, image_key: str, record: str, roots: list[str]) -> Judgement | None:
    """The judgement (this process's or the store's) that the loader under every one of `roots` keeps a
    cache of its own for this record, or None where any is not known so: then the stage probes.

    Such a start replays whatever the probe would say (a tree that keeps pages is replayed into anyway),
    so it skips the probe: on a cold mount the probe's open, read, reopen and mincore are requests made
    one after another before anything else starts (issue 28: 0.4-0.8 s of a 2.5 s stage on rclone)."""
    if not record or not roots:
        return None
    found: list[Judgement] = []
    for root in roots:
        key = mount_key(root)
        judged = _DECIDED.get((key, record)) or _read_cached(store, image_key, record, key)
        if judged is not None:  # kept for `decide`: the store is read once
            _DECIDED[(key, record)] = judged
        if judged is None or not judged.own_cache:
            return None
        found.append(judged)
    return found[0]


def forget() -> None:
    """Drop this process's answers (tests remount loaders)."""
    _DECIDED.clear()
    _PENDING.clear()
