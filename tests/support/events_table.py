"""The stage events of one job (or of every job) in a store, as one pyarrow table: what the tests check
after a run (the report reads them its own way, `bootseer_cli.report.load`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bootseer_cli.events import to_table

if TYPE_CHECKING:
    import pyarrow as pa

    from bootseer_cli.store.core import Store


def load_table(store: Store, job: str | None = None) -> pa.Table:
    """All events of one job (or of every job) as one pyarrow table."""
    import pyarrow as pa

    prefix = f"events/{job}" if job else "events"
    rels = [p for p in store.list(prefix, recursive=True) if p.endswith(".parquet")]
    if not rels:
        return to_table([])
    dataset = store.parquet_dataset(rels)
    return dataset.to_table().cast(to_table([]).schema) if dataset.count_rows() else pa.table({})
