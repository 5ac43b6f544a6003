"""The verbs that run in front of every start (`exec`, `restore`), free of typer.

`entry.py` runs them directly from hand-parsed arguments; `commands/` registers the same functions on
the typer app (for `--help` and for callers of the app). Below both: nothing here imports `commands`
or `entry`.
"""
