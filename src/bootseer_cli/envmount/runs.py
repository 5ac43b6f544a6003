"""One run's env mounts: its directory in the node cache, its teardown, and the sweep of dead runs.

`<cache root>/env-mount/<run id>/` (0700, local disk, this user's) holds `upper/<i>` and `work/<i>`
(root i's overlay: what the job wrote into its env, a `.pyc`, a late `pip install`; scratch, removed
with the run, never written into the image) and `state.json`: the owner (the launcher's pid and start
time: a reused pid is not mistaken for it) and each mount made, in order, with its device number. The
images' lowers it stacks on are the node's (lowers.py), recorded as `shared`: its teardown leaves them
(their decompressed pages serve the next start), and the sweep takes them down once idle.

The state is written before each mount is made and after, so a run killed at any point leaves a
record the next start can undo: `sweep` takes down the mounts of runs whose owner is gone (each only
if the device at its path is still the recorded one), newest first, and removes their directories
once nothing is mounted there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BootseerError

STATE = "state.json"
SWEEP_LIMIT = 32  # run directories looked at per start


def mount_root() -> Path:
    from ..paths import cache_root

    return cache_root() / "env-mount"


@dataclass
class RunMounts:
    """A run's mount directory and what is mounted for it (`mounts`: [{"path", "dev"}], in mount order)."""

    root: Path
    owner: str
    mounts: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def create(cls, run: str, pid: int) -> RunMounts:
        from ..paths import make_private_dir
        from ..stripe.rundirs import owner_stamp

        make_private_dir(mount_root())
        rm = cls(make_private_dir(mount_root() / run), owner_stamp(pid))
        rm.save()
        return rm

    @classmethod
    def load(cls, root: Path) -> RunMounts:
        doc = json.loads((root / STATE).read_text())
        mounts = [{k: str(m[k]) for k in ("path", "dev", "shared") if k in m} for m in doc.get("mounts", [])]
        return cls(root, str(doc.get("owner", "")), mounts)

    def shared(self) -> list[str]:
        """The shared lowers (lowers.py) this run stacks on: it never unmounts them."""
        return [m["path"] for m in self.mounts if m.get("shared")]

    def save(self) -> None:
        """state.json replaced whole (a new private file, then rename): never half written."""
        tmp = self.root / f".{STATE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"owner": self.owner, "mounts": self.mounts}, f)
        os.replace(tmp, self.root / STATE)

    def dir(self, *parts: str) -> str:
        p = self.root.joinpath(*parts)
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        return str(p)

    def add(self, path: str, dev: str) -> None:
        self.mounts.append({"path": path, "dev": dev})
        self.save()

    def owner_alive(self) -> bool:
        from ..stripe.rundirs import _start_time

        pid_s, _, start = self.owner.partition(" ")
        try:
            return bool(start) and _start_time(int(pid_s)) == start
        except ValueError:
            return False

    def _private_dev(self, path: str) -> str:
        """The device at a path of this run's own directory (a mount recorded before it was made): only
        this run ever mounts there."""
        from .mounts import mount_info

        info = mount_info(path) if path.startswith(str(self.root) + "/") else None
        return info["dev"] if info else ""

    def teardown(self, log: Callable[[str], None] | None = None) -> bool:
        """Unmount everything of this run (overlays, then the lower) and remove its directory; False
        when a mount would not go (the directory then stays, for the next start)."""
        from .mounts import mount_info, umount

        left: list[dict[str, str]] = []
        for m in reversed(self.mounts):
            if m.get("shared"):
                continue  # a node's image lower (lowers.py): it outlives the run, the sweep takes it down
            dev = m["dev"] or self._private_dev(m["path"])
            if left and m["path"].startswith(str(self.root) + "/"):
                left.append(m)  # the lower stays while an overlay of ours still stands on it
                continue
            try:
                done = bool(dev) and umount(m["path"], dev)
                if log:
                    log(f"env: unmounted {m['path']}" if done else f"env: {m['path']} no longer mounted (dev {dev})")
            except BootseerError as e:
                left.append(m)
                if log:
                    log(f"env: {e}")
        self.mounts = list(reversed(left))
        if left or mount_info(str(self.root / "lower")) is not None or _mounted_below(str(self.root)):
            self.save()
            return False
        shutil.rmtree(self.root, ignore_errors=True)
        return True


def _mounted_below(prefix: str) -> bool:
    """Whether anything is mounted below `prefix` (never remove a directory a mount still covers)."""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        return any(line.split()[4].startswith(prefix + "/") for line in f)
    return True


def live_mount(path: str, dev: str) -> bool:
    """Whether `path` with device `dev` is a mount a live run recorded (another job's env on this root)."""
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(mount_root()))[:SWEEP_LIMIT]:
            try:
                rm = RunMounts.load(mount_root() / name)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if {"path": path, "dev": dev} in rm.mounts and rm.owner_alive():
                return True
    return False


def sweep(keep: str, log: Callable[[str], None] | None = None, lowers: Sequence[str] = ()) -> int:
    """Take down the mounts of ended runs (not `keep`, this run) and remove their directories, then the
    shared image lowers no live run stacks on and no start used lately (lowers.py; `lowers`: the ones
    this start is about to use); returns how many runs were cleaned. A run whose owner is alive is left
    alone."""
    from .lowers import sweep_lowers

    in_use = set(lowers)
    cleaned = _sweep_runs(keep, in_use, log)
    with contextlib.suppress(OSError):
        sweep_lowers(in_use, log=log)
    return cleaned


def _sweep_runs(keep: str, in_use: set[str], log: Callable[[str], None] | None) -> int:
    """`sweep`'s runs; the shared lowers live runs stack on are added to `in_use`."""
    base = mount_root()
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return 0
    cleaned = 0
    for name in names[:SWEEP_LIMIT]:
        root = base / name
        if name == keep or not root.is_dir() or root.is_symlink():
            continue
        try:
            rm = RunMounts.load(root)
        except (OSError, ValueError, KeyError, TypeError):
            rm = None
        if rm is None:
            continue  # no record (a start that died before its first write): nothing mounted by it
        if rm.owner_alive():
            in_use.update(rm.shared())
            continue
        with contextlib.suppress(OSError):
            cleaned += rm.teardown(log)
    return cleaned
