"""`bootseer report`: where each node's startup time went, from the stage events in the store.

`load` reads the events (a pyarrow dataset over `events/`), `analysis` turns them into per-stage
figures, stragglers, GPU time wasted and a verdict chosen among tagged findings, `render` draws
them as text, JSON, SVG and HTML (one row builder per table, shared by the text and the page).
What the launcher says about GPUs and node ranks is read in `bootseer_cli.launcher`.
"""
