"""The blob's output file: the running sha256 and offset of everything written, on a thread of its own.

Kept apart from `format` (the blob's layout) because it is about moving bytes: in-order writes on one
I/O thread, and parts other processes wrote appended in the kernel with the hash beside the copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ..errors import BootseerError

if TYPE_CHECKING:
    from concurrent.futures import Future


class Sink:
    """The output file, with the running sha256 and offset of everything written.

    Writing and hashing run on one thread of their own, in order (both release the GIL), so the
    thread that reads the files and builds the tar stream never waits for them."""

    def __init__(self, path: Path, digest: bool = True) -> None:
        self.f = open(path, "wb")  # noqa: SIM115 - closed by the writer's finish/abort
        self.h = hashlib.sha256() if digest else None
        self.offset = 0
        from concurrent.futures import ThreadPoolExecutor  # here: it imports logging, a restore never needs it

        self._io = ThreadPoolExecutor(1, thread_name_prefix="bootseer-sink")
        self._last: Future[None] | None = None

    def _put(self, data: bytes) -> None:
        self.f.write(data)
        if self.h is not None:
            self.h.update(data)

    def write(self, data: bytes | memoryview) -> int:
        if self._last is not None and self._last.done():
            self._last.result()  # an earlier write failed: raise it here
        self._last = self._io.submit(self._put, bytes(data) if not isinstance(data, bytes) else data)
        self.offset += len(data)
        return len(data)

    def append_file(self, path: Path, start: int, end: int) -> int:
        """Append bytes `start`..`end` of the file at `path` (a part another process wrote, or what it
        has reported of it so far), in order with the writes: hashed through a read-only mapping and
        copied in the kernel (`copy_file_range`), so its bytes never pass through a Python buffer.
        Returns how many."""
        src = open(path, "rb")  # noqa: SIM115 - opened now (the caller may unlink it), closed by _append
        size = end - start
        if size < 0 or os.fstat(src.fileno()).st_size < end:
            src.close()
            raise BootseerError(f"{path} is shorter than its report says")
        if self._last is not None and self._last.done():
            self._last.result()
        self._last = self._io.submit(self._append, src, path, start, size)
        self.offset += size
        return size

    def _append(self, src: BinaryIO, path: Path, start: int, size: int) -> None:
        import mmap

        self.f.flush()
        with src:
            hashing: threading.Thread | None = None
            if size and self.h is not None:  # beside the copy: the last part's append is the capture's tail
                lead = start % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page
                m = mmap.mmap(src.fileno(), lead + size, access=mmap.ACCESS_READ, offset=start - lead)
                view = memoryview(m)[lead:]
                hashing = threading.Thread(target=self.h.update, args=(view,), name="bootseer-hash")
                hashing.start()
            try:
                self._copy(src, path, start, size)
            finally:
                if hashing is not None:
                    hashing.join()
                    view.release()
                    m.close()

    def _copy(self, src: BinaryIO, path: Path, start: int, size: int) -> None:
        """`size` bytes of `src` from `start` to the end of the blob, in the kernel where it can."""
        out = self.f.fileno()
        at, left = start, size
        while left:
            try:
                n = os.copy_file_range(src.fileno(), out, left, at)
            except OSError:  # a kernel or filesystem without it (EXDEV, ENOSYS, EINVAL): plain copy
                n = len(piece := os.pread(src.fileno(), min(left, 8 << 20), at))
                if n:
                    self.f.write(piece)
                    self.f.flush()
            if n <= 0:
                raise BootseerError(f"{path} shrank while being appended")
            at += n
            left -= n

    def settle(self) -> None:
        """Wait until every write so far is in the file itself (not only in this process's buffer),
        where another process may read it: a segment writer's report of what it wrote so far."""
        if self._last is not None:
            self._last.result()
        self._last = self._io.submit(self.f.flush)
        self._last.result()

    def flush(self) -> None:
        """Wait for every write so far (and raise its error)."""
        if self._last is not None:
            self._last.result()

    def close(self) -> str:
        """Flush, close; the sha256 of everything written."""
        self.flush()
        self._io.shutdown()
        self.f.close()
        return self.h.hexdigest() if self.h is not None else ""

    def abort(self) -> None:
        self._io.shutdown(cancel_futures=True)
        with contextlib.suppress(OSError):
            self.f.close()
