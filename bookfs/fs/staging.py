"""Buffers for files being written through the mount (``new/<N>``, ``meta/<key>``).

Writes may arrive at any offset, in any order.  A buffer keeps up to ``spill`` bytes in
memory and moves to an unlinked temporary file beyond that (a write or a truncate past
``spill``), so the daemon's memory does not grow with event size, and a truncate to 1 GiB
costs a sparse file, not 1 GiB of memory.  Holes read as zeros, as in a sparse file.

Once a buffer is handed to the engine for saving it is **frozen**: a later write or
truncate raises :class:`StagingFrozen`, so the bytes being saved are an immutable snapshot
(a buffer written while it is saved must never reach the disk).

What an event's bytes must be (issue 21) is :class:`PayloadCheck`'s: fed the payload in
order, in chunks of any size, it says whether it is a 4-byte mug followed by a jam that
cues completely and exactly, or by vere's ram encoding (``"RAM\\0"``, version 1: see
:mod:`bookfs.noun.ram`), and if not, why, naming the byte where parsing failed.  The
stored mug is not compared with anything: it is the mug of Arvo's state after the event
(reference-formats.md §4; vere's ``mars.c``), which only a replay can check.  ``new/`` (``nodes/new.py``) feeds it as a file is
written and ``bookfs append`` before it writes a file.
"""

from __future__ import annotations

import errno as _errno
import os
import re
import tempfile
from collections.abc import Iterator

from bookfs.errors import BookError, PayloadTooLarge
from bookfs.noun import CueError, Scanner

try:  # vere's second encoding (ml/bob): checked when its decoder is here
    from bookfs.noun import ram as _ram
except ImportError:  # pragma: no cover - the module is part of bookfs
    _ram = None

SPILL_BYTES = 1 << 20  # payloads above this are staged on disk
CHUNK = 1 << 20  # bytes per chunk when a spilled payload is streamed back


class StagingFrozen(BookError):
    """A write to a buffer that is being (or has been) committed."""

    errno = _errno.EBADF  # the file is no longer open for writing


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

    def __len__(self) -> int:
        return self._size

    @property
    def spilled(self) -> bool:
        return self._fd is not None

    def write(self, off: int, data: bytes) -> int:
        """Write ``data`` at ``off``.  Raises :class:`PayloadTooLarge` (EFBIG) past ``limit``."""
        end = off + len(data)
        if self.frozen:
            raise StagingFrozen(f"write of {len(data)} bytes at {off} after the file was "
                                "committed")
        if end > self.limit:
            raise PayloadTooLarge(f"write to byte {end}: over the {self.limit}-byte limit")
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


# --- what an event payload must be ---------------------------------------------------------

MUG_BYTES = 4
RAM_HEADER = b"RAM\x00\x01"  # bookfs.noun.ram.RAM_HEADER: U3S_RAM_MAGIC, then version 1
_HEAD = MUG_BYTES + len(RAM_HEADER)  # bytes read before the encoding is known


class PayloadCheck:
    """Whether the bytes :meth:`feed` in order are an event payload, as DESIGN.md has it:
    a 4-byte mug (little-endian) followed by

    * a jam that cues completely and exactly (:class:`bookfs.noun.Scanner` with
      ``exact=True``: nothing after the noun, not even a non-zero bit in its last byte),
      scanned as it is fed, without building the noun or holding its bytes; or
    * vere's ram encoding, when bytes 4..8 are ``"RAM\\0"`` and version 1: held, and
      decoded whole by :func:`bookfs.noun.ram.ram_decode` (``exact=True``) at
      :meth:`finish`, a bob atom counting as the reference it is;

    whatever the stored mug (Arvo's state's, after the event: only a replay can check it).

    :meth:`finish` gives None for a payload that is all of that, else ``(offset, reason)``:
    the byte of the payload (counting the mug's 4) where parsing failed, and one line
    that says what is wrong.  Not thread-safe: one feeder at a time."""

    def __init__(self) -> None:
        self.size = 0  # bytes fed
        self._head = bytearray()  # the first bytes, until the encoding is known
        self._scanner = None
        self._ram: bytearray | None = None
        self._verdict: tuple[int, str] | None | bool = False  # False: not finished

    def feed(self, chunk: bytes | bytearray | memoryview) -> bool:
        """The payload's next bytes; False once it is certainly refused."""
        if self._verdict is not False:
            raise ValueError("feed() after finish()")
        n = len(chunk)
        if not n:
            return True
        self.size += n
        if self._scanner is None and self._ram is None:
            need = _HEAD - len(self._head)
            self._head += chunk[:need]
            if len(self._head) < _HEAD:
                return True
            self._start()
            if n <= need:
                return self._scanner is None or self._scanner.result is None
            chunk = memoryview(chunk)[need:]
        if self._ram is not None:
            self._ram += chunk
            return True
        return self._scanner.feed(chunk)

    def _start(self) -> None:
        head = bytes(self._head)
        if head[MUG_BYTES:_HEAD] == RAM_HEADER and _ram is not None:
            self._ram = bytearray(head[MUG_BYTES:])
        else:
            self._scanner = Scanner(exact=True)
            self._scanner.feed(head[MUG_BYTES:])

    def finish(self) -> tuple[int, str] | None:
        """None if the payload fed is an event's, else ``(offset, reason)``."""
        if self._verdict is False:
            self._verdict = self._judge()
        return self._verdict  # type: ignore[return-value]

    def _judge(self) -> tuple[int, str] | None:
        if self.size < MUG_BYTES:
            return self.size, (f"{self.size} bytes, expected at least {MUG_BYTES} (a "
                               f"{MUG_BYTES}-byte mug, then the jam)")
        if self._scanner is None and self._ram is None:
            self._start()
        if self._ram is not None:
            return self._judge_ram()
        res = self._scanner.finish()
        if not res.ok:
            at = MUG_BYTES + res.byte
            return at, (f"not a mug and a jam: parsing failed at byte {at} (bit {res.bit} "
                        f"of the jam, which starts at byte {MUG_BYTES}): {res.message}")
        return None

    def _judge_ram(self) -> tuple[int, str] | None:
        data, self._ram = bytes(self._ram), None
        try:
            _ram.ram_decode(data, None, exact=True)
        except CueError as e:
            # ram_decode names the bit where it failed first, counted from the end of
            # the ram header (the origin of its back-references)
            m = re.search(r"\bbit (\d+)", str(e))
            at = MUG_BYTES + len(RAM_HEADER) + (int(m.group(1)) >> 3 if m else 0)
            return at, (f"not a mug and a ram encoding: parsing failed at byte {at}: "
                        f"{' '.join(str(e).split())}")
        return None


def check_payload_file(path: str, chunk: int = CHUNK) -> tuple[int, str] | None:
    """:class:`PayloadCheck` of the file at ``path``, read in ``chunk``-byte pieces
    (``OSError`` if it cannot be read)."""
    check = PayloadCheck()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            if not check.feed(block):
                break  # refused: the rest cannot change that
    return check.finish()
