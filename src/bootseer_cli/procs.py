"""Whether a process still runs, asked without signalling it (signal 0)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while `pid` exists (also when it belongs to another user: EPERM means it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
