"""What the agent learned about an image's hot blocks, for the next start to act on.

The agent cannot print to the start's output (it runs behind the program), so what it learns goes
to the store, next to the record, and the next start reads it:

- `refs/hot-empty/<image_key>.json`: the last record came out empty, and why. The next start warns
  with that reason, and `record = "auto"` does not try again on every start: only when the tree
  changed (its fingerprint: device and mtime of each root) or after `RETRY_EVERY` starts.
- `refs/hot-verdict/<image_key>.json`: the never-slower rule. The time to ready of the recording
  start, of starts with the record's replay, and of starts without it (that skipped replay); when the
  starts with replay are slower than `LOSS` times those without, replay is off for this image until
  the record changes (the verdict names the record it judged).

  The recording start is a biased baseline: it pays for the recording (the agent starts beside the
  program and takes an event per open; 2-14 % on `import torch`), so a replay that only matches it
  loses to a plain start. Measured on s3fs with kernel_cache: recording 56.0 s, replay 54.1 s, plain
  50.9 s; judged against the recording start, replay stayed on at 1.06x slower. So replay slower than
  `LOSS` times even the recording start is off at once; replay faster than `CLEAR_WIN` times it
  clearly pays; in between, one start skips replay as a control (`needs_control`), and the rule
  judges against the control starts from then on.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.core import Store

EMPTY_KIND = "hot-empty"
VERDICT_KIND = "hot-verdict"
RETRY_EVERY = 5  # an empty record is tried again every this many starts (or when the tree changes)
LOSS = 1.05  # replay is off when its starts are slower than this times the starts without
SAMPLES = 5  # samples kept per side
CLEAR_WIN = 0.8  # replay this much faster than the recording start needs no control start


def tree_fingerprint(roots: list[str]) -> list[list[Any]]:
    """What "the tree changed" means for an empty record: each root's device and mtime."""
    out: list[list[Any]] = []
    for r in roots:
        try:
            st = os.stat(r)
            out.append([r, st.st_dev, st.st_mtime_ns])
        except OSError:
            out.append([r, -1, 0])
    return out


def note_empty(store: Store, image_key: str, roots: list[str], why: str) -> None:
    store.write_ref(
        EMPTY_KIND, image_key, {"why": why, "at": time.time(), "tree": tree_fingerprint(roots), "skipped": 0}
    )


def clear_empty(store: Store, image_key: str) -> None:
    if store.read_ref(EMPTY_KIND, image_key) is not None:
        store.delete_ref(EMPTY_KIND, image_key)


def empty_backoff(store: Store, image_key: str, roots: list[str]) -> tuple[str, int] | None:
    """(why the last record was empty, starts left before a retry) when this start should not record.

    Counts this start as skipped. None when there is no empty record, the tree changed, or it is
    time to try again (then the marker stays, and the new record's outcome replaces it).
    """
    doc = store.read_ref(EMPTY_KIND, image_key)
    if doc is None:
        return None
    why = str(doc.get("why", "?"))
    skipped = int(doc.get("skipped", 0))
    if doc.get("tree") != tree_fingerprint(roots) or skipped + 1 >= RETRY_EVERY:
        store.write_ref(EMPTY_KIND, image_key, dict(doc, skipped=0))
        return None
    store.write_ref(EMPTY_KIND, image_key, dict(doc, skipped=skipped + 1))
    return why, RETRY_EVERY - skipped - 1


def read_empty(store: Store, image_key: str) -> dict[str, Any] | None:
    return store.read_ref(EMPTY_KIND, image_key)


def read_verdict(store: Store, image_key: str, record: str) -> dict[str, Any]:
    """The verdict for this record (a fresh one when there is none or it judged another record)."""
    doc = store.read_ref(VERDICT_KIND, image_key)
    if not doc or doc.get("record") != record:
        return {"record": record, "recording": [], "with": [], "without": [], "off": False, "why": ""}
    doc.setdefault("recording", [])
    return doc


def needs_control(doc: dict[str, Any]) -> bool:
    """Whether the next start should skip replay to give the rule a fair baseline (module doc)."""
    if doc.get("off") or doc.get("without") or not doc.get("with") or not doc.get("recording"):
        return False
    return statistics.median(doc["with"]) > CLEAR_WIN * statistics.median(doc["recording"])


def add_sample(store: Store, image_key: str, record: str, side: str, seconds: float) -> dict[str, Any]:
    """Add one start's time to ready on `side` ("recording", "with" or "without" replay) and judge again;
    returns the verdict as written."""
    doc = read_verdict(store, image_key, record)
    doc[side] = ([*doc[side], round(seconds, 3)])[-SAMPLES:]
    baseline, against = (doc["without"], "without") if doc["without"] else (doc["recording"], "the recording start")
    if not doc["off"] and doc["with"] and baseline:
        w, wo = statistics.median(doc["with"]), statistics.median(baseline)
        if w > LOSS * wo:
            doc["off"] = True
            doc["why"] = (
                f"starts with replay took {w:.1f} s to ready, {against} {wo:.1f} s "
                f"(median of {len(doc['with'])} and {len(baseline)})"
            )
            doc["off_since"] = time.time()
    store.write_ref(VERDICT_KIND, image_key, doc)
    return doc
