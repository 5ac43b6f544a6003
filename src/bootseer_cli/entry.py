"""The `bootseer` entry point: `exec` and `restore` take a fast path that never imports typer.

`bootseer exec` sits in front of every start of every job, so its own cost is paid on every
restart of every node. typer (which now imports pydantic) costs a few hundred milliseconds to
import; the exec options are few and fixed, so they are parsed by hand (verbs/exec.py). An unknown
option is a usage error there, before any stage runs; only `--help` (and an option missing its
value) goes through the full typer CLI, which explains it properly. The verbs' bodies live in
`verbs/`, below both this module and `commands/`: nothing here imports `commands`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .verbs.exec import ExecOptions


def main() -> None:
    """`bootseer …`; a command that gave up a stalled store read leaves without waiting for it (`store.guard`)."""
    try:
        _main()
    except SystemExit as e:
        _leave_if_abandoned(e.code)
        raise
    except BaseException as e:  # not expected (run_guarded): shown, with the status Python would give
        if _abandoned():
            import traceback

            traceback.print_exc()
            _leave_if_abandoned(130 if isinstance(e, KeyboardInterrupt) else 1)
        raise
    _leave_if_abandoned(0)


def _abandoned() -> bool:
    guard = sys.modules.get("bootseer_cli.store.guard")  # never imported here: exec's path stays as it was
    return guard is not None and guard.ABANDONED.is_set()


def _leave_if_abandoned(code: int | str | None) -> None:
    """After a read given up: end once the other threads (but daemons) have, without the S3 finalizer
    that waits for that read (`store.guard.skip_s3_finalizer`), with the status `sys.exit(code)` gives."""
    if not _abandoned():
        return
    import threading

    sys.modules["bootseer_cli.store.guard"].skip_s3_finalizer()
    for t in threading.enumerate():  # as the interpreter's exit does; then `_exit_now` takes its fast path
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    if isinstance(code, str):
        print(code, file=sys.stderr)
    _exit_now(code if isinstance(code, int) else 0 if code is None else 1)


def _main() -> None:
    """exec and restore by hand-parsed arguments when they are plain, else the typer app."""
    argv = sys.argv[1:]
    if argv[:1] in (["exec"], ["restore"]) and _modules_cold():
        from .readahead import read_ahead_modules

        read_ahead_modules()
    if argv[:1] == ["exec"]:
        from .errors import run_guarded
        from .verbs.exec import parse_exec, run_exec

        parsed = run_guarded(lambda: parse_exec(argv[1:]))  # an unknown option: exit 2 here
        if parsed is not None:
            options, command = parsed
            run_guarded(lambda: run_exec(options, command))
            return
    if argv[:2] == ["agent", "--run-dir"] and len(argv) == 3:
        # the agent `exec` starts (launch.py): a recording start waits for it to read the opens (hotblocks)
        from pathlib import Path

        from .agent import main as agent_main
        from .nodedirs import scratch_of_agent

        with scratch_of_agent(Path(argv[2])):  # exec's scratch directories: used, then removed at the end
            sys.exit(agent_main(Path(argv[2])))
    if argv[:1] == ["restore"]:
        # `bootseer restore || (setup && bootseer snapshot)` runs in front of every start too
        from .verbs.exec import ExecOptions, ExecUsageError, parse_exec

        try:
            parsed = parse_exec([*argv[1:], "--"])
        except ExecUsageError:
            parsed = None  # typer explains, in restore's words
        if parsed is not None and not parsed[1]:
            opts = parsed[0]
            if opts == ExecOptions(config=opts.config, store=opts.store):  # restore has only these two
                _fast_restore(opts)
                return
    from .cli import main as cli_main

    cli_main()


def _modules_cold() -> bool:
    """Whether this package's compiled modules have left the page cache (a fresh node, or one whose cache
    the job's data pushed out), so that reading them ahead pays (readahead.py): a one-byte read that
    would wait for the disk fails at once (`RWF_NOWAIT`), ~0.1 ms, where the read-ahead costs 2-5 ms."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(f"{here}/__pycache__/settings.{sys.implementation.cache_tag}.pyc", flags)
    except OSError:
        return False  # never compiled here: there is nothing to read ahead
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        return False
    except (OSError, AttributeError):  # BlockingIOError: not in the page cache; else no RWF_NOWAIT here
        return True
    finally:
        os.close(fd)


def _fast_restore(opts: ExecOptions) -> None:
    from .config import load
    from .errors import run_guarded
    from .verbs.restore import restore_verb

    def body() -> int:
        cfg = load(opts.config, {("store", "uri"): opts.store})
        return restore_verb(cfg, print, lambda m: print(m, file=sys.stderr))

    _exit_now(run_guarded(body))


def _exit_now(code: int) -> None:
    """Exit with `code` without tearing the interpreter down, once nothing is left to wait for.

    A restore ends holding its plan (tens of thousands of entries); freeing them one by one at
    interpreter shutdown took ~20 ms of a 1.8 s restore, in front of the job that waits for it. The
    exit handlers still run (the p2p session's shutdown) and the output is flushed; a thread still
    running (a download that outlived its restore) gets the normal exit, which waits for it."""
    import atexit
    import contextlib
    import os
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said
            stream.flush()
    os._exit(code)
