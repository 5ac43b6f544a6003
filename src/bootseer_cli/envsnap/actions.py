"""What the env-snapshot verbs do here, by hand (outside `bootseer exec`): baseline, snapshot, restore, show.

For setups run outside `bootseer exec`: `bootseer restore || (setup && bootseer snapshot)`, with
`bootseer baseline` run before the setup so the snapshot holds only what it changed. The stage
(stage.py) does the same work inside `exec`; these are the one-shot forms, which take the settings
from the command layer (commands/env.py, commands/restore.py) and return facts for it to print.

`restore_here` is on the fast path of every start (`bootseer restore` runs without typer, see
entry.py): everything beyond the stdlib is imported inside the functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..keys import Keys
    from ..settings import Settings
    from ..store.core import Store
    from .format import ArchiveEntry
    from .restore import Restored

Say = Callable[[str], None]


@dataclass(frozen=True)
class BaselineTaken:
    """A baseline recorded: how many entries, under which roots."""

    entries: int
    roots: tuple[str, ...]
    carried: str = ""  # the env bootseer put in the tree before ("" when none): a snapshot will refuse
    unstamped: bool = False  # the tree's stamp was removed: it is about to change (see `baseline_here`)


@dataclass(frozen=True)
class Published:
    """A snapshot captured and published for `env_key`; `seconds` covers the capture and the upload."""

    env_key: str
    digest: str
    size: int
    files: int
    deletions: int
    seconds: float


@dataclass(frozen=True)
class RestoreHere:
    """The outcome of a restore here: the env was `present` already, or `restored` (None: the store
    has no snapshot for `env_key`)."""

    env_key: str
    present: bool
    restored: Restored | None


@dataclass(frozen=True)
class SnapshotEntries:
    """What a snapshot's blob lists: its entries and the paths it deletes."""

    entries: tuple[ArchiveEntry, ...]
    deletions: tuple[str, ...]


def baseline_here(settings: Settings, say: Say, warn: Say) -> BaselineTaken:
    """Record the state of the env roots before a setup, under the env key as of now.

    The key is the one from before the setup: a setup into the base prefix changes the image
    fingerprint, and fresh nodes (which compute the key before their setup) must find the snapshot
    under this one. An interrupted restore of the tree is put back first, so it is not recorded.

    No package is removed: the packages in the tree are the user's (even those bootseer restored, once
    the user works in the tree by hand). When the tree carries an env bootseer restored or set up,
    the baseline says so, and `snapshot_here` refuses to publish what would be only an increment.

    The tree's stamp is removed, and the caller says so: the stamp vouches only for the files the env
    wrote, so a package installed by hand after the baseline would go unseen by a start that trusts
    it, and run as if it were the env. `snapshot_here` stamps the tree again."""
    from ..identity import keys_for
    from . import manifest
    from .setup import baseline_path, take_baseline
    from .stamp import carried_note, has_stamp
    from .tree import EnvTree

    roots = settings.env.resolve_roots()
    tree = EnvTree(roots)
    key = keys_for(settings).env.digest
    with tree.locked(say, warn):
        carried = carried_note(tree)
        stamped = has_stamp(tree)
        m = take_baseline(tree, settings.store, say, strip=False)
    manifest.save(m, baseline_path(roots), roots, {"env_key": key, "carried": carried})
    return BaselineTaken(len(m), tuple(roots), carried, stamped)


def snapshot_here(settings: Settings, warn: Say) -> Published:
    """Capture what changed under the env roots since the baseline, publish it, stamp the tree.

    The snapshot goes under the key the baseline recorded (see `baseline_here`); the stamp carries
    that key and the key as of now, so a restart of this node matches either. BootseerError when no
    baseline was taken, and when the baseline was taken on a tree that carried an env of bootseer's:
    the capture would then hold only what the setup added to that env, while the key promises the
    whole setup, and every node restoring it would get a broken env."""
    from ..identity import keys_for
    from ..store.cache import cache_for
    from ..store.core import open_store_for
    from . import manifest
    from .capture import capture
    from .publish import publish
    from .setup import baseline_path
    from .stamp import write_stamp
    from .tree import EnvTree

    roots = settings.env.resolve_roots()
    path = baseline_path(roots)
    if not path.exists():
        raise BootseerError(f"no baseline for {', '.join(roots)}: run `bootseer baseline` before the setup")
    base, _, extra = manifest.load(path)
    if extra.get("carried"):
        raise BootseerError(
            f"not published: the baseline was taken on a tree that already carried {extra['carried']}, so the "
            "snapshot would hold only what the setup added to it; run the setup in a fresh venv of the image "
            "(`bootseer baseline` there first), or let `bootseer exec` run it"
        )
    keys_now = keys_for(settings)
    now = keys_now.env.digest
    key = str(extra.get("env_key") or now)
    st = open_store_for(settings)
    cache = cache_for(settings.store)
    t0 = time.monotonic()
    cap = capture(settings.store, roots, base, key, cache, warn, since=path.stat().st_mtime)
    extra = _parent_fields(settings, keys_now, roots)
    if settings.env.mode == "mount":  # the squashfs image too (envmount/image.py), as `exec` publishes it
        from ..envmount.image import image_for_publish
        from .setup import excluded_paths

        whole = cap.blob if cap.whole else None
        extra.update(image_for_publish(roots, excluded_paths(settings.store), cache, warn, whole))
    publish(settings.p2p, st, cache, cap, key, roots, extra=extra)
    write_stamp(EnvTree(roots), [key, now], cap.digest, cap.entries, cap.deletion_paths)
    return Published(key, cap.digest, cap.size, cap.files, cap.deletions, time.monotonic() - t0)


def _parent_fields(settings: Settings, keys: Keys, roots: list[str]) -> dict[str, Any]:
    """What lets a later build set up over this snapshot (layers.py): image, machine, setup inputs."""
    from .layers import ref_fields

    try:
        return ref_fields(settings, keys, roots, None)
    except (OSError, ValueError):  # the inputs could not be read: a snapshot no build layers over
        return {}


def restore_here(settings: Settings, say: Say, warn: Say) -> RestoreHere:
    """Restore the snapshot of the current env key under the roots, unless the tree already carries it.

    Under the tree lock, after an interrupted restore was put back; a stale stamp is only a warning
    (the restore replaces it). Raises what `restore.restore` raises when the snapshot is unusable."""
    from ..identity import keys_for
    from ..store.cache import cache_for
    from ..store.core import open_store_for
    from .restore import restore
    from .stamp import stamp_state
    from .tree import EnvTree

    roots = settings.env.resolve_roots()
    tree = EnvTree(roots)
    key = keys_for(settings).env.digest
    with tree.locked(say, warn):
        ok, why = stamp_state(tree, key)
        if ok:
            return RestoreHere(key, present=True, restored=None)
        if why.startswith("stale"):
            warn(why)
        r = restore(settings.p2p, open_store_for(settings), cache_for(settings.store), key, tree)
    return RestoreHere(key, present=False, restored=r)


def snapshot_entries(settings: Settings, store: Store, ref: dict[str, Any]) -> SnapshotEntries:
    """The entries and deletions the blob of `ref` lists (fetches the blob, its digest checked)."""
    from pathlib import Path

    from ..delivery import fetch_verified
    from ..store.cache import cache_for
    from .reader import read_meta
    from .restore import entries_hint

    fetched = fetch_verified(settings.p2p, store, cache_for(settings.store), ref["blob"], ref.get("size"))
    meta = read_meta(Path(fetched.path), entries_hint(ref))
    return SnapshotEntries(meta.entries, meta.deletions)
