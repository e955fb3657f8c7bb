"""One deed walk per layout: every reader and writer of a Book log's deeds goes through
the :class:`Deeds` of its layout, :data:`UIP` or :data:`VERE`.

Both layouts frame an event alike, and differ only in what sits between the payload and
``let_d`` (the byte layouts are in ``layout.py``)::

    UIP   u64 len_d | payload | u32 crc | u64 let_d     20 bytes a deed; crc32(len_d ++ payload)
    vere  u64 len_d | payload | u64 let_d               16 bytes a deed; no CRC of its own
                                                        (a batch's CRC is in its header slot)

A deed is *sound* when ``len_d`` is the payload size the reader expects (the index's, or
the bytes left), ``let_d == len_d`` and, in the UIP layout, its CRC matches.  What each
walk checks:

* :meth:`Deeds.scan`: the framing scan of a file (``framing.py``), framing only; it builds
  the offset index.
* :meth:`Deeds.walk`: the deeds of bytes in memory (a segment), each one sound.
* :meth:`Deeds.read`: one deed of a file, sound, its payload in memory.
* :meth:`Deeds.verify`: the same in constant memory (the CRC streamed), no payload kept;
  :meth:`Deeds.verify_blocks` also takes a CRC per block of the payload (``seals.py``).
* :meth:`Deeds.spans` and :meth:`Deeds.length_at`: framing only, from ``len_d``/``let_d``.
* :meth:`Deeds.skip`: from deed to deed by ``len_d`` alone.
* :meth:`Deeds.write`: the deeds for payloads, in one ``pwritev`` or streamed.

A check that fails raises :class:`BadDeed` with where the deed starts and which check it
failed; the engines turn it into ``CorruptDeed`` with the event.  The compiled Spark row
builder (``spark/_rows.pyx``) walks UIP deeds too, a twin that ``tests/test_rows.py``
holds equal to :meth:`Deeds.walk`.  The checks of damaged UIP logs (the first bad CRC over
a range, valid deeds in a damaged region, the torn tail) are ``deedcheck.py``; vere's are
``vere_deeds.py``.
"""

from __future__ import annotations

import errno
import os
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from bookfs.formats.fileio import pwritev_all
from bookfs.formats.framing import scan_deeds
from bookfs.formats.layout import (
    DEED_LEN,
    DEED_TAIL,
    MIN_PAYLOAD,
    VERE_MIN_LEN,
    crc32,
)
from bookfs.types import Progress

_CRC_CHUNK = 8 << 20  # bytes per pread while a deed's CRC is streamed


class BadDeed(ValueError):
    """The deed at ``pos`` (of its file, or of the buffer walked) fails its ``what`` check
    (``"framing"`` or ``"CRC"``), ``detail`` saying how.  ``event`` is set by
    :meth:`Deeds.walk`, which knows it; the engines add theirs
    (``SingleFileLog._corrupt``)."""

    def __init__(self, pos: int, what: str, detail: str = "", event: int | None = None):
        self.pos, self.what, self.detail, self.event = pos, what, detail, event
        where = f"the deed at byte {pos}" if event is None else f"event {event} at byte {pos}"
        super().__init__(f"{where} fails its {what} check" + (f": {detail}" if detail else ""))


@dataclass(frozen=True)
class Deeds:
    """One layout's deed: its size, its checks, its walks and its writer."""

    #: the layout: ``uip`` or ``vere``
    name: str
    #: whether a CRC-32 of ``len_d ++ payload`` sits before ``let_d``
    crc: bool
    #: the smallest ``len_d`` a deed of this layout may announce
    min_len: int
    #: the bytes after the payload: ``(crc, let_d)`` (UIP) or ``(let_d,)`` (vere)
    trailer: struct.Struct

    #: bytes after the payload: the CRC (UIP only), then ``let_d``
    tail: int = field(init=False)
    #: bytes a deed adds to its payload: ``len_d``, then the tail
    overhead: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tail", self.trailer.size)
        object.__setattr__(self, "overhead", DEED_LEN.size + self.trailer.size)

    def size(self, n: int) -> int:
        """Bytes of a deed carrying ``n`` payload bytes."""
        return n + self.overhead

    def payload_size(self, start: int, stop: int) -> int:
        """Payload bytes of the deed that starts at ``start`` and ends at ``stop``."""
        return stop - start - self.overhead

    # --- checks ----------------------------------------------------------------------------

    def _bad(self, buf, pos: int, n: int) -> BadDeed | None:
        """Why the deed at ``pos`` of ``buf`` (a memoryview holding all of it; its
        ``len_d``, ``n``, already read) is not sound: its ``let_d``, then its CRC; None
        when it is."""
        stop = pos + 8 + n
        got = self.trailer.unpack_from(buf, stop)  # (crc, let_d) or (let_d,)
        if got[-1] != n:
            return BadDeed(pos, "framing", f"let_d is {got[-1]}, not len_d {n}")
        if self.crc and crc32(buf[pos:stop]) != got[0]:
            return BadDeed(pos, "CRC")
        return None

    def walk(self, buf, first: int, until: int | None = None
             ) -> Iterator[tuple[int, int, memoryview]]:
        """The deeds of the bytes ``buf`` (a memoryview whose first deed is event
        ``first``) as ``(event, position, payload)``, up to event ``until`` (every deed if
        None), each one sound.  Raises :class:`BadDeed` (with its event) at the first deed
        that is not, or that runs past ``buf``'s end."""
        pos, event, end = 0, first, len(buf)
        until = end if until is None else until
        unpack, over, bad = DEED_LEN.unpack_from, self.overhead, self._bad
        while pos < end and event <= until:
            if pos + over > end:
                raise BadDeed(pos, "framing", "a truncated deed", event)
            (n,) = unpack(buf, pos)
            stop = pos + n + over
            if stop > end:
                raise BadDeed(pos, "framing", f"it claims {n} bytes, past the end", event)
            why = bad(buf, pos, n)
            if why is not None:
                raise BadDeed(pos, why.what, why.detail, event)
            yield event, pos, buf[pos + 8 : pos + 8 + n]
            pos, event = stop, event + 1

    def read(self, fd: int, off: int, n: int) -> bytes:
        """The payload of the deed at ``off`` of the file ``fd``, which the index says
        carries ``n`` bytes, after checking that it is sound.  Holds the whole deed in
        memory (:meth:`verify` does not)."""
        buf = os.pread(fd, n + self.overhead, off)
        if len(buf) != n + self.overhead:
            raise BadDeed(off, "framing", "the deed runs past the end of the file")
        self._len_is(buf, n, off)
        why = self._bad(memoryview(buf), 0, n)
        if why is not None:
            raise BadDeed(off, why.what, why.detail)
        return buf[8 : 8 + n]

    def trailer_at(self, fd: int, off: int, n: int) -> tuple:
        """The trailer of the deed at ``off`` that carries ``n`` payload bytes, ``(crc,
        let_d)`` (UIP) or ``(let_d,)``, once its ``len_d`` and ``let_d`` are both ``n``.
        Raises :class:`BadDeed`."""
        self._len_is(os.pread(fd, 8, off), n, off)
        tail = os.pread(fd, self.tail, off + 8 + n)
        if len(tail) != self.tail:
            raise BadDeed(off, "framing", "the deed runs past the end of the file")
        got = self.trailer.unpack(tail)
        if got[-1] != n:
            raise BadDeed(off, "framing", f"let_d is {got[-1]}, not len_d {n}")
        return got

    def verify(self, fd: int, off: int, n: int) -> None:
        """:meth:`read`'s checks in constant memory: ``len_d`` and the trailer read alone,
        the CRC (UIP) streamed.  Raises :class:`BadDeed`."""
        got = self.trailer_at(fd, off, n)
        if self.crc and self._stream_crc(fd, off, off + 8 + n) != got[0]:
            raise BadDeed(off, "CRC")

    def verify_blocks(self, fd: int, off: int, n: int, block: int) -> tuple[int, array]:
        """:meth:`verify` of a deed of a layout with a CRC, taking in the same streamed
        pass the CRC-32 of each ``block`` bytes of its payload (the last one shorter):
        ``(the deed's CRC, the blocks' CRCs)``.  Raises :class:`BadDeed`."""
        stored = self.trailer_at(fd, off, n)[0]
        crc, sums, pos = crc32(DEED_LEN.pack(n)), array("I"), 0
        step = max(block, _CRC_CHUNK - _CRC_CHUNK % block)
        while pos < n:
            chunk = self.payload_at(fd, off, min(step, n - pos), pos)
            if not chunk:
                raise BadDeed(off, "framing", "the deed runs past the end of the file")
            crc = crc32(chunk, crc)
            view = memoryview(chunk)
            sums.extend(crc32(view[k : k + block]) for k in range(0, len(view), block))
            pos += len(chunk)
        if crc != stored:
            raise BadDeed(off, "CRC")
        return crc, sums

    def sound(self, fd: int, off: int, n: int) -> bool:
        """Whether the deed at ``off`` with ``n`` payload bytes is sound (:meth:`verify`)."""
        try:
            self.verify(fd, off, n)
        except BadDeed:
            return False
        return True

    @staticmethod
    def _stream_crc(fd: int, start: int, stop: int) -> int | None:
        crc, pos = 0, start
        while pos < stop:
            chunk = os.pread(fd, min(_CRC_CHUNK, stop - pos), pos)
            if not chunk:
                return None
            crc = crc32(chunk, crc)
            pos += len(chunk)
        return crc

    @staticmethod
    def _len_is(head: bytes, n: int, off: int) -> None:
        """``head`` (a deed's bytes from its start) must begin with ``len_d == n``."""
        if len(head) < 8 or DEED_LEN.unpack_from(head)[0] != n:
            raise BadDeed(off, "framing", f"len_d is not the indexed {n} bytes")

    def check_len(self, fd: int, off: int, n: int) -> None:
        """The deed at ``off`` must announce the ``n`` payload bytes the index gives it (a
        read of part of a payload checks this much): :class:`BadDeed` if not."""
        self._len_is(os.pread(fd, 8, off), n, off)

    @staticmethod
    def payload_at(fd: int, off: int, n: int, skip: int = 0) -> bytes:
        """``n`` bytes of the payload of the deed at ``off``, from its byte ``skip``,
        **unchecked**: for a caller that has checked the deed (:meth:`verify`) or that
        checks the payload itself (a salvage)."""
        return os.pread(fd, n, off + 8 + skip)

    def length_at(self, fd: int, off: int) -> int | None:
        """The ``len_d`` of the deed at ``off``, None where the file ends first."""
        head = os.pread(fd, 8, off)
        return DEED_LEN.unpack(head)[0] if len(head) == 8 else None

    def tail_before(self, fd: int, end: int) -> bytes:
        """The trailer (CRC and ``let_d``) of the deed that ends at ``end``: a fingerprint
        of a log's last deed, which changes if that deed is rewritten."""
        return os.pread(fd, self.tail, end - self.tail)

    def spans(self, fd: int, off: int, stop: int) -> str | None:
        """Why the deed at ``off`` does not span exactly to ``stop`` by its framing
        (``len_d`` and ``let_d``), or None when it does."""
        n = self.length_at(fd, off)
        if n is None or n + self.overhead != stop - off:
            return "len_d does not match the log"
        let = os.pread(fd, 8, stop - 8)
        if len(let) != 8 or DEED_LEN.unpack(let)[0] != n:
            return "let_d does not match the log"
        return None

    def skip(self, fd: int, pos: int, count: int, size: int) -> int:
        """The offset ``count`` deeds after ``pos`` in the file ``fd`` of ``size`` bytes,
        reading only each deed's ``len_d``.  :class:`BadDeed` where a deed is truncated or
        runs past ``size``."""
        for _ in range(count):
            n = self.length_at(fd, pos)
            if n is None:
                raise BadDeed(pos, "framing", "a truncated deed")
            if pos + n + self.overhead > size:
                raise BadDeed(pos, "framing", "the deed runs past the end")
            pos += n + self.overhead
        return pos

    # --- the framing scan ------------------------------------------------------------------

    def scan(self, fd: int, index, size: int, *, limit: int | None = None,
             min_len: int | None = None, progress: Progress | None = None) -> int:
        """Extend ``index`` with the deeds whose framing is sound, from ``index.end`` up to
        ``size`` (at most ``limit`` deeds in all): :func:`~bookfs.formats.framing.scan_deeds`
        for this layout.  ``min_len``: vere's fsck lowers it to 0 where a batch CRC is to
        decide (16 zero bytes frame a 0-byte deed).  Returns where the scan stopped."""
        return scan_deeds(fd, index, size, trailer=self.tail - 8,
                          min_len=self.min_len if min_len is None else min_len,
                          limit=limit, progress=progress)

    # --- writing ---------------------------------------------------------------------------

    def parts(self, payload) -> tuple[bytes, bytes]:
        """The bytes before and after ``payload`` in its deed, for vectored writes."""
        n = len(payload)
        head = DEED_LEN.pack(n)
        if not self.crc:
            return head, head
        return head, DEED_TAIL.pack(crc32(payload, crc32(head)), n)

    def encode(self, payload) -> bytes:
        """The bytes of one deed carrying ``payload``."""
        head, tail = self.parts(payload)
        return b"".join((head, payload, tail))

    def write(self, fd: int, payloads: list, start: int) -> int | None:
        """Write the deeds for ``payloads`` at ``start`` of ``fd``: one ``pwritev`` for a
        batch of in-memory payloads; a payload too large to hold in memory (a ``Blob``,
        ``book.py``: ``len()`` and ``chunks()``) is streamed once, in bounded chunks, its
        CRC computed over exactly the bytes written.  One that yields another number of
        bytes than it announced (it changed while saved) raises ``OSError(EIO)``; the caller
        undoes the write, so a length field never disagrees with the bytes after it.
        Returns, for a layout without deed CRCs (vere), the crc32 of every byte written
        (the batch's ``sum``); None for the UIP layout."""
        bufs: list = []
        total = None if self.crc else 0  # vere: crc32 of every deed byte written
        off = start
        for p in payloads:
            if isinstance(p, (bytes, bytearray, memoryview)):
                head, tail = self.parts(p)
                bufs += (head, p, tail)
                if total is not None:
                    total = crc32(tail, crc32(p, crc32(head, total)))
                continue
            off = pwritev_all(fd, bufs, off)
            bufs = []
            off, total = self._stream(fd, p, off, total)
        pwritev_all(fd, bufs, off)
        return total

    def _stream(self, fd: int, blob, off: int, total: int | None) -> tuple[int, int | None]:
        """Write one blob's deed at ``off`` in bounded chunks (:meth:`write`)."""
        n = len(blob)
        head = DEED_LEN.pack(n)
        crc = crc32(head, total or 0)  # the deed's CRC (UIP) or the batch's so far (vere)
        off = pwritev_all(fd, [head], off)
        got = 0
        for chunk in blob.chunks():
            got += len(chunk)
            if got > n:
                break
            crc = crc32(chunk, crc)
            off = pwritev_all(fd, [chunk], off)
        if got != n:
            raise OSError(errno.EIO, f"payload changed size while saved ({n} -> {got} "
                                     "bytes); nothing saved")
        if total is None:
            return pwritev_all(fd, [DEED_TAIL.pack(crc, n)], off), None
        return pwritev_all(fd, [head], off), crc32(head, crc)


#: the UIP layout's deed (``book.log``; engine ``book.py``)
UIP = Deeds("uip", crc=True, min_len=MIN_PAYLOAD, trailer=DEED_TAIL)
#: vere's two-slot layout's deed (engine ``vere.py``)
VERE = Deeds("vere", crc=False, min_len=VERE_MIN_LEN, trailer=DEED_LEN)
