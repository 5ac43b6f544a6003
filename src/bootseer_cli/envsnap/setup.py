"""The tree a setup writes into, and running the setup on it.

- `excluded_paths`: bootseer's own state inside the roots (`EnvSettings.resolve_roots` names the
  roots), which must never be part of a snapshot;
- `take_baseline`: stamp → strip → baseline, the sequence before `exec`'s setup (on the lease
  holder, or without a store); `bootseer baseline` before a setup run by hand only records (it never
  removes anything: the user runs the setup, and decides what the tree holds);
- `run_setup`: the `[env] setup` commands, in the interpreter's environment; `fresh_setup` is
  both, timed; `guarded_setup` runs it with the previous env set aside (aside.py), so a failed setup
  leaves the env the tree carried, and its stamp, as they were.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StageFatal
from ..settings import EnvSettings, StoreSettings
from .manifest import Manifest, scan
from .stamp import remove_stamp, strip_carried

if TYPE_CHECKING:
    from .aside import Previous
    from .setupwrites import SetupWrites, Written
    from .tree import EnvTree


def excluded_paths(store: StoreSettings) -> list[str]:
    """bootseer's own state (cache, local store), which must never end up in a snapshot."""
    from ..paths import cache_root

    out = [str(cache_root())]
    if store.cache_dir:
        out.append(str(store.cache_dir))
    uri = store.uri or ""
    if uri.startswith("file://"):
        from urllib.parse import urlparse

        out.append(urlparse(uri).path)
    elif uri and "://" not in uri:
        out.append(os.path.abspath(os.path.expanduser(uri)))
    return [os.path.normpath(p) for p in out]


def baseline_path(roots: list[str]) -> Path:
    """Where `bootseer baseline` keeps the manifest of `roots` for a later `bootseer snapshot`."""
    from ..paths import cache_root

    tag = hashlib.sha256("\n".join(roots).encode()).hexdigest()[:16]
    return cache_root() / "env-baseline" / f"{tag}.manifest"


def take_baseline(tree: EnvTree, store: StoreSettings, info: Callable[[str], None], strip: bool = True) -> Manifest:
    """Before a setup: drop the stamp (the tree is about to change), remove what a previously carried
    env added and nobody changed since (so the baseline is the image again; only with `strip`: `exec`
    runs the setup itself and knows the tree is to hold one env), and scan the tree."""
    remove_stamp(tree)
    if strip:
        strip_carried(tree, info)
    return scan(tree.roots, excluded_paths(store))


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


def run_setup(env: EnvSettings, info: Callable[[str], None], writes: SetupWrites | None = None) -> None:
    """Run each `[env] setup` command through the shell in the config file's directory.

    Output goes to our stderr (stdout belongs to the launcher). A failing command stops here with
    its exit status, which `bootseer exec` passes on. With `writes`, each command runs in a mount
    namespace of its own whose writes that group sees (setupwrites.py).
    """

    environ = setup_environ()
    for cmd in env.setup:
        info(f"env setup: {cmd}")
        sys.stderr.flush()
        argv, fds = writes.argv(cmd) if writes is not None else ([cmd], ())
        try:
            rc = subprocess.run(
                argv if writes is not None else cmd,
                shell=writes is None,
                cwd=env.base_dir,
                stdout=sys.stderr.fileno(),
                check=False,
                env=environ,
                pass_fds=fds,
            ).returncode
        finally:
            if writes is not None:
                writes.command_ended(fds)
        if rc != 0:
            code = 128 - rc if rc < 0 else rc
            raise StageFatal(f"[env] setup command failed (exit {code}): {cmd}", code)


@dataclass
class SetupRun:
    baseline: Manifest
    started: float  # wall clock, when the setup began (files changed after it are the setup's)
    seconds: float
    writes: Written | None = None  # what its processes wrote (setupwrites.py); None: unknown


def fresh_setup(
    env: EnvSettings,
    store: StoreSettings,
    tree: EnvTree,
    info: Callable[[str], None],
    on_start: Callable[[], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> SetupRun:
    """stamp and carried env set aside → baseline → setup. `on_start` is told once the setup itself begins."""
    from .aside import set_aside

    prev = set_aside(tree, info, strip=True)
    return guarded_setup(env, store, prev, info, warn or info, on_start)


def guarded_setup(
    env: EnvSettings,
    store: StoreSettings,
    prev: Previous,
    info: Callable[[str], None],
    warn: Callable[[str], None],
    on_start: Callable[[], None] | None = None,
) -> SetupRun:
    """Baseline → setup of `prev.tree`, the previous env (`prev`) set aside: dropped once the setup
    succeeded, put back (with its stamp, if the setup changed nothing) when it fails or is interrupted."""
    from .setupwrites import SetupWrites

    baseline: Manifest | None = None
    tracked = SetupWrites.start()
    try:
        baseline = scan(prev.tree.roots, excluded_paths(store))
        t0 = time.time()
        if on_start is not None:
            on_start()
        run_setup(env, info, tracked)
    except BaseException:
        if tracked is not None:
            with contextlib.suppress(OSError):  # only closed: the setup's own error is the one raised
                tracked.result()
        try:
            prev.failed(baseline, excluded_paths(store), info, warn)
        except Exception as e:  # the setup's own error is the one to report; the journal puts back the rest
            warn(f"env: the previous env could not be put back after the failed setup: {e}")
        raise
    seconds = time.time() - t0
    prev.done()
    return SetupRun(baseline, t0, seconds, tracked.result() if tracked is not None else None)
