"""The files a requirement file includes (`-r base.txt`, `-c constraints.txt`), as pip reads them.

A team's `requirements.txt` often starts with `-r base.txt`: pip reads the base as part of the file,
relative to the including file's folder. The env key must cover the base's bytes too, or a change to
the base alone would restore the env built before it (a wrong start); the parent rule of layers
compares the base's lines as well. One parser serves both.
"""

from __future__ import annotations

import re

# `-r x`, `-rx`, `--requirement x`, `--requirement=x`; likewise `-c`/`--constraint` (pip's own forms).
_INCLUDE = re.compile(r"^(-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+|(?<=^-r)|(?<=^-c))(\S+)$")
MAX_DEPTH = 8  # pip has no limit; a deeper chain is refused (no key) rather than half covered
MAX_BYTES = 1 << 20  # a requirement file is a few kB; a bigger or binary file includes nothing


def text_of(data: bytes) -> str | None:
    """`data` as a requirement file's text, or None when it cannot be one (binary, not UTF-8, too big)."""
    if len(data) > MAX_BYTES or b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def lines(text: str) -> list[str]:
    """The file's lines as pip sees them: comments (`#` at the start or after a space) and blanks dropped."""
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def includes(text: str, constraints: bool = True) -> list[str]:
    """The local files `text` includes by `-r` (and `-c` when `constraints`), in order, URLs left out."""
    out = []
    for line in lines(text):
        m = _INCLUDE.match(line)
        if m and (constraints or m.group(1) in ("-r", "--requirement")) and "://" not in m.group(2):
            out.append(m.group(2))
    return out
