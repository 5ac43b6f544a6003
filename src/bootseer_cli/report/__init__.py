"""`bootseer report`: where each node's startup time went, from the stage events in the store.

`load` reads the events (a pyarrow dataset over `events/`); `starts` groups them into node starts;
`analysis` turns those into a job's report (`job`: per-stage figures, stragglers, GPU time wasted)
with a verdict chosen among tagged `findings`, or into the trend across jobs. `text` draws a report
as text and JSON (and builds each table's rows once, shared with the page), `svg` as the timeline and
charts, `page` as a self-contained HTML page. What the launcher says about GPUs and node ranks is
read in `bootseer_cli.launcher`.
"""
