"""Reading ahead the compiled modules a fast-path command (`exec`, `restore`) imports.

On a node whose page cache does not hold the interpreter's modules (a fresh node, or one whose cache
the job's data pushed out), each import waits for its own disk reads, one file after the other:
40-60 ms of a torch venv's restore before its first worker, on the serial path in front of the job.
`posix_fadvise(WILLNEED)` on all of them first only queues the reads and returns (2-5 ms): the imports
then find their files in the page cache, or arriving. The entry point asks for it only when one of them
has left the page cache (`entry._modules_cold`), so a warm start does not pay it.
"""

from __future__ import annotations

import sys

# What the fast path imports from the standard library and the two dependencies it needs: names, not
# files (a name another Python lacks is skipped), taken from a traced restore.
_STD_MODULES = [
    "__future__",
    "_compression",
    "_weakrefset",
    "ast",
    "base64",
    "bisect",
    "bz2",
    "contextlib",
    "copy",
    "copyreg",
    "dataclasses",
    "datetime",
    "dis",
    "enum",
    "fnmatch",
    "functools",
    "hashlib",
    "inspect",
    "ipaddress",
    "keyword",
    "linecache",
    "lzma",
    "opcode",
    "operator",
    "pathlib",
    "platform",
    "random",
    "reprlib",
    "selectors",
    "shlex",
    "shutil",
    "signal",
    "string",
    "struct",
    "sysconfig",
    "tempfile",
    "threading",
    "token",
    "tokenize",
    "types",
    "typing",
    "warnings",
    "weakref",
]
_STD_PACKAGES = ("collections", "json", "re", "tomllib", "urllib", "importlib")
_EXTENSIONS = [
    "_bisect",
    "_blake2",
    "_bz2",
    "_datetime",
    "_hashlib",
    "_json",
    "_lzma",
    "_opcode",
    "_random",
    "_sha512",
    "_struct",
    "_typing",
    "binascii",
    "fcntl",
    "math",
    "mmap",
    "resource",
    "select",
    "zlib",
]
_OUR_PACKAGES = ("", "verbs", "envsnap", "containers")
_THIRD_PARTY = ("zstandard", "platformdirs")


def read_ahead_modules() -> None:
    """Ask the kernel to start reading, all at once, the compiled modules a fast-path command imports.

    `posix_fadvise(WILLNEED)` only queues the reads and returns: the imports then find the files in
    the page cache, or arriving, instead of waiting for each in turn. Only regular files are opened, in
    the interpreter's library, the two dependencies' directories and this package's (read-only, never
    following a link, never blocking); what the kernel is asked is a hint, so a missing file is skipped."""
    import os
    from importlib.machinery import EXTENSION_SUFFIXES

    if not hasattr(os, "posix_fadvise"):
        return
    tag, ext = f".{sys.implementation.cache_tag}.pyc", EXTENSION_SUFFIXES[0]
    std = os.path.dirname(os.__file__)
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [f"{std}/__pycache__/{m}{tag}" for m in _STD_MODULES] + [f"{std}/lib-dynload/{m}{ext}" for m in _EXTENSIONS]
    listed = [(f"{std}/{p}/__pycache__", tag) for p in _STD_PACKAGES] + [
        (f"{here}/{p}/__pycache__", tag) for p in _OUR_PACKAGES
    ]
    for entry in (e for e in sys.path if e.endswith("site-packages")):
        listed += [(f"{entry}/{p}/__pycache__", tag) for p in _THIRD_PARTY] + [
            (f"{entry}/{p}", ext) for p in _THIRD_PARTY
        ]
    for d, suffix in listed:
        try:
            with os.scandir(d) as it:
                paths += [e.path for e in it if e.name.endswith(suffix) and e.is_file(follow_symlinks=False)]
        except OSError:
            continue
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for path in paths:
        try:
            fd = os.open(path, flags)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
