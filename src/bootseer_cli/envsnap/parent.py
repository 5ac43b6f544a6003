"""Choosing the parent of a layer: the nearest published snapshot to set up over on an env-key miss.

The rule (also in docs/envsnap.md, and what `bootseer keys` explains):

1. a candidate is a trusted env ref (its signature verified for its domain) of the same image key,
   the same roots and the same machine type, with a different env key, whose setup inputs were
   recorded when it was published, and whose chain is shorter than `[env] max_layers`;
2. every requirement name the candidate's files list is still named by this setup (a package the new
   setup no longer asks for would otherwise stay in the tree);
3. of those, the one sharing the most setup inputs wins: the setup commands, and the lines of the
   requirement/constraint files they name (`keys.env_file_names`); ties go to the one used last
   (its ref's `used`, else `created`), then to the shorter chain.

Setup inputs are recorded as strings (`cmd <command>`, `req <line>`), comments and blank lines
dropped, so a one-line bump of one pin shares every other line with its parent.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import reqfiles
from ..keys import env_file_names
from ..safeopen import sha256_and_head
from ..units import fmt_age

if TYPE_CHECKING:
    from ..keys import Keys
    from ..settings import EnvSettings, Settings
    from ..store.core import Store

MAX_INPUTS = 4000  # lines recorded in a ref (a lock file of a big env has a few hundred)
MAX_CANDIDATES = 500  # refs read when looking for a parent: bounds a miss's extra work on a big store
READERS = 16  # refs read at once: on an object store each read is a round trip
SEARCH_S = 15.0  # the default of `[env] parent_search_s`
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def setup_inputs(env: EnvSettings) -> list[str]:
    """The setup's inputs as comparable strings: each command, each requirement line of the files it
    names, and of the files those include (`-r base.txt`, as a team's file includes the base that CI
    prewarmed: the base's lines are then shared, and its names kept, so the base can be the parent).
    A file that is not text (a wheel named in `[env] files`) counts as one input, its digest."""
    out = [f"cmd {c.strip()}" for c in env.setup]
    seen: set[Path] = set()
    for name in env_file_names(env):
        out += _file_inputs(env.resolve_path(name), name, seen, 0)
    return sorted(set(out))[:MAX_INPUTS]


def _file_inputs(path: Path, name: str, seen: set[Path], depth: int) -> list[str]:
    """`req <line>` for each line of the requirement file `path` (comments and blank lines dropped),
    then those of the files it includes by `-r`, relative to its folder, each file once,
    `reqfiles.MAX_DEPTH` deep; `file <name> sha256:<hex>` alone for a file that is not text. Read as
    the env key reads it: regular files only, never blocking (`safeopen`)."""
    key = Path(os.path.normpath(path))
    if key in seen:
        return []
    seen.add(key)
    try:
        digest, head = sha256_and_head(key, reqfiles.MAX_BYTES)
    except OSError:
        return []
    text = reqfiles.text_of(head)
    if text is None:  # binary, not UTF-8, or too big to be a requirement file: its digest alone
        return [f"file {name} sha256:{digest}"]
    out = [f"req {line}" for line in reqfiles.lines(text)]
    if depth < reqfiles.MAX_DEPTH:
        for inc in reqfiles.includes(text, constraints=False):
            out += _file_inputs(key.parent / inc, inc, seen, depth + 1)
    return out


def requirement_names(inputs: list[str]) -> set[str]:
    """The project names the requirement lines name (options such as `-r`, `--index-url` skipped)."""
    names = set()
    for s in inputs:
        if s.startswith("req ") and not s[4:].startswith("-"):
            m = _NAME.match(s[4:])
            if m:
                names.add(re.sub(r"[-_.]+", "-", m.group(1)).lower())
    return names


@dataclass(frozen=True)
class Choice:
    """The parent chosen, and why (for the summary line, the ref and `bootseer keys`)."""

    key: str
    ref: dict[str, Any]
    shared: int
    of: int  # this setup's inputs
    last_used: float
    depth: int  # the parent's own depth (0: a full snapshot)
    candidates: int

    def why(self) -> str:
        return (
            f"shares {self.shared} of {self.of} setup inputs (the most of {self.candidates} candidate(s)), "
            f"used {fmt_age(self.last_used)} ago, chain depth {self.depth}"
        )


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def read_refs(store: Store, kind: str, deadline_s: float, workers: int = READERS) -> dict[str, Any] | None:
    """The verified refs of `kind`, key -> doc (None where a ref cannot be read or does not verify), the
    first MAX_CANDIDATES of the listing; None when the listing and the reads did not all end within
    `deadline_s`.

    On an object store each read is a round trip, so they run on `workers` threads at once (each one
    `store.read_ref`: the signature checked as for any ref). The threads are daemons: one stuck on an
    unreachable store is left behind at the deadline, never waited for, and ends with its request's
    own timeout."""
    deadline = time.monotonic() + deadline_s
    store.fs  # noqa: B018 - the client is made once, here, not by every thread at once
    listed = _bounded(lambda _: store.list_refs(kind), [""], 1, deadline).get("")
    if listed is None:
        return None
    if isinstance(listed, Exception):
        raise listed  # the store cannot be listed: the caller says so and sets up from the image
    keys = [str(k) for k in listed][:MAX_CANDIDATES] if isinstance(listed, list) else []
    docs = _bounded(lambda k: store.read_ref(kind, k), keys, workers, deadline)
    if len(docs) < len(keys):
        return None
    return {k: d if isinstance(d := docs[k], dict) else None for k in keys}


def _bounded(fn: Callable[[str], object], items: list[str], workers: int, deadline: float) -> dict[str, object]:
    """`fn` over `items` on up to `workers` daemon threads: item -> result (or the exception it
    raised), for the items done by `deadline` (monotonic); the others are left out and not started."""
    todo = list(reversed(items))
    out: dict[str, object] = {}
    cv = threading.Condition()

    def work() -> None:
        while True:
            with cv:
                if not todo or time.monotonic() >= deadline:
                    return
                item = todo.pop()
            try:
                r = fn(item)
            except Exception as e:  # torn, unreachable: the caller decides
                r = e
            with cv:
                out[item] = r
                cv.notify_all()

    for i in range(max(1, min(workers, len(items)))):
        threading.Thread(target=work, daemon=True, name=f"bootseer-refs-{i}").start()
    with cv:
        while len(out) < len(items) and (left := deadline - time.monotonic()) > 0:
            cv.wait(left)
        return dict(out)


def choose(
    store: Store,
    keys: Keys,
    roots: list[str],
    inputs: list[str],
    max_layers: int,
    fmt: int,
    deadline_s: float = SEARCH_S,
    warn: Callable[[str], None] | None = None,
) -> Choice | None:
    """The parent for the env `keys.env` under `roots`, by the rule above; None when no snapshot fits,
    or when the store's refs could not all be read within `deadline_s` (`[env] parent_search_s`; the
    build then sets up from the image, and `warn` says so).

    A ref that does not verify, or cannot be read, is no candidate (a layer over an untrusted parent
    would be a miss anyway)."""
    from .catalog import REF_KIND

    refs = read_refs(store, REF_KIND, deadline_s)
    if refs is None:
        if warn is not None:
            warn(
                f"env: the store's env refs were not all read within [env] parent_search_s = {deadline_s:g} s; "
                "no parent looked for"
            )
        return None
    mine = set(inputs)
    names = requirement_names(inputs)
    doc = keys.env.doc
    found: list[Choice] = []
    for k, ref in refs.items():  # the listing's order, whatever order the reads ended in
        if k == keys.env.digest:
            continue
        if not isinstance(ref, dict) or ref.get("format") != fmt or not isinstance(ref.get("blob"), str):
            continue
        if ref.get("image") != doc.get("image") or ref.get("machine") != doc.get("machine"):
            continue
        theirs = ref.get("inputs")
        if ref.get("roots") != roots or not isinstance(theirs, list):
            continue
        depth = _int(ref.get("depth"))
        if depth + 1 > max_layers:
            continue  # its squash is due: a child would exceed the bound
        theirs_s = {str(x) for x in theirs}
        if not requirement_names(sorted(theirs_s)) <= names:
            continue
        shared = len(mine & theirs_s)
        if shared == 0:
            continue
        last = max(_num(ref.get("used")), _num(ref.get("created")))
        found.append(Choice(k, ref, shared, len(mine), last, depth, 0))
    if not found:
        return None
    best = max(found, key=lambda c: (c.shared, c.last_used, -c.depth))
    return Choice(best.key, best.ref, best.shared, best.of, best.last_used, best.depth, len(found))


def explain(settings: Settings, keys: Keys, store: Store) -> list[str]:
    """For `bootseer keys`: the chain of the snapshot published for this env key, or, when none is,
    the parent a build would set up over now and why (or why none)."""
    from .catalog import FORMAT, REF_KIND

    roots = settings.env.resolve_roots()
    ref = store.read_ref(REF_KIND, keys.env.digest)
    if ref is not None:
        chain = ref.get("chain") if isinstance(ref.get("chain"), list) else []
        if not chain:
            return [f"env snapshot: published, a full snapshot (blob {str(ref.get('blob'))[:12]})"]
        lines = [f"env snapshot: published, layer {len(chain)} of a chain (base first):"]
        lines += [f"  {c.get('key')}  blob {str(c.get('blob'))[:12]}" for c in chain if isinstance(c, dict)]
        lines.append(f"  {keys.env.digest}  blob {str(ref.get('blob'))[:12]}  (this env)")
        why = (ref.get("parent") or {}).get("why") if isinstance(ref.get("parent"), dict) else None
        return lines + ([f"parent chosen because it {why}"] if why else [])
    if not settings.env.layers:
        return ["env snapshot: none published; [env] layers = false: a build sets up from the image"]
    env = settings.env
    late: list[str] = []
    c = choose(store, keys, roots, setup_inputs(env), env.max_layers, FORMAT, env.parent_search_s, late.append)
    if late:
        return [f"env snapshot: none published; {late[0].removeprefix('env: ')}: a build starts from the image"]
    if c is None:
        return [
            "env snapshot: none published, no parent fits (same image, roots, machine): a build starts from the image"
        ]
    return [
        f"env snapshot: none published; a build sets up over {c.key} (layer {c.depth + 1})",
        f"parent chosen because it {c.why()}",
    ]
