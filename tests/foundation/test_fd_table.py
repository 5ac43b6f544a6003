"""The descriptor table is grown once, before the process has a second thread (errors._reserve_fds).

Why it matters: in a multi-threaded process every growth of the kernel's descriptor table waits an RCU
grace period (10-20 ms on a small VM), and a restore's last step opens every directory it made."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from bootseer_cli.errors import FD_RESERVE


def run(code: str, limit: int | None = None) -> str:
    pre = f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n" if limit else ""
    body = pre + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


FDSIZE = "int(open('/proc/self/status').read().split('FDSize:')[1].split()[0])"


def test_the_table_is_grown_before_the_watchdog_thread_starts() -> None:
    out = run(f"""
        import threading
        from bootseer_cli import errors
        before = {FDSIZE}
        errors._watch_interrupts()
        print(before, {FDSIZE}, threading.active_count())
    """)
    before, after, threads = map(int, out.split())
    assert before < FD_RESERVE <= after, out  # it was 64 and grew at each 64 → 128 → … on demand
    assert threads == 2


def test_a_descriptor_in_use_at_the_top_is_left_alone() -> None:
    out = run(f"""
        import os
        from bootseer_cli import errors
        fd = os.open("/dev/null", os.O_RDONLY)
        os.dup2(fd, {FD_RESERVE - 1})
        ino = os.fstat({FD_RESERVE - 1}).st_ino
        errors._watch_interrupts()
        print(os.fstat({FD_RESERVE - 1}).st_ino == ino, {FDSIZE} >= {FD_RESERVE})
    """)
    assert out == "True True"


def test_a_low_descriptor_limit_bounds_the_reserve() -> None:
    out = run(
        f"""
        import os
        from bootseer_cli import errors
        errors._watch_interrupts()
        fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(200)]  # the limit still holds
        print({FDSIZE}, max(fds) < 256)
    """,
        limit=256,
    )
    size, ok = out.split()
    assert int(size) <= 256 and ok == "True", out
