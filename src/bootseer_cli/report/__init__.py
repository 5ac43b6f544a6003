"""`bootseer report`: where each node's startup time went, from the stage events in the store.

`load` reads the events (a pyarrow dataset over `events/`), `analysis` turns them into per-stage
figures, stragglers, GPU time wasted and a verdict, `render` draws them as text, JSON, SVG and HTML.
`gpus` is import-free: `bootseer exec` calls it to note how many GPUs the launcher will use.
"""
