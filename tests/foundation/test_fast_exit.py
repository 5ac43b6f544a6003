"""`bootseer restore` exits without tearing the interpreter down (entry._exit_now), and loses nothing by it."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_buffered_output_exit_handlers_and_the_code_survive() -> None:
    r = run("""
        import atexit, sys
        from bootseer_cli.entry import _exit_now
        atexit.register(lambda: print("handler ran", file=sys.stderr))
        print("buffered line")  # stdout is a pipe: block-buffered until flushed
        _exit_now(3)
        print("never")
    """)
    assert r.returncode == 3
    assert r.stdout == "buffered line\n"
    assert "handler ran" in r.stderr


def test_a_running_thread_gets_the_normal_exit_which_waits_for_it() -> None:
    r = run("""
        import threading, time
        from bootseer_cli.entry import _exit_now
        def work():
            time.sleep(0.3)
            print("thread finished", flush=True)
        threading.Thread(target=work).start()
        _exit_now(0)
    """)
    assert r.returncode == 0 and r.stdout == "thread finished\n", r
