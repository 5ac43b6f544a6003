"""Exceptions that the CLI turns into one-line messages instead of tracebacks."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class BootseerError(Exception):
    """A user-facing failure: the message is printed as is and the process exits with `exit_code`."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(BootseerError):
    """Bad configuration or bad arguments (exit 2, like a usage error)."""

    exit_code = 2


class StoreError(BootseerError):
    """The store could not be reached, or returned something unusable."""

    exit_code = 1


class IntegrityError(StoreError):
    """Data did not match its digest: never use it."""


class StageFatal(BootseerError):
    """A stage failure that must stop the start (the user's own setup command failed)."""


def run_guarded(fn: Callable[[], Any]) -> Any:
    """Run a CLI body: a BootseerError becomes one line on stderr and its exit code, never a traceback."""
    try:
        return fn()
    except BootseerError as e:
        from .redact import redact_text  # defence in depth: no URI's credentials in an error line

        print(f"bootseer: error: {redact_text(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("bootseer: interrupted", file=sys.stderr)
        sys.exit(130)
