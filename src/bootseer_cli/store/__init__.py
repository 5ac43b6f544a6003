"""The store and everything that reaches it, in one place (DESIGN.md sections 3 and 9).

- `core`: the `Store` (content-addressed blobs, signed refs, listing, the leases' documents) and
  `open_store` / `open_store_for`;
- `fs`: the filesystem adapters under it (a pyarrow.fs URI or a local directory; atomic writes,
  reads, deletes, listing, the redacted display URI);
- `guard`: the deadlines every store call runs under (short timeouts, the breaker, stalled streams);
- `conditional`: conditional writes on S3 (obstore), for leases and one-request deletes;
- `leases`: the `Lease` a taker holds and both protocols (compare-and-swap, a claim per taker);
- `cache`, `cachedir`: the node's blob cache and its no-follow directory operations.

Import the module that holds what you need (`from bootseer_cli.store.core import Store`): this file
imports nothing, so a light module here (`guard`, `cachedir`) costs no more than itself.
"""
