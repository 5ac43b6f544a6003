"""A tiny job: imports what the setup installed, says it is ready, does a little work."""

import time

import six
from tabulate import tabulate

import bootseer_cli

bootseer_cli.ready()  # startup is over: bootseer report measures up to here
rows = [(n, n * n) for n in range(1, 6)]
print(tabulate(rows, headers=["n", "n²"]))
print(f"six {six.__version__}; job done at {time.strftime('%H:%M:%S')}")
