"""Running a test's command as a plain user (uid 65534) from root, with only the capabilities it names.

One place for the argv that four tests had each written out: who the plain user is, and that it keeps
nothing of root's but the read/search (and, where a test needs it, override) rights it is given.
"""

from __future__ import annotations

NOBODY = 65534

# /dev/fuse is root's 0600 here, where a plain user's node has it 0666: prefix a command with
# `unshare --mount sh -c USER_FUSE /tmp/node CMD…` to get a private namespace with a 0666 node of the same
# device bound over it (mounts made in it end with its last process).
USER_FUSE = 'mknod -m 666 "$0" c 10 229 && mount --bind "$0" /dev/fuse && exec "$@"'


def as_nobody(*caps: str) -> list[str]:
    """`setpriv` argv that runs the rest as uid/gid 65534 with no groups and only `caps` (e.g.
    "dac_read_search": the interpreter under /root still starts; "dac_override": root's 0600 files open)."""
    keep = ",".join(f"+{c}" for c in caps)
    return [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        f"--inh-caps=-all,{keep}" if keep else "--inh-caps=-all",
        *([f"--ambient-caps={keep}"] if keep else []),
    ]
