"""Seals: a CRC per block of a large deed's payload, so that a read checks only what it serves.

A UIP deed has one CRC, over ``len_d`` and its whole payload (``layout.py``).  No byte of
a payload may be served before that CRC holds, so without more, the first read of a
256 MiB event waits until all 256 MiB are read and checked, and only then is the first
block handed to the reader: a cold read pays the disk and then the transfer, one after
the other.

A *seal* is made once, while the whole deed's CRC is checked (:func:`seal_deed`, one
streamed pass): besides the deed's CRC it records the CRC-32 of every :data:`BLOCK` of
the payload.  That check is a deed's first read, a ``bookfs verify`` of its log
(``deedcheck.first_bad_deed``, its forked workers' seals sent back), or, for an event
appended through a mount, a pass right after its commit (``fs/nodes/events.py``).  From
then on a read of any range is served after the blocks that cover it pass their own CRCs
(:func:`read_sealed`): the disk read and the transfer overlap, and a block that rotted on
disk since the seal was made is refused, not served.

When a seal may be used.  A seal speaks of one deed: its offset, its payload size and the
CRC the deed stores.  :func:`still_holds` re-reads ``len_d`` and the deed's trailer (two
small ``pread``\\ s) and compares all three, so a seal kept from an earlier open is used
only for the deed it was made from; a log rewritten in place with other bytes under the
same CRC and size (a 2^-32 chance, as for the deed's own check) fails at its first
block instead, and the caller then checks the whole deed again (:class:`SealBroken`).

What a read costs.  A read is served from whole blocks: one of a few KiB reads and checks
the 128 KiB around it (a ``pread`` from the page cache and a CRC, some tens of
microseconds), one of 1 MiB the eight blocks it covers.

Where seals live.  In memory, a seal is 4 bytes per :data:`BLOCK` (32 bytes per MiB of
payload: 8 KiB for a 256 MiB event).  Only deeds of at least :data:`SEALED_FROM` payload
bytes get one: below that the whole deed is read in a few milliseconds.  A log's seals
are persisted beside its index in the cache directory (:class:`SealStore`, a card file of
``index.py``: private directory, atomic replace, its own CRC, pruned with the indexes),
the newest within :data:`KEEP` bytes of CRCs, so a new mount's cold read of a large event
sealed before is served block by block from its first byte.  With the index cache off,
nothing is read or written, and each open seals a deed at its first read.

Layout of the persisted seals (little-endian)::

    head    : 4s "SEAL" | u32 BLOCK
    record  : u64 event | u64 deed offset | u64 payload size | u32 deed CRC | u32 blocks
              | blocks * u32 CRC-32 of each BLOCK of the payload (the last one shorter)
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
from array import array
from dataclasses import dataclass

from bookfs.errors import BookError
from bookfs.formats import index as ix
from bookfs.formats.deeds import BadDeed, Deeds
from bookfs.formats.layout import crc32

log = logging.getLogger(__name__)

BLOCK = 128 << 10  # payload bytes per block CRC: the kernel's default readahead
SEALED_FROM = 8 << 20  # payloads from this size are sealed
KEEP = 1 << 20  # bytes of block CRCs persisted (and held) per log: the newest seals'
# (32 GiB of sealed deeds; at most 4,096 seals, each of 256 bytes or more)
_HEAD = struct.Struct("<4sI")
_RECORD = struct.Struct("<QQQII")
_MAGIC = b"SEAL"


class SealBroken(BookError):
    """A block failed its seal's CRC: the deed is corrupt, or the seal is older than the
    bytes now at its place.  Nothing of the read is served; the caller checks the whole
    deed again (:func:`seal_deed`), which tells the two apart."""


@dataclass(frozen=True)
class Seal:
    """The CRCs of one deed (at ``off``, ``n`` payload bytes, its own CRC ``crc``) and of
    each :data:`BLOCK` of its payload (``sums``)."""

    off: int
    n: int
    crc: int
    sums: array

    def blocks(self, start: int, size: int) -> range:
        """The blocks a read of ``size`` payload bytes from ``start`` covers."""
        stop = min(self.n, start + size)
        return range(start // BLOCK, (stop + BLOCK - 1) // BLOCK) if stop > start else range(0)


def seal_deed(fd: int, off: int, n: int, deeds: Deeds) -> Seal:
    """Check the deed at ``off`` (``n`` payload bytes) as :meth:`Deeds.verify` does, in
    one streamed pass that also takes each block's CRC (:meth:`Deeds.verify_blocks`):
    constant memory.  Raises :class:`BadDeed`."""
    crc, sums = deeds.verify_blocks(fd, off, n, BLOCK)
    return Seal(off, n, crc, sums)


def still_holds(fd: int, seal: Seal, off: int, n: int, deeds: Deeds) -> bool:
    """Whether ``seal`` was made from the deed that is at ``off`` now: the same place and
    size, and the deed still stores the CRC it had (``len_d`` and the trailer re-read)."""
    if (seal.off, seal.n) != (off, n) or len(seal.sums) != -(-n // BLOCK):
        return False
    try:
        return deeds.trailer_at(fd, off, n) == (seal.crc, n)
    except BadDeed:
        return False


def read_sealed(fd: int, seal: Seal, start: int, size: int, deeds: Deeds) -> bytes:
    """Up to ``size`` bytes of the sealed deed's payload from ``start``, read with the
    blocks that cover them (one ``pread``) and served only if each block passes its CRC;
    :class:`SealBroken` if one does not."""
    blocks = seal.blocks(start, size)
    if not blocks:
        return b""
    first = blocks.start * BLOCK
    buf = deeds.payload_at(fd, seal.off, min(seal.n, blocks.stop * BLOCK) - first, first)
    view = memoryview(buf)
    for k in blocks:
        if crc32(view[k * BLOCK - first : (k + 1) * BLOCK - first]) != seal.sums[k]:
            raise SealBroken(f"block {k} of the deed at byte {seal.off} fails its CRC")
    if start == first and len(buf) <= size:
        return buf
    return bytes(view[start - first : start - first + min(size, seal.n - start)])


class Sealer:
    """The seals of one log's deeds of layout ``deeds``: :meth:`seal` makes them, keeping
    them in the :class:`SealStore` of the file open now."""

    def __init__(self, deeds: Deeds):
        self.deeds = deeds
        self._store: SealStore | None = None
        self._lock = threading.Lock()  # the store's; a mount seals in worker threads

    def seal(self, fd: int, log_path: str, event: int, off: int, n: int, *,
             fresh: bool = False) -> Seal | None:
        """Check the deed of ``event`` at ``off`` (``n`` payload bytes) and give its seal:
        the kept one if it still holds (:func:`still_holds`; not if ``fresh``), else one
        made now (:func:`seal_deed`) and kept.  None, the deed checked whole, where there
        is none to make: a layout with no CRC per deed, a payload under
        :data:`SEALED_FROM`.  Raises :class:`BadDeed`."""
        if not self.deeds.crc or n < SEALED_FROM:
            self.deeds.verify(fd, off, n)
            return None
        st = os.fstat(fd)
        with self._lock:
            store = self._store_of(log_path, st)
            kept = store.get(event)
        if not fresh and kept is not None and still_holds(fd, kept, off, n, self.deeds):
            return kept
        try:
            made = seal_deed(fd, off, n, self.deeds)
        except BadDeed:
            with self._lock:
                store.forget(event)  # a damaged deed keeps no seal: no read is served
            raise
        if made != kept:  # (a whole check that found what was kept writes nothing)
            with self._lock:
                store.put([(event, made)])
        return made

    def keep(self, fd: int, log_path: str, made: list[tuple[int, Seal]]) -> None:
        """Keep the seals ``(event, seal)`` a check of the whole log made
        (``deedcheck.first_bad_deed``), in one write of the store."""
        if made:
            with self._lock:
                self._store_of(log_path, os.fstat(fd)).put(made)

    def _store_of(self, log_path: str, st: os.stat_result) -> SealStore:
        store = self._store
        if store is None or (store.st.st_dev, store.st.st_ino) != (st.st_dev, st.st_ino):
            store = self._store = SealStore(log_path, st)
        return store


def _le(sums: array) -> array:
    """``sums`` as the file holds them (little-endian), or back (the swap is its own
    inverse); ``array('I')`` is 4 bytes on every platform bookfs runs on."""
    if sys.byteorder != "little":
        sums = array("I", sums)
        sums.byteswap()
    return sums


class SealStore:
    """The persisted seals of one log file (``log_path``; ``st``, its ``stat``, names it
    as its index is named), read at the first :meth:`get` and rewritten whole by each
    :meth:`put`.  Never raises for the store's sake: a store that cannot be read is
    empty, and one that cannot be written is logged (a seal is only a cache)."""

    def __init__(self, log_path: str, st: os.stat_result):
        self.log_path, self.st = log_path, st
        self._seals: dict[int, Seal] | None = None

    def get(self, event: int) -> Seal | None:
        if self._seals is None:
            self._seals = self._load()
        return self._seals.get(event)

    def put(self, made: list[tuple[int, Seal]]) -> None:
        """Keep the seals ``(event, seal)``, newest last, and write the store once."""
        if self._seals is None:
            self._seals = self._load()
        for event, seal in made:
            self._seals.pop(event, None)
            self._seals[event] = seal
        held = sum(len(s.sums) for s in self._seals.values()) * 4
        while held > KEEP and len(self._seals) > 1:
            held -= 4 * len(self._seals.pop(next(iter(self._seals))).sums)
        self._save()

    def forget(self, event: int) -> None:
        if self.get(event) is not None:
            del self._seals[event]
            self._save()

    def _save(self) -> None:
        body = [_HEAD.pack(_MAGIC, BLOCK)]
        for e, s in self._seals.items():
            body += [_RECORD.pack(e, s.off, s.n, s.crc, len(s.sums)), _le(s.sums).tobytes()]
        ix.save_card_file(self.log_path, self.st, b"".join(body), kind="sums")

    def _load(self) -> dict[int, Seal]:
        raw = ix.read_card_file(self.log_path, self.st, kind="sums")
        seals: dict[int, Seal] = {}
        if raw is None or len(raw) < _HEAD.size or _HEAD.unpack_from(raw) != (_MAGIC, BLOCK):
            return seals
        pos = _HEAD.size
        while pos + _RECORD.size <= len(raw):
            event, off, n, crc, count = _RECORD.unpack_from(raw, pos)
            pos += _RECORD.size
            chunk = raw[pos : pos + 4 * count]
            pos += 4 * count
            if len(chunk) != 4 * count:
                log.warning("the seals of %s end early: ignored from there", self.log_path)
                break
            seals[event] = Seal(off, n, crc, _le(array("I", chunk)))
        return seals
