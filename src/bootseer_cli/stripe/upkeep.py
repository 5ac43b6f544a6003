"""The checkpoint capability's upkeep hooks (capability table): which checkpoints `bootseer gc` keeps,
what `bootseer prefetch` fetches, and whether FUSE works here (`bootseer doctor`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import TYPE_CHECKING

from ..errors import BootseerError, IntegrityError, StoreError
from ..upkeep import Check, Doomed, Item, Kept, Policy, Scan, fetch_into_cache

if TYPE_CHECKING:
    from ..keys import Keys
    from ..settings import Settings
    from ..store.cache import BlobCache
    from ..store.core import Store


def gc_keep(store: Store, policy: Policy, scan: Scan) -> None:
    """Tags beyond the newest keep_tags go (the tag `latest.json` names is always kept); their stripes go
    into `scan.gone_stripes`, for gc to delete where no kept manifest names them."""
    from .catalog import list_names, public_uri
    from .layout import MANIFEST, Manifest, ckpt_prefix, latest_rel

    main = {"", public_uri(store.uri)}
    for name in list_names(store):
        hint: dict[str, object] = {}
        with contextlib.suppress(ValueError, StoreError):
            hint = json.loads(store.get_bytes(latest_rel(name)) or b"{}")
        manifests = []
        for tag in store.list_dirs(ckpt_prefix(name)):
            rel = f"{ckpt_prefix(name)}/{tag}/{MANIFEST}"
            with contextlib.suppress(IntegrityError, StoreError):
                data = store.get_bytes(rel)
                if data is not None:
                    manifests.append((Manifest.from_json(data), rel, len(data)))
        manifests.sort(key=lambda m: (m[0].created, m[0].tag))
        for i, (m, rel, size) in enumerate(manifests):
            if i >= len(manifests) - policy.keep_tags or m.tag == hint.get("tag"):
                newest = i >= len(manifests) - policy.keep_tags
                why = f"one of the newest {policy.keep_tags} tags" if newest else "the tag latest names"
                scan.kept_refs.append(Kept("ckpt", f"{name}:{m.tag}", why, m.created))
                for s in m.stripes:
                    if s.target in main:
                        scan.live.add(s.digest)
                    else:
                        scan.live_stripes.add((s.target, s.digest))
                continue
            scan.doomed.append(Doomed("ckpt", f"{name}:{m.tag}", size, (rel,), last_used=m.created))
            scan.gone_stripes += [("" if s.target in main else s.target, s.digest, s.size) for s in m.stripes]


def prefetch(settings: Settings, store: Store, cache: BlobCache, keys: Keys) -> list[Item]:
    """The stripes of `[checkpoint] name`, only where the start will read them from the node cache.

    Only a pull with `[p2p] enabled` does (whole stripes through `delivery.fetch_blob`, stage.py); a
    mounted checkpoint is read from the store by the FUSE server, and a pull without the swarm through
    the same read engine (reader.py), never from the node cache: prefetching for them would fill the
    cache (and evict the env snapshot) with bytes nobody reads. Mount mode pulls where this node
    cannot mount (stripe/stage.py), so that case counts as a pull.
    """
    ck = settings.checkpoint
    if not ck.name:
        return []
    pulls = ck.mode == "pull"
    if not pulls:
        from .overlay import overlay_missing
        from .stage import fuse_missing

        pulls = bool(fuse_missing() or overlay_missing())
    if not (pulls and settings.p2p.enabled):
        how = "a pull without [p2p] enabled" if pulls else 'mode = "mount"'
        detail = f"{how} reads the stripes from the store, not the node cache"
        return [Item("checkpoint", f"{ck.name}:{ck.tag}", status="skipped", detail=detail)]
    return [_prefetch_checkpoint(settings, store, cache, ck.name)]


def _prefetch_checkpoint(settings: Settings, store: Store, cache: BlobCache, name: str) -> Item:
    """Every stripe of checkpoint NAME at `[checkpoint] tag`, each from the target store it was written to."""
    from .catalog import Targets, load_manifest

    tag = settings.checkpoint.tag
    item = Item("checkpoint", f"{name}:{tag}")
    try:
        m = load_manifest(store, name, tag)
        targets = Targets(store, list(settings.checkpoint.targets))
        for ref in m.stripes:
            fetch_into_cache(settings.p2p, targets.get(ref.target), cache, [ref.digest], item)
        item.key = f"{name}:{m.tag}"
    except (BootseerError, OSError) as e:
        item.status, item.detail = ("absent" if "not found" in str(e) or "no tags" in str(e) else "failed"), str(e)
    return item


def doctor(settings: Settings) -> list[Check]:
    """Can checkpoints be mounted here (FUSE), or only pulled?"""
    return [_check_fuse()]


def _check_fuse() -> Check:
    if not os.path.exists("/dev/fuse"):
        return Check(
            "fuse",
            "warn",
            "/dev/fuse is missing: checkpoints can be pulled, not mounted",
            "load the fuse module, or give the container --device /dev/fuse --cap-add SYS_ADMIN",
        )
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return Check(
            "fuse", "warn", "/dev/fuse is not readable and writable by this user", "add the user to group fuse"
        )
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return Check(
            "fuse", "warn", "fusermount3 is not installed (needed to unmount as non-root)", "apt-get install fuse3"
        )
    try:
        import ctypes.util

        if ctypes.util.find_library("fuse3") is None and ctypes.util.find_library("fuse") is None:
            return Check("fuse", "warn", "libfuse is not installed", "apt-get install fuse3")
    except OSError:  # find_library runs ldconfig/gcc; a machine without them is not a FUSE failure
        pass
    from .overlay import overlay_missing

    missing = overlay_missing()  # the writable checkpoint directory is an overlay over the mount
    if missing:
        why = f"{missing}: the checkpoint directory is pulled, not mounted"
        return Check("fuse", "warn", why, "apt-get install fuse-overlayfs")
    view = "kernel overlayfs" if os.geteuid() == 0 else "fuse-overlayfs"
    return Check("fuse", "ok", f"/dev/fuse and libfuse are usable; the writable checkpoint view uses {view}")
