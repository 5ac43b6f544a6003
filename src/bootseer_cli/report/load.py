"""Reading stage events from the store: one job, the most recent job, or every job in a time window.

The events are Parquet files under `events/<job>/<node>-<run>.parquet`, one per node and start; they
are read as one pyarrow dataset, so a job of thousands of nodes loads in seconds. A file that cannot
be read (a torn upload, a foreign file) is skipped with a warning rather than failing the report.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError, ConfigError, StoreError
from ..events import COLUMNS
from ..redact import warn

if TYPE_CHECKING:
    import pyarrow as pa

    from ..store.core import Store

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str) -> float:
    """'7d', '12h', '30m', '90s', '2w' → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not m:
        raise ConfigError(f"--since {text!r}: expected a duration like 7d, 12h, 30m, 2w")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass
class EventFile:
    job: str
    rel: str
    mtime: float


def list_event_files(store: Store, job: str | None = None) -> list[EventFile]:
    """The Parquet event files of one job (or all jobs), with their modification times.

    Only `events/<job>/<file>.parquet` counts: anything else under `events/` (a foreign file, a
    deeper directory) is not an event file of a job.
    """
    if job is not None and (not job or "/" in job or job.startswith(".")):
        raise ConfigError(f"--job {job!r}: not a job name")
    prefix = f"events/{job}" if job else "events"
    out = []
    for info in store.list_info(prefix):  # StoreError (a BootseerError) names the store and the prefix
        parts = info.rel.split("/")
        if not info.rel.endswith(".parquet") or len(parts) != 3:
            continue
        out.append(EventFile(job=parts[1], rel=info.rel, mtime=info.mtime))
    return out


def read_events(store: Store, files: list[EventFile], since: float | None = None) -> list[dict[str, Any]]:
    """The events in `files` as row dicts (all columns), optionally only those that ended after `since`.

    One pyarrow dataset over the files (pyarrow reads them on its own thread pool). When that fails
    (a torn or foreign file, or a file an agent replaced between listing and reading), the files are
    read one by one and the bad ones skipped with a warning, so one damaged file never hides a job.
    """
    if not files:
        return []
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = _schema()
    try:
        table = store.parquet_dataset([f.rel for f in files], schema=schema).to_table()
    except (OSError, pa.ArrowException):
        table = _read_one_by_one(store, files, schema)
    if since is not None:
        table = table.filter(pc.greater_equal(table["end"], since))
    return table.to_pylist()


def _read_one_by_one(store: Store, files: list[EventFile], schema: pa.Schema) -> pa.Table:
    """Each file on its own (eight at a time), the unreadable ones skipped with a warning."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    def read(rel: str) -> pa.Table | None:
        try:
            return _read_file(store, rel, schema)
        except (StoreError, OSError, pa.ArrowException, KeyError, ValueError) as e:
            warn(f"skipping unreadable event file {rel}: {e}")
            return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        tables = [t for t in pool.map(read, [f.rel for f in files]) if t is not None]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _read_file(store: Store, rel: str, schema: pa.Schema) -> pa.Table:
    """One event file in `schema`: columns an older writer did not have are added as nulls."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with store.open_input(rel) as f:  # on this thread: pyarrow's own pool aborted `hot show` at exit (3bb6041)
        table = pq.ParquetFile(f).read(use_threads=False)
    names = [n for n in schema.names if n in table.column_names]
    table = table.select(names).cast(pa.schema([schema.field(n) for n in names]))
    for i, field in enumerate(schema):
        if field.name not in names:
            table = table.add_column(i, field, pa.nulls(table.num_rows, field.type))
    return table


def _schema() -> pa.Schema:
    import pyarrow as pa

    types = {"string": pa.string(), "float64": pa.float64(), "int64": pa.int64()}
    return pa.schema([(n, types[t]) for n, t in COLUMNS.items()])


def load_job(store: Store, job: str) -> list[dict[str, Any]]:
    """Every event of `job`; a job with no events names a few that exist, for a mistyped name."""
    files = list_event_files(store, job)
    if not files:
        raise BootseerError(f"no events for job {job!r} in {store.uri} (jobs: {_some_jobs(store)})")
    return read_events(store, files)


def last_job(store: Store) -> str:
    """The job with the most recent event.

    Files are shortlisted by upload time (one listing, no reads); the few newest jobs are then read
    (only `job` and `end`) to compare the events themselves.
    """
    files = list_event_files(store)
    if not files:
        raise BootseerError(f"no stage events in {store.uri} yet: run `bootseer exec` with a configured stage first")
    newest: dict[str, float] = {}
    for f in files:
        newest[f.job] = max(newest.get(f.job, 0.0), f.mtime)
    shortlist = sorted(newest, key=lambda j: newest[j], reverse=True)[:3]
    if len(shortlist) == 1:
        return shortlist[0]
    best, best_end = shortlist[0], -1.0
    for job in shortlist:
        end = _latest_end(store, [f for f in files if f.job == job])
        if end > best_end:
            best, best_end = job, end
    return best


def _latest_end(store: Store, files: list[EventFile]) -> float:
    """The latest `end` among the events in `files`, reading only that column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        data = store.parquet_dataset([f.rel for f in files], schema=_schema())
        value = pc.max(data.to_table(columns=["end"])["end"]).as_py()
    except (OSError, pa.ArrowException):
        value = max((float(r["end"] or 0.0) for r in read_events(store, files)), default=None)
    return float(value) if value is not None else -1.0


def load_since(store: Store, seconds: float, now: float | None = None) -> list[dict[str, Any]]:
    """Every job's events that ended within the last `seconds`."""
    since = (now if now is not None else time.time()) - seconds
    files = [f for f in list_event_files(store) if f.mtime == 0.0 or f.mtime >= since]
    return read_events(store, files, since=since)


def _some_jobs(store: Store) -> str:
    """Up to five job names in the store, for an error message."""
    jobs = sorted({f.job for f in list_event_files(store)})
    if not jobs:
        return "none"
    return ", ".join(jobs[:5]) + (f", … ({len(jobs)} in all)" if len(jobs) > 5 else "")
