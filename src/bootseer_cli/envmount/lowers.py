"""Image mounts a node's runs share: an image's read-only lower stays mounted after the run that used it.

Why: the kernel keeps a squashfs file's decompressed pages with that mount's inodes. A run that unmounted
its image dropped them, so the next start on the node (a restart) decompressed every page it imported
again: a warm restart measured 1.45x the extracted tree's (2.37 s against 1.63 s until `import torch`,
CPU torch, 2 cores). So an image is mounted once per node cache, at `<cache>/env-images/<digest>`
(0700, this user's), and every run's overlay stacks on it (runs.py records it as shared: its teardown
leaves it). The overlay, the upper directory (what the job wrote) and the run's directory stay per run.

A start mounts under a `flock` of the directory (two starts of one node mount an image once) and reuses
a lower only when the device there is the one it recorded and it answers (a FUSE server that died with
its job leaves a mount that does not: it is taken down and mounted again). The next start's `sweep`
takes down the shared lowers that no live run stacks on and that no start used for `IDLE_S`; `bootseer
cache prune` leaves them (a mounted image's file stays open, so evicting it frees its space only then).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import BootseerError

IDLE_S = 3600.0  # a lower no start used for an hour goes at the next start's sweep
LOCK = ".lock"


def lowers_root() -> Path:
    """`<cache root>/env-images`, beside the runs' `env-mount` (runs.py)."""
    from ..paths import cache_root

    return cache_root() / "env-images"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """The node's lowers to ourselves, waited for at most `LOCK_WAIT_S` (a holder mounts: two mount
    commands' deadlines); BootseerError past it, so the start extracts instead of hanging."""
    from .mounts import MOUNT_TIMEOUT_S

    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + 2 * MOUNT_TIMEOUT_S + 5
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise BootseerError(f"{root} stayed locked by another start") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _record(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _save(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.json")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path.with_suffix(".json"))


def _answers(path: Path) -> bool:
    try:
        os.listdir(path)
        return True
    except OSError:  # ENOTCONN: a FUSE mount whose server is gone
        return False


def shared_lower(image: str, digest: str) -> tuple[str, str, str]:
    """(mount point, device, "kernel" | "fuse") of `image` mounted at its shared lower, mounting it there
    when it is not (raises with every reason, as `mounts.mount_lower`)."""
    from ..paths import make_private_dir
    from .mounts import mount_info, mount_lower, umount

    root = make_private_dir(lowers_root())
    path = root / digest
    with _locked(root):
        rec, info = _record(path), mount_info(str(path))
        if info is not None and rec.get("dev") == info["dev"] and _answers(path):
            _save(path, {**rec, "used": time.time()})
            return str(path), info["dev"], str(rec.get("how", ""))
        if info is not None:  # not the one recorded, or dead: taken down before ours goes there
            with contextlib.suppress(BootseerError):
                umount(str(path), info["dev"])
        path.mkdir(mode=0o700, exist_ok=True)
        dev, how = mount_lower(image, str(path))
        _save(path, {"dev": dev, "how": how, "used": time.time()})
        return str(path), dev, how


def sweep_lowers(in_use: set[str], idle_s: float = IDLE_S, log: Callable[[str], None] | None = None) -> int:
    """Take down the shared lowers that no live run stacks on (`in_use`: their mount points) and no start
    used for `idle_s`; returns how many went."""
    from .mounts import mount_info, umount

    root = lowers_root()
    try:
        names = sorted(n for n in os.listdir(root) if not n.startswith(".") and not n.endswith(".json"))
    except OSError:
        return 0
    gone = 0
    with contextlib.suppress(BootseerError), _locked(root):  # another start holds it: its sweep is as good
        for name in names:
            path = root / name
            rec = _record(path)
            used = rec.get("used")
            if str(path) in in_use or (isinstance(used, float) and time.time() - used < idle_s):
                continue
            info = mount_info(str(path))
            try:
                if info is not None:
                    umount(str(path), info["dev"])
            except BootseerError as e:
                if log:
                    log(f"env: {e}")
                continue
            shutil.rmtree(path, ignore_errors=True)
            path.with_suffix(".json").unlink(missing_ok=True)
            gone += 1
            if log:
                log(f"env: unmounted the idle image {name[:12]}")
    return gone
