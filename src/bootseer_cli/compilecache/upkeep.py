"""The compile capability's upkeep hooks (capability table): which compile caches `bootseer gc` keeps,
and `bootseer doctor`'s check of the job's interpreter."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..upkeep import Check, Doomed, Kept, Policy, Scan, is_digest, number, within

if TYPE_CHECKING:
    from ..settings import Settings
    from ..store.core import Store
    from ..store.fs import StoredFile


def doctor(settings: Settings, command: Sequence[str] = ()) -> list[Check]:
    """Which interpreter the compile key reads torch from (the launcher's, after `--`), and what it holds."""
    if not settings.compile.enabled:
        return []
    from .jobpython import for_command

    job = for_command(settings, command)
    if job.torch is not None:
        triton = f", triton {job.triton}" if job.triton else ""
        return [Check("compile", "ok", f"torch {job.torch}{triton} in {job.where()}")]
    if job.python is None or job.problem:
        fix = "set [compile] python (BOOTSEER_COMPILE_PYTHON) to the job's interpreter"
    elif not command:
        fix = "pass the launcher: bootseer doctor -- LAUNCHER …"
    else:
        fix = "install torch in the job's env, or set [compile] python to the interpreter that has it"
    return [Check("compile", "warn", f"no compile key: {job.why_none()}", fix)]


def gc_keep(store: Store, policy: Policy, scan: Scan) -> None:
    """A compile key goes whole when none of its entries was used within keep_days."""
    shards: dict[str, list[StoredFile]] = {}
    for f in store.list_info("refs/compile"):
        parts = f.rel.split("/")
        if len(parts) == 4 and parts[3].endswith(".json"):
            shards.setdefault(parts[2], []).append(f)
    for key, files in sorted(shards.items()):
        last = max(f.mtime for f in files)
        digests: set[str] = set()
        for f in files:
            with contextlib.suppress(ValueError, StoreError):
                doc = json.loads(store.get_bytes(f.rel) or b"{}")
                entries = doc.get("entries") if isinstance(doc, dict) else None
                for e in (entries or {}).values() if isinstance(entries, dict) else ():
                    if isinstance(e, dict) and is_digest(e.get("digest")):
                        digests.add(e["digest"])
                        last = max(last, number(e.get("used")))
        if last >= policy.cutoff:
            scan.live.update(digests)
            scan.kept_refs.append(Kept("compile", key, within(policy), last))
        else:
            size = sum(f.size for f in files)
            scan.doomed.append(Doomed("compile", key, size, tuple(f.rel for f in files), last_used=last))
