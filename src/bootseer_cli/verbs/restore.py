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


def restore_verb(cfg: Config, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """`bootseer restore`: 0 when the env is present or restored, 3 when the store has no snapshot, 1
    (or the error's own code) when anything else fails."""
    try:
        return _restore(cfg, out, err)
    except BootseerError as e:
        err(f"bootseer: error: {e}")
        return e.exit_code
    except Exception as e:  # one line, never a traceback: the caller runs the setup instead
        err(f"bootseer: error: restore failed: {type(e).__name__}: {e}"[:500])
        return 1


def _restore(cfg: Config, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    from ..envsnap.actions import restore_here
    from ..settings import Settings
    from ..units import fmt_bytes

    done = restore_here(
        Settings.from_config(cfg), lambda m: err(f"bootseer: {m}"), lambda m: err(f"bootseer: warning: {m}")
    )
    key, r = done.env_key, done.restored
    if done.present:
        out(f"env {key[:16]} already present")
        return 0
    if r is None:
        err(f"no snapshot for env {key[:16]}")
        return EXIT_MISS
    out(
        f"restored env {key[:16]}: {r.files} files ({fmt_bytes(r.raw_bytes)} unpacked) from {r.source} "
        f"in {r.seconds_fetch + r.seconds_extract:.2f} s (fetch {r.seconds_fetch:.2f} s, "
        f"extract {r.seconds_extract:.2f} s)"
    )
    return 0
