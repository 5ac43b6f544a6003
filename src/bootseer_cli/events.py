"""Stage events: what each startup stage cost on each node, first to a local JSONL file, then to the store.

The JSONL file is written with one `write` per event (O_APPEND), so the launcher's processes, the
agent and `bootseer_cli.ready()` can all append to it without locks. The agent (or `exec` itself
when there is no agent) converts it to Parquet under `events/<job>/<node>-<run>.parquet`, which is
what `bootseer report` reads with a pyarrow dataset.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .nodedirs import describe_oserror, usable_or_scratch, warn_once
from .paths import runs_dir
from .redact import redact_text

if TYPE_CHECKING:
    import pyarrow as pa

    from .store.core import Store

# The Parquet schema; anything else an event carries goes, as JSON, into `extra`.
COLUMNS: dict[str, str] = {
    "job": "string",
    "run": "string",
    "node": "string",
    "rank": "int64",
    "stage": "string",
    "start": "float64",
    "end": "float64",
    "duration_s": "float64",
    "outcome": "string",
    "cache": "string",
    "bytes": "int64",
    "bytes_from_store": "int64",
    "bytes_from_peers": "int64",
    "reason": "string",
    "detail": "string",
    "extra": "string",
}


def _first_env(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


@dataclass
class RunInfo:
    """Who is starting: the job, this node, this launch."""

    job: str
    node: str
    rank: int
    run: str
    run_dir: Path
    # The events themselves when no run directory could be made anywhere (see `nodedirs`): uploaded from
    # here by `upload`, or lost with the process, as the one warning said.
    memory: list[dict[str, Any]] | None = field(default=None, repr=False)

    @classmethod
    def new(cls, command: Sequence[str] = ()) -> RunInfo:
        """This start's identity. The job comes from the launcher's command line or the scheduler
        (launcher.job_id_hint); with neither, a generated id unique to this start (time + randomness), so
        that unrelated jobs starting in the same second are never merged."""
        from .launcher import job_id_hint

        hint = job_id_hint(command, os.environ)
        job = hint[0] if hint else time.strftime("job-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        node = os.environ.get("BOOTSEER_NODE") or socket.gethostname()
        rank_text = _first_env("NODE_RANK", "GROUP_RANK", "SLURM_NODEID", "RANK") or "0"
        try:
            rank = int(rank_text)
        except ValueError:
            rank = 0
        run = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
        parent = usable_or_scratch(runs_dir(), "runs")  # a read-only or full cache must not stop the job
        info = cls(job=_clean(job), node=_clean(node), rank=rank, run=run, run_dir=(parent or runs_dir()) / run)
        try:
            if parent is None:
                raise OSError("no writable directory")
            parent.mkdir(parents=True, exist_ok=True)
            info.run_dir.mkdir(mode=0o700)  # private: the agent's files and logs live here (a new name: never followed)
            os.chmod(info.run_dir, 0o700)  # whatever the umask
            (info.run_dir / "run.json").write_text(json.dumps(info.as_dict()))
        except OSError as e:
            warn_once(runs_dir(), describe_oserror(e), None)
            info.memory = []
        return info

    @classmethod
    def load(cls, run_dir: Path) -> RunInfo:
        d = json.loads((run_dir / "run.json").read_text())
        return cls(job=d["job"], node=d["node"], rank=int(d["rank"]), run=d["run"], run_dir=run_dir)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "node": self.node, "rank": self.rank, "run": self.run}

    @property
    def events_file(self) -> Path:
        return self.run_dir / "events.jsonl"

    def store_path(self) -> str:
        return f"events/{self.job}/{self.node}-{self.run}.parquet"


def _clean(name: str) -> str:
    """Job and node names become store path segments."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "unknown"


def append(events_file: Path, event: dict[str, Any]) -> None:
    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    fd = os.open(events_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def record(
    run: RunInfo,
    stage: str,
    start: float,
    end: float,
    outcome: str,
    *,
    cache: str = "",
    bytes: int = 0,
    bytes_from_store: int = 0,
    bytes_from_peers: int = 0,
    reason: str = "",
    detail: str = "",
    **extra: object,
) -> dict[str, Any]:
    # Defence in depth: a reason or detail is free text (often an exception's), and the events are
    # uploaded to the shared store, so any URI in them loses its credentials here.
    event: dict[str, Any] = {
        **run.as_dict(),
        "stage": stage,
        "start": start,
        "end": end,
        "duration_s": max(0.0, end - start),
        "outcome": outcome,
        "cache": cache,
        "bytes": int(bytes),
        "bytes_from_store": int(bytes_from_store),
        "bytes_from_peers": int(bytes_from_peers),
        "reason": redact_text(reason),
        "detail": redact_text(detail),
    }
    if extra:
        event["extra"] = redact_text(json.dumps(extra, sort_keys=True, default=str))
    if run.memory is None:
        try:
            append(run.events_file, event)
            return event
        except OSError as e:  # the disk filled (or went read-only) since the run began: keep the job starting
            warn_once(run.run_dir, describe_oserror(e), None)
            run.memory = []
    run.memory.append(event)
    return event


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a torn last line from a killed writer
    except FileNotFoundError:
        pass
    return out


def to_table(events: list[dict[str, Any]]) -> pa.Table:
    """Events as a table of `COLUMNS` (a missing column is empty, not null, so reports need no cases)."""
    import pyarrow as pa

    types = {"string": pa.string(), "float64": pa.float64(), "int64": pa.int64()}
    schema = pa.schema([(name, types[t]) for name, t in COLUMNS.items()])
    cols: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for e in events:
        for name, t in COLUMNS.items():
            v = e.get(name)
            if v is None:
                v = "" if t == "string" else (0.0 if t == "float64" else 0)
            cols[name].append(v)
    return pa.table(cols, schema=schema)


def upload(store: Store, run: RunInfo) -> str | None:
    """Write this run's events to the store as Parquet (replacing an earlier upload of the same run)."""
    events = read_jsonl(run.events_file) + (run.memory or [])
    if not events:
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = pa.BufferOutputStream()  # in memory: the run directory may be on a full or read-only disk
    pq.write_table(to_table(events), buf)
    rel = run.store_path()
    store.put_bytes(rel, buf.getvalue().to_pybytes())
    return rel
