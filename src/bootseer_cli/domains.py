"""Trust domains by name: what a domain may be called, and whose it is by default.

Below both `settings` (whose `[store] domain` falls back to the job owner's) and `trust` (which checks
every domain it is given), so neither imports the other for it: pure functions of their inputs and the
process's user.
"""

from __future__ import annotations

import os

from .errors import ConfigError

_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


# Top-level names of the store that are not domains: the shared blobs, and the layout before domains.
RESERVED = frozenset({"blobs", "refs", "leases", "ckpt", "events", "swarm"})


def check_domain(name: str, where: str = "[store] domain") -> str:
    """A domain is one path component of plain characters (it becomes a prefix in the store)."""
    if not name or name in (".", "..") or not set(name) <= _DOMAIN_CHARS or len(name) > 64:
        raise ConfigError(f"{where}: {name!r} is not a domain name (letters, digits, '.', '_', '-'; at most 64)")
    if name in RESERVED:
        raise ConfigError(f"{where}: {name!r} is a name the store's layout uses; pick another domain")
    return name


def default_domain() -> str:
    """The job owner's user name: the real user's, from the password database (never `USER` or
    `LOGNAME`, which a process sets as it likes); for root acting for a job (the Slurm prolog), the
    job's owner (`SLURM_JOB_USER`)."""
    import pwd

    if os.geteuid() == 0 and os.environ.get("SLURM_JOB_USER"):
        return _plain(os.environ["SLURM_JOB_USER"])
    try:
        return _plain(pwd.getpwuid(os.getuid()).pw_name)
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"


def _plain(name: str) -> str:
    out = "".join(c if c in _DOMAIN_CHARS else "_" for c in name)[:64]
    if out in ("", ".", ".."):
        return "_"
    return f"user-{out}" if out in RESERVED else out
