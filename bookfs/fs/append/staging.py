"""Buffers for files being written through the mount (``new/<N>``, ``meta/<key>``).

Writes may arrive at any offset, in any order.  A buffer keeps up to ``spill`` bytes in
memory and moves to an unlinked temporary file beyond that (a write or a truncate past
``spill``), so the daemon's memory does not grow with event size, and a truncate to 1 GiB
costs a sparse file, not 1 GiB of memory.  Holes read as zeros, as in a sparse file.

Which bytes were written (issue 33, item 2): a buffer keeps the ranges its writes covered
(:class:`Written`, a few ``[start, end)`` pairs: one for a file written in order), so its
owner can refuse bytes nobody wrote.  A truncate keeps the written bytes below the new
size and adds none: extending a file (``ftruncate`` up, a ``pwrite`` or ``lseek`` past
the end) leaves a hole, and :meth:`Staging.first_hole` names the first one.  The set is
bounded: a write that would leave more than :data:`MAX_RANGES` separate written ranges at
once (a writer scattering small pieces with gaps between them) fails with EINVAL
(:class:`Fragmented`) and poisons the file; nothing of it is saved.

Once a buffer is handed to the engine for saving it is **frozen**: a later write or
truncate raises :class:`StagingFrozen`, so the bytes being saved are an immutable snapshot
(a buffer written while it is saved must never reach the disk).

What an event's bytes must be (issue 21) is decided by :mod:`bookfs.noun.payload`, which
``new/`` (``nodes/new.py``) feeds as a file is written.
"""

from __future__ import annotations

import errno as _errno
import os
import tempfile
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from bookfs.errors import BookError, PayloadTooLarge

SPILL_BYTES = 1 << 20  # payloads above this are staged on disk
CHUNK = 1 << 20  # bytes per chunk when a spilled payload is streamed back
#: separate written ranges a buffer keeps track of at once (:class:`Written`): about
#: 100 KiB at most per file, whatever its size
MAX_RANGES = 1024


class StagingFrozen(BookError):
    """A write to a buffer that is being (or has been) committed."""

    errno = _errno.EBADF  # the file is no longer open for writing


class Fragmented(BookError):
    """A write that would leave more than :data:`MAX_RANGES` separate written ranges."""

    errno = _errno.EINVAL


class Written:
    """The byte ranges written so far: disjoint, non-adjacent, sorted ``[start, end)``
    pairs (two lists), merged as writes touch or overlap them.  A file written in order
    is one range; a write that extends the last range costs O(1), any other
    O(log n + n) with n at most :data:`MAX_RANGES`."""

    __slots__ = ("ends", "limit", "starts")

    def __init__(self, limit: int = MAX_RANGES):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.limit = limit

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, start: int, end: int) -> None:
        """Note ``[start, end)`` as written.  Raises :class:`Fragmented` (and notes
        nothing) if that would make more than ``limit`` separate ranges."""
        if start >= end:
            return
        starts, ends = self.starts, self.ends
        if starts and starts[-1] <= start <= ends[-1]:  # the usual case: in order
            ends[-1] = max(ends[-1], end)
            return
        i = bisect_left(ends, start)  # the first range that ends at or after start
        j = bisect_right(starts, end)  # ranges before j start at or before end
        if i == j:  # touches none: a range of its own
            if len(starts) >= self.limit:
                raise Fragmented(f"a write of {end - start:,} bytes at byte {start:,} "
                                 f"would leave more than {self.limit:,} separate written "
                                 "ranges (gaps between them); write the file in order")
            starts.insert(i, start)
            ends.insert(i, end)
            return
        starts[i:j] = [min(start, starts[i])]
        ends[i:j] = [max(end, ends[j - 1])]

    def clip(self, size: int) -> None:
        """Forget what lies at or past ``size`` (a truncate)."""
        starts, ends = self.starts, self.ends
        k = bisect_left(starts, size)  # ranges from k on start at or past size
        del starts[k:], ends[k:]
        if ends and ends[-1] > size:
            ends[-1] = size

    def first_hole(self, size: int) -> tuple[int, int] | None:
        """``(start, end)`` of the first bytes below ``size`` that were never written, or
        None if every byte of ``[0, size)`` was."""
        starts, ends = self.starts, self.ends
        if size <= 0:
            return None
        if not starts or starts[0] > 0:
            return 0, min(size, starts[0]) if starts else size
        if ends[0] >= size:
            return None
        return ends[0], min(size, starts[1]) if len(starts) > 1 else size

    def holes(self, size: int) -> int:
        """How many separate holes lie below ``size`` (the ranges lie below it)."""
        if size <= 0:
            return 0
        if not self.starts:
            return 1
        return (self.starts[0] > 0) + len(self.starts) - 1 + (self.ends[-1] < size)


class Staging:
    """The bytes written so far to one file.  Implements the engine's ``Blob`` protocol
    (``len`` and ``chunks``) so a spilled payload is committed without loading it."""

    def __init__(self, limit: int, spill_dir: str | None = None, spill: int = SPILL_BYTES):
        self.limit = limit
        self._spill_at = spill
        self._spill_dir = spill_dir
        self._mem: bytearray | None = bytearray()
        self._fd: int | None = None
        self._size = 0
        self.frozen = False
        self.written = Written()  # which bytes a write covered (issue 33, item 2)

    def __len__(self) -> int:
        return self._size

    @property
    def spilled(self) -> bool:
        return self._fd is not None

    def write(self, off: int, data: bytes) -> int:
        """Write ``data`` at ``off``.  Raises :class:`PayloadTooLarge` (EFBIG) past
        ``limit``, :class:`Fragmented` (EINVAL) for a write that would leave too many
        separate written ranges (:class:`Written`); either way nothing is written."""
        end = off + len(data)
        if self.frozen:
            raise StagingFrozen(f"write of {len(data)} bytes at {off} after the file was "
                                "committed")
        if end > self.limit:
            raise PayloadTooLarge(f"write to byte {end}: over the {self.limit}-byte limit")
        self.written.add(off, end)
        if self._fd is None and end > self._spill_at:
            self._spill()
        if self._fd is None:
            mem = self._mem
            if off > len(mem):
                mem.extend(bytes(off - len(mem)))
            mem[off:end] = data
        else:
            view = memoryview(data)
            while view:
                k = os.pwrite(self._fd, view, off)
                off += k
                view = view[k:]
        self._size = max(self._size, end)
        return len(data)

    def truncate(self, size: int) -> None:
        if size > self.limit:
            raise PayloadTooLarge(f"truncate to {size}: over the {self.limit}-byte limit")
        if self.frozen:
            raise StagingFrozen(f"truncate to {size} after the file was committed")
        if self._fd is None and size > self._spill_at:
            self._spill()
        if self._fd is None:
            if size < len(self._mem):
                del self._mem[size:]
            else:
                self._mem.extend(bytes(size - len(self._mem)))
        else:
            os.ftruncate(self._fd, size)
        self._size = size
        self.written.clip(size)

    def first_hole(self) -> tuple[int, int] | None:
        """``(start, end)`` of the first bytes of the buffer that no write covered (a
        ``pwrite`` or ``lseek`` past the end, a gap between writes, a truncate up), or
        None if every byte was written."""
        return self.written.first_hole(self._size)

    def _spill(self) -> None:
        fd, path = tempfile.mkstemp(prefix="bookfs-staging-", dir=self._spill_dir)
        os.unlink(path)
        os.write(fd, self._mem)
        self._fd, self._mem = fd, None

    def freeze(self) -> None:
        """Refuse every later write and truncate (the buffer is being committed)."""
        self.frozen = True

    def getvalue(self) -> bytes:
        """All the bytes (only sensible for small buffers: meta fields, small events)."""
        if self._fd is None:
            return bytes(self._mem)
        return b"".join(self.chunks())

    def read(self, off: int, size: int) -> bytes:
        """``size`` bytes from ``off`` (fewer at the end; holes read as zeros).  May run
        in another thread than the writes (the payload check): a buffer that spills
        meanwhile is read from its old memory, which then no longer changes."""
        size = max(0, min(size, self._size - off))
        mem = self._mem
        if mem is not None:
            return bytes(mem[off:off + size])
        out = bytearray()
        while len(out) < size:
            chunk = os.pread(self._fd, size - len(out), off + len(out))
            if not chunk:
                out.extend(bytes(size - len(out)))  # a sparse tail (a truncate up)
                break
            out += chunk
        return bytes(out)

    def payload(self):
        """What to hand to ``Book.save``: the bytes themselves when small, else ``self``."""
        return bytes(self._mem) if self._fd is None else self

    def chunks(self) -> Iterator[bytes]:
        if self._fd is None:
            yield bytes(self._mem)
            return
        off = 0
        while off < self._size:
            chunk = os.pread(self._fd, min(CHUNK, self._size - off), off)
            if not chunk:  # the temp file cannot shrink under us (it is unlinked)
                raise OSError(5, "staging file shorter than written")
            yield chunk
            off += len(chunk)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._mem = None
