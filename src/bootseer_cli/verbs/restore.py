"""`bootseer restore`, kept free of typer: the entry point runs it without the CLI framework's import cost.

`bootseer restore || (setup && bootseer snapshot)` runs in front of every start, so this verb is on
the fast path (see entry.py); `commands/env.py` registers the same function as a typer command.
The work is `envsnap.actions.restore_here`; this module maps its facts to lines and an exit code.
Whatever fails, it says so in one line and exits non-zero (never a traceback): the caller's `||`
then runs the setup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..config import Config

EXIT_MISS = 3


def restore_verb(cfg: Config, out: Callable[[str], None], err: Callable[[str], None], as_json: bool = False) -> int:
    """`bootseer restore`: 0 when the env is present or restored, 3 when the store has no snapshot, 1
    (or the error's own code) when anything else fails. `as_json`: the outcome as one JSON document on
    stdout (also for a miss); errors stay one line on stderr."""
    from ..trust import starting_a_job

    starting_a_job()
    try:
        return _restore(cfg, out, err, as_json)
    except BootseerError as e:
        err(f"bootseer: error: {e}")
        return e.exit_code
    except Exception as e:  # one line, never a traceback: the caller runs the setup instead
        err(f"bootseer: error: restore failed: {type(e).__name__}: {e}"[:500])
        return 1


def _restore(cfg: Config, out: Callable[[str], None], err: Callable[[str], None], as_json: bool) -> int:
    from ..envsnap.actions import restore_here
    from ..redact import warn
    from ..settings import Settings
    from ..units import count, fmt_bytes

    done = restore_here(Settings.from_config(cfg), lambda m: err(f"bootseer: {m}"), warn)
    key, r = done.env_key, done.restored
    if as_json:
        import json

        doc: dict[str, object] = {"env_key": key, "outcome": "present" if done.present else "miss"}
        if r is not None and not done.present:
            doc |= {"outcome": "restored", "blob": r.digest, "files": r.files, "unpacked_bytes": r.raw_bytes}
            doc |= {"source": r.source, "bytes_from_store": r.bytes_from_store, "bytes_from_peers": r.bytes_from_peers}
            doc |= {"seconds_fetch": round(r.seconds_fetch, 3), "seconds_extract": round(r.seconds_extract, 3)}
        out(json.dumps(doc, indent=2))
        return EXIT_MISS if doc["outcome"] == "miss" else 0
    if done.present:
        out(f"env {key[:16]} already present")
        return 0
    if r is None:
        err(f"no snapshot for env {key[:16]}")
        return EXIT_MISS
    out(
        f"restored env {key[:16]}: {count(r.files, 'file')} ({fmt_bytes(r.raw_bytes)} unpacked) from {r.source} "
        f"in {r.seconds_fetch + r.seconds_extract:.2f} s (fetch {r.seconds_fetch:.2f} s, "
        f"extract {r.seconds_extract:.2f} s)"
    )
    return 0
