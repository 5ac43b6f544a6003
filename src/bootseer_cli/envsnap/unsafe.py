"""The error of a snapshot that is hostile or malformed (its own module: the no-follow directory
descriptors of `dirfd` raise it, and the archive writer, which reads through them, imports `dirfd`)."""

from __future__ import annotations

from ..errors import BootseerError


class UnsafeArchive(BootseerError):
    """The archive tries to write outside its roots, or holds something that cannot be restored safely.

    Not a StoreError: the blob matched its digest, the store did its job; what it holds is hostile
    or malformed. Nothing is written (or everything is undone) when this is raised."""
