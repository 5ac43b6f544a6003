"""Reading ahead the fast path's modules (`readahead.read_ahead_modules`): the kernel is asked to read
the compiled modules `restore` and `exec` import, and nothing but regular files in the interpreter's,
the dependencies' and this package's directories is ever opened."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

import bootseer_cli
from bootseer_cli import readahead


def _advised(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED and (offset, length) == (0, 0)
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    readahead.read_ahead_modules()
    return seen


def test_the_modules_a_restore_imports_are_read_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    import py_compile
    from importlib.util import cache_from_source

    import zstandard

    from bootseer_cli.envsnap import extract

    ours = cache_from_source(extract.__file__)
    if not os.path.exists(ours):  # a checkout whose modules were never compiled: as the first import does
        py_compile.compile(extract.__file__, cfile=ours)
    seen = _advised(monkeypatch)
    assert os.path.realpath(ours) in seen
    assert any(p.startswith(os.path.realpath(os.path.dirname(zstandard.__file__))) and ".so" in p for p in seen)
    for std in (json.__cached__, dataclasses.__cached__):  # a package's and a module's, where compiled
        assert not os.path.exists(std) or os.path.realpath(std) in seen


def test_only_regular_files_in_the_known_directories_are_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "lib" / "site-packages"
    cache = site / "zstandard" / "__pycache__"
    cache.mkdir(parents=True)
    tag = sys.implementation.cache_tag
    os.mkfifo(cache / f"fifo.{tag}.pyc")  # a FIFO (or a device) named like a module is never opened
    (cache / f"link.{tag}.pyc").symlink_to("/etc/passwd")
    (cache / f"real.{tag}.pyc").write_bytes(b"x")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    seen = _advised(monkeypatch)
    assert str(cache / f"real.{tag}.pyc") in seen
    assert not [p for p in seen if "fifo" in p or p == "/etc/passwd"]
    std = os.path.dirname(os.path.realpath(os.__file__))
    roots = (std, os.path.realpath(os.path.dirname(bootseer_cli.__file__)))
    sites = tuple(os.path.realpath(e) for e in sys.path if e.endswith("site-packages"))
    assert all(p.startswith(roots + sites) for p in seen)


def test_the_read_ahead_runs_only_when_the_modules_have_left_the_page_cache() -> None:
    """A warm start (most restarts) pays a one-byte probe, not the read-ahead's 2-5 ms."""
    import py_compile
    from importlib.util import cache_from_source

    from bootseer_cli import entry, settings

    pyc = cache_from_source(settings.__file__)
    if not os.path.exists(pyc):
        py_compile.compile(settings.__file__, cfile=pyc)
    with open(pyc, "rb") as f:
        f.read()  # in the page cache
        try:
            os.preadv(f.fileno(), [bytearray(1)], 0, os.RWF_NOWAIT)
        except OSError:  # a filesystem without RWF_NOWAIT: no telling, so the read-ahead always runs
            assert entry._modules_cold()
            return
        assert not entry._modules_cold()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # out of it, as on a fresh node
    assert entry._modules_cold()
