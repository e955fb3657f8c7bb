"""The vere layout: one append-only event log as vere's ``ml/book`` branch writes it.

A vere Book is a directory (an epoch, named ``0i<N>``) holding ``book.log`` and ``meta.bin``.
The layout is reference-formats.md §2, byte for byte (constants in ``layout.py``)::

    slot A at 0, slot B at 4096, each 48 B:
      u32 magic | u32 version 1 | u64 fir_d | u64 las_d | u64 seq_d | u64 bat | u32 sum | u32 crc
    bytes 48..4095 and 4144..8191 are zero; deeds start at 8192
    deed : u64 len_d | len_d B payload (mug ++ jam) | u64 let_d       (len_d + 16 B, no CRC)
    sum  : crc32 of the last batch's on-disk deed bytes, concatenated
    crc  : crc32(slot bytes 0..43)

``fir_d`` is the epoch base (the event before this file), so the first event stored is
``fir_d + 1``; ``las_d`` is the last committed event (``fir_d`` when empty).  The header slot
is the commit point: deeds past the newest valid header's ``las_d`` are not committed.
This module knows nothing of FUSE, trio or Spark.

Contract (the same as :class:`bookfs.formats.book.Book`'s, where the format allows)
---------------------------------------------------------------------------
* **Readers** (``writable=False``) take no lock and never modify any file.  They see only
  committed events: those up to ``las_d`` of a header slot whose CRC holds and whose last
  batch checks (every deed's framing holds and the batch CRC ``sum`` matches).
* **What reads verify.**  vere deeds carry no CRC, so per event only the *framing* can be
  checked: ``read`` and ``verify_event`` check that ``len_d`` at the deed's start and
  ``let_d`` at its end both equal the size the index holds (a cut file, shifted or
  overwritten framing are caught).  Events of the *newest batch* (the ``bat`` deeds the
  committed header vouches for) also have that batch's CRC recomputed on every read when
  the batch is at most ``BATCH_RECHECK_LIMIT`` bytes (cheap); larger batches are checked
  once, when they are committed, opened or picked up by ``refresh``.  Older events were
  framing-checked when indexed, and their batch CRCs no longer exist on disk: a bit flip
  inside an old payload cannot be detected by this format.
* **One writer** (``writable=True``) holds an exclusive lock on ``book.lock`` in the
  directory (``lock.py``); ``lock=False`` skips it for a caller that already holds the
  pier's lock (``.vere.lock``).  A second writer is refused with :class:`LockHeld`.
* **Durability**: each ``save`` writes its whole batch of deeds with one ``pwritev`` at the
  append offset (a payload too large to hold in memory is streamed), then the header
  (``seq_d + 1``, new ``las_d``, ``bat``, ``sum``) into the *inactive* slot, then calls one
  ``fdatasync``.  A failed write or sync (ENOSPC, EIO) is undone by cutting the file back
  and rewriting the inactive slot's old bytes, so both slots and the file are as before.
* **Recovery** (reference-formats.md §2, DESIGN.md's "recovery must not destroy
  evidence"; the case-by-case table against the reference is in ``docs/format.md``): take
  the valid slot with the higher ``seq_d`` (tie: slot A) and check its last batch.  If it
  checks, its ``las_d`` is the committed end.  If not, that save was never acknowledged
  and its batch is rolled back; every earlier deed whose framing holds is kept (they were
  acknowledged), up to the first that does not frame.  Bytes past the kept deeds are cut
  only when they are a torn tail (an incomplete final deed that no header claims);
  anything more (a whole uncommitted deed, any part of a rolled-back batch, the rest of a
  damaged region) is first copied to a quarantine file beside the log.  A writable open
  that rolled back rewrites a slot so the next open agrees; a read-only open modifies
  nothing and reports the bytes it ignored.  A writable open of a file shorter than the
  8192-byte header region is refused (``TooShort``), never grown: ``bookfs fsck --repair``
  rebuilds it.  A committed 0-byte payload (vere's API can write one; the reference
  keeps it) is never rolled back: the open is refused (:class:`EmptyPayload`), nothing
  changed.
* **Index**: offsets of every committed deed, 8 bytes per event (``array('Q')``), built by
  a forward framing scan on open (not persisted: see the report in ``docs``).  Event access
  is O(1).
* **Memory** does not grow with event size: ``read_slice`` and ``verify_event`` stream.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from bookfs.formats import recovery
from bookfs.errors import (
    BadMagic,
    BadVersion,
    BookError,
    ContiguityError,
    CorruptDeed,
    FormatError,
    TooShort,
    UnsupportedLayout,
)
from bookfs.formats.fileio import open_regular, pread_into
from bookfs.formats.index import OffsetIndex, u64_views
from bookfs.formats.layout import (
    DEED_LEN,
    HEADER,
    LOG_NAME,
    MAGIC,
    MAX_PAYLOAD,
    META_NAME,
    META_SIZE,
    MIN_PAYLOAD,
    VERE_DEED_OVERHEAD,
    VERE_DEEDS_START,
    VERE_MIN_LEN,
    VERE_SLOT_BODY,
    VERE_SLOT_CRC,
    VERE_SLOT_NAMES,
    VERE_SLOT_OFFSETS,
    VERE_SLOT_SIZE,
    VERSION,
    crc32,
)
from bookfs.formats.lock import WriterLock, lock_path_for
from bookfs.formats.logbase import SingleFileLog, contained, create_files
from bookfs.types import Progress

log = logging.getLogger(__name__)


#: Events of the newest batch get the batch CRC recomputed on every read when the batch's
#: deeds take at most this many bytes.
BATCH_RECHECK_LIMIT = 1 << 20

_IOV_MAX = 1024
_JOIN_LIMIT = 1 << 20  # batches smaller than this are joined into one buffer
_CHUNK = 4 << 20  # bytes read at a time while scanning framing
_CRC_CHUNK = 8 << 20  # bytes per pread when computing a batch CRC
_SALVAGE_WINDOW = 64 << 20  # bytes examined at a time when looking for framed deeds
_EPOCH_DIR = re.compile(r"0i(\d+)")


class EmptyPayload(FormatError):
    """A committed event of a vere log has a 0-byte payload (see :meth:`VereBook.open`)."""

    def __init__(self, message: str, *, event: int, offset: int):
        super().__init__(message)
        self.event = event
        self.offset = offset


# --- header slots ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One header slot's fields.  ``which`` is 0 for slot A (offset 0), 1 for slot B."""

    which: int
    fir: int
    las: int
    seq: int
    bat: int
    sum: int

    @property
    def name(self) -> str:
        return VERE_SLOT_NAMES[self.which]

    @property
    def offset(self) -> int:
        return VERE_SLOT_OFFSETS[self.which]

    def pack(self) -> bytes:
        """The slot's 48 on-disk bytes (body, then the CRC of the body)."""
        body = VERE_SLOT_BODY.pack(MAGIC, VERSION, self.fir, self.las, self.seq, self.bat,
                                   self.sum)
        return body + VERE_SLOT_CRC.pack(crc32(body))


def parse_slot(raw: bytes, which: int) -> tuple[Slot | None, str]:
    """``(slot, "")`` for a valid slot, else ``(None, why)``.  Valid: 48 bytes whose CRC
    holds, magic and version right, ``las_d >= fir_d`` and ``bat <= las_d - fir_d``."""
    if len(raw) < VERE_SLOT_SIZE:
        return None, "missing (the file ends before it)"
    body = raw[: VERE_SLOT_BODY.size]
    (crc,) = VERE_SLOT_CRC.unpack_from(raw, VERE_SLOT_BODY.size)
    if crc32(body) != crc:
        return None, f"CRC mismatch (stored {crc:#010x}, computed {crc32(body):#010x})"
    magic, version, fir, las, seq, bat, sm = VERE_SLOT_BODY.unpack(body)
    if magic != MAGIC:
        return None, f"magic {magic:#010x}, expected {MAGIC:#010x}"
    if version != VERSION:
        return None, f"version {version}, expected {VERSION}"
    if las < fir:
        return None, f"las_d {las} is below fir_d {fir}"
    if bat > las - fir:
        return None, f"bat {bat} exceeds the {las - fir} events it would cover"
    return Slot(which, fir, las, seq, bat, sm), ""


def _slot_crc_ok(raw: bytes) -> bool:
    return (len(raw) >= VERE_SLOT_SIZE
            and crc32(raw[: VERE_SLOT_BODY.size]) == VERE_SLOT_CRC.unpack_from(raw, 44)[0])


def is_vere_layout(path: str | os.PathLike) -> bool:
    """True when the file at ``path`` (a ``book.log``) is in vere's two-slot layout: slot A
    or slot B has a matching header CRC and the Book magic.  The version number cannot tell
    the layouts apart (both are 1); the CRC can.  False for a missing or short file."""
    try:
        fd = open_regular(os.fspath(path), os.O_RDONLY, follow=True)
    except (OSError, BookError):  # missing, or not a regular file: the opener says why
        return False
    try:
        for off in VERE_SLOT_OFFSETS:
            raw = os.pread(fd, VERE_SLOT_SIZE, off)
            if _slot_crc_ok(raw) and struct.unpack_from("<I", raw)[0] == MAGIC:
                return True
        return False
    finally:
        os.close(fd)


def epoch_of_directory(directory: str | os.PathLike) -> int | None:
    """``N`` for a directory named ``0i<N>`` (plain decimal digits), else ``None``."""
    m = _EPOCH_DIR.fullmatch(os.path.basename(os.path.normpath(os.fspath(directory))))
    return int(m.group(1)) if m else None


@dataclass
class VereRecoveryReport(recovery.RecoveryReport):
    """What opening a vere log found and did, beyond :class:`recovery.RecoveryReport`."""

    slot: str | None = None  # "A"/"B": the slot whose state is committed; None: framing only
    bad_slots: list[str] = field(default_factory=list)  # "B: CRC mismatch (...)", ...
    rolled_back: tuple[int, int] | None = None  # (first, last) events a header claimed, dropped
    header_repaired: str | None = None  # the slot rewritten to describe the recovered state

    @property
    def clean(self) -> bool:
        return (super().clean and not self.bad_slots and self.rolled_back is None
                and self.header_repaired is None)


# --- low-level helpers -------------------------------------------------------------------------


def scan_vere_framing(fd: int, index: OffsetIndex, size: int, limit: int, *,
                      progress: Progress | None = None, min_len: int = VERE_MIN_LEN) -> int:
    """Extend ``index`` with deeds whose framing is sound, from ``index.end`` up to ``size``
    and at most ``limit`` deeds in all: ``min_len <= len_d <= 2^32`` (``min_len`` 1, or 0
    where a batch CRC is to decide: 16 zero bytes frame a 0-byte deed), the deed
    (``len_d + 16`` bytes) fits in the file, and ``let_d == len_d``.  Returns where the
    scan stopped (== ``index.end``).  Reads in large chunks with ``pread``; constant
    memory."""
    if sys.byteorder != "little":  # pragma: no cover - the views below assume LE
        raise NotImplementedError("bookfs indexes logs on little-endian machines only")
    offsets = index.offsets
    append = offsets.append
    off = index.end
    reported = off
    lo, hi = min_len, MAX_PAYLOAD
    scratch = bytearray(_CHUNK)
    while len(offsets) < limit and off + VERE_DEED_OVERHEAD + lo <= size:
        buf = pread_into(fd, scratch, min(_CHUNK, size - off), off)
        if len(buf) < 8:
            break
        base = off
        views = u64_views(buf)
        last_len = len(buf) - 8  # relative position of the last whole u64 in buf
        rel = 0
        while rel <= last_len and len(offsets) < limit:
            n = views[rel & 7][rel >> 3]
            t = rel + 8 + n  # relative position of let_d
            if n < lo or n > hi or base + t + 8 > size:
                index.end = base + rel
                return base + rel
            if t <= last_len:
                let = views[t & 7][t >> 3]
            else:
                (let,) = DEED_LEN.unpack(os.pread(fd, 8, base + t))
            if let != n:
                index.end = base + rel
                return base + rel
            append(base + rel)
            rel = t + 8
        off = base + rel
        index.end = off
        if progress is not None and off - reported >= 64 << 20:
            progress(off - reported)
            reported = off
    if progress is not None and off > reported:
        progress(off - reported)
    index.end = off
    return off


def crc_range(fd: int, start: int, stop: int) -> int | None:
    """crc32 of the file's bytes ``[start, stop)``, streamed; ``None`` if the file is
    shorter than ``stop``."""
    crc = 0
    pos = start
    scratch = bytearray(min(_CRC_CHUNK, max(stop - start, 1)))
    while pos < stop:
        mv = pread_into(fd, scratch, min(len(scratch), stop - pos), pos)
        if not len(mv):
            return None
        crc = crc32(mv, crc)
        pos += len(mv)
    return crc


def find_framed_deed(fd: int, start: int, stop: int) -> int | None:
    """The first offset in ``[start, stop)`` where a deed with sound framing (vere's only
    check) begins and ends by ``stop``, trying every byte offset; ``None`` if there is
    none.  Vectorised with numpy."""
    import numpy as np

    pos = start
    while pos + VERE_DEED_OVERHEAD + VERE_MIN_LEN <= stop:
        win = min(_SALVAGE_WINDOW, stop - pos)
        arr = np.frombuffer(os.pread(fd, win + 7, pos), dtype=np.uint8)
        cands = []
        for a in range(8):
            usable = (len(arr) - a) // 8 * 8
            if usable <= 0:
                continue
            lens = arr[a : a + usable].view("<u8").astype(np.int64, copy=False)
            starts = pos + a + 8 * np.arange(len(lens), dtype=np.int64)
            ok = (lens >= VERE_MIN_LEN) & (starts < pos + win)
            ok &= lens <= (stop - starts - VERE_DEED_OVERHEAD)
            cands.extend(starts[ok].tolist())
        for off in sorted(cands):
            (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
            tail = os.pread(fd, 8, off + 8 + n)
            if len(tail) == 8 and DEED_LEN.unpack(tail)[0] == n:
                return off
        pos += win
    return None


def is_torn_vere_tail(fd: int, off: int, size: int) -> bool:
    """True when ``[off, size)`` can only be an incomplete final deed: it is shorter than
    the deed its first 8 bytes announce (or too short to announce one), and no framed deed
    starts anywhere inside it.  Anything else may hold events and must be quarantined."""
    if size - off >= 8:
        (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
        if not (VERE_MIN_LEN <= n <= MAX_PAYLOAD) or off + n + VERE_DEED_OVERHEAD <= size:
            return False  # announces no deed, or a whole deed that was never committed
    return find_framed_deed(fd, off + 1, size) is None


# --- the engine --------------------------------------------------------------------------------


class VereBook(SingleFileLog):
    """An open vere-layout log.  Use :meth:`open`; close with :meth:`close` or ``with``.
    The state, meta and read accessors it shares with the UIP layout are in
    ``logbase.py``."""

    DEED_OVERHEAD = VERE_DEED_OVERHEAD
    #: keep committed 0-byte payloads (``open(empty_payloads=True)``) instead of refusing
    _empty_ok = False

    def __init__(self, directory: str, fd: int, meta_fd: int | None, writable: bool,
                 lock: WriterLock | None):
        super().__init__(directory, LOG_NAME, META_NAME, fd, meta_fd, writable, lock)
        self._fir = 0
        self._index = OffsetIndex(first=1, end=VERE_DEEDS_START, verified_end=VERE_DEEDS_START)
        # The published view: (first, count, end, batch_start_i, batch_sum).  Events with
        # index >= batch_start_i form the newest batch, whose CRC is batch_sum (-1: none).
        self._view = (1, 0, VERE_DEEDS_START, 0, -1)
        self._slots: list[Slot | None] = [None, None]
        self._active: Slot | None = None  # the slot describing the committed state
        self._seen: tuple[int, bytes] | None = None  # (size, both slots' bytes) last settled
        self.recovery = VereRecoveryReport()

    # --- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, writable: bool = False, create: bool = False,
             epoch: int | None = None, *, lock: bool = True,
             progress: Progress | None = None, empty_payloads: bool = False) -> "VereBook":
        """Open the vere-layout log in directory ``path``.

        ``create=True`` (needs ``writable``) makes ``book.log`` (both slots with
        ``fir_d = las_d = N``, ``seq_d = 0``, padded to 8192 bytes) and ``meta.bin`` (zeros)
        if missing.  ``N`` is taken from a directory named ``0i<N>``, else from ``epoch``
        (default 0); both given and different is a :class:`ValueError`.  A writable open
        takes the lock :func:`bookfs.formats.lock.lock_path_for` names (the enclosing pier's
        ``.vere.lock`` for an epoch inside a pier, else ``book.lock``); ``lock=False``
        skips it (for a caller holding the pier's lock).  Raises a
        :class:`FormatError` subclass for a file that is not a vere-layout log,
        :class:`LockHeld` if another writer holds the lock, :class:`PathEscape` for a file
        that resolves outside ``path``.  ``progress`` is called with byte counts during
        long scans.  A log whose committed events include a 0-byte payload (vere's API can
        write one; the reference keeps it) is refused with :class:`EmptyPayload`, nothing
        changed, unless ``empty_payloads=True`` (read-only: ``bookfs fsck``), which keeps
        those events as the reference does.
        """
        directory = os.fspath(path)
        if empty_payloads and writable:
            raise ValueError("empty_payloads=True is for read-only opens")
        if create and not writable:
            raise ValueError("create=True needs writable=True")
        if not os.path.isdir(directory):
            if create:
                os.makedirs(directory, exist_ok=True)
            else:
                raise BookError(f"{directory}: not a directory holding {LOG_NAME}")
        log_path = contained(directory, LOG_NAME)
        meta_path = contained(directory, META_NAME)
        named = epoch_of_directory(directory)
        if create:
            if named is not None and epoch is not None and epoch != named:
                raise ValueError(f"{directory}: the directory name says epoch {named}, "
                                 f"but epoch={epoch} was given")
            fir = named if named is not None else (epoch or 0)
        held = WriterLock(lock_path_for(directory)) if writable and lock else None
        try:
            if create:
                cls._create_files(directory, log_path, meta_path, fir)
            fd, meta_fd = cls._open_files(log_path, meta_path, writable,
                                          "a vere-layout Book log")
            book = cls(directory, fd, meta_fd, writable, held)
        except BaseException:
            if held:
                held.release()
            raise
        book._empty_ok = empty_payloads
        try:
            book._check_meta_file()
            book._load(progress)
            if named is not None and named != book._fir:
                book.recovery.notes.append(
                    f"{log_path}: fir_d is {book._fir} but the directory is named 0i{named}")
        except BaseException:
            book.close()
            raise
        return book

    @staticmethod
    def initial_log_bytes(fir: int) -> bytes:
        """The 8192 bytes of a fresh log with epoch base ``fir``: both slots say
        ``fir_d = las_d = fir``, ``seq_d = bat = sum = 0``."""
        buf = bytearray(VERE_DEEDS_START)
        for which in (0, 1):
            off = VERE_SLOT_OFFSETS[which]
            buf[off : off + VERE_SLOT_SIZE] = Slot(which, fir, fir, 0, 0, 0).pack()
        return bytes(buf)

    @classmethod
    def _create_files(cls, directory: str, log_path: str, meta_path: str, fir: int) -> None:
        create_files(directory, [(log_path, cls.initial_log_bytes(fir)),
                                 (meta_path, bytes(META_SIZE))])

    def _read_slots(self) -> tuple[bytes, bytes]:
        return tuple(os.pread(self._fd, VERE_SLOT_SIZE, off) for off in VERE_SLOT_OFFSETS)

    def _refuse_unreadable(self, size: int, raw: tuple[bytes, bytes], why: list[str]):
        if size < VERE_SLOT_SIZE:
            raise TooShort(f"{self.log_path}: {size} bytes, under one {VERE_SLOT_SIZE}-byte "
                           "vere header slot")
        magic_a = struct.unpack_from("<I", raw[0])[0]
        magic_b = struct.unpack_from("<I", raw[1])[0] if len(raw[1]) >= 4 else None
        if magic_a != MAGIC and magic_b != MAGIC:
            raise BadMagic(f"{self.log_path}: magic {magic_a:#010x} at offset 0, expected "
                           f"{MAGIC:#010x} (BOOK); not a vere-layout Book log")
        if magic_b != MAGIC and HEADER.unpack_from(raw[0])[1] == VERSION:
            raise UnsupportedLayout(
                f"{self.log_path}: no vere header slot has a valid CRC; this looks like the "
                "UIP layout (16-byte header), open it with bookfs.formats.book.Book")
        raise FormatError(f"{self.log_path}: neither vere header slot is valid "
                          f"({'; '.join(why)}); refusing to guess the committed state")

    def _load(self, progress: Progress | None) -> None:
        fd = self._fd
        report = self.recovery
        size = os.fstat(fd).st_size
        raw = self._read_slots()
        why = []
        slots: list[Slot | None] = []
        for which, r in enumerate(raw):
            s, w = parse_slot(r, which)
            slots.append(s)
            if s is None:
                why.append(f"slot {VERE_SLOT_NAMES[which]} at {VERE_SLOT_OFFSETS[which]}: {w}")
        cands = sorted((s for s in slots if s), key=lambda s: (-s.seq, s.which))
        if not cands:
            self._refuse_unreadable(size, raw, why)
        best = cands[0]
        if len(cands) == 2 and cands[1].fir != best.fir:
            why.append(f"slot {cands[1].name}: fir_d {cands[1].fir} disagrees with slot "
                       f"{best.name}'s {best.fir}; ignored")
            cands = [best]
            slots[1 - best.which] = None
        if self.writable and size < VERE_DEEDS_START:
            raise TooShort(f"{self.log_path}: {size} bytes, under the {VERE_DEEDS_START} bytes "
                           "of vere's two header slots and their padding; a writable open "
                           "never grows a file it cannot use (`bookfs fsck --repair` "
                           "rebuilds the header region and says what it did)")
        report.bad_slots = why
        for w in why:
            log.warning("%s: header %s", self.log_path, w)
        fir = self._fir = best.fir
        self._slots = slots

        index = OffsetIndex(first=fir + 1, end=VERE_DEEDS_START, verified_end=VERE_DEEDS_START)
        index.times.append((fir + 1, os.fstat(fd).st_mtime_ns))
        scan_vere_framing(fd, index, size, max(c.las - fir for c in cands), progress=progress)

        k, chosen = self._committed_count(index, best, cands)
        if chosen is not None:
            batch = (k - chosen.bat, chosen.sum)
            report.slot = chosen.name
        else:
            batch = None
        if k < best.las - fir:
            report.rolled_back = (fir + k + 1, best.las)
            log.warning("%s: rolled back events %d..%d (slot %s's batch does not check)",
                        self.log_path, fir + k + 1, best.las, best.name)
        index.truncate(k)
        self._index = index
        end = index.end if index.count else VERE_DEEDS_START
        if end < size:
            self._handle_bad_region(end, size, claimed=k < best.las - fir)
        if self.writable and chosen is not best:
            chosen = self._repair_header(index, best, chosen)
            batch = (k - chosen.bat, chosen.sum)
        elif batch is None:
            batch = (k, -1)  # read-only, no header vouches for a batch: framing only
        self._active = chosen
        if self.writable:
            index.verified_end = index.end
        self._seen = (os.fstat(fd).st_size, b"".join(self._read_slots()))
        self._publish(batch)

    def _committed_count(self, index: OffsetIndex, best: Slot, cands: list[Slot]
                         ) -> tuple[int, Slot | None]:
        """How many deeds recovery keeps, and the valid slot describing exactly them
        (``None``: no slot does; a writable open then rewrites one).  The rule
        (``docs/format.md``, "vere's layout: recovery"):

        * the newest valid slot's last batch checks: keep ``las_d - fir_d`` deeds;
        * it does not (a cut or flipped byte inside it): that batch was never
          acknowledged, since a save returns only after the header and the deeds share
          one ``fdatasync``, so roll it back.  Every earlier deed was acknowledged by an
          earlier save and is kept if its framing holds: the forward scan's deeds, up to
          ``las_d - bat``.  Damage inside those (not a crash) loses only the bytes from
          the first deed whose framing fails, which are quarantined.

        A torn newest slot is simply not a candidate, so the older slot's state is used and
        the deeds of the newest (unacknowledged) save are past its end."""
        fir = self._fir
        report = self.recovery
        if self._batch_ok(index, best):
            return best.las - fir, best
        empty = self._empty_payloads(index, cands)
        if empty is not None:
            return empty
        report.notes.append(f"slot {best.name} (seq {best.seq}, las {best.las}): its last "
                            f"batch of {best.bat} deeds is missing or fails its CRC; that "
                            "save was never acknowledged, so it is rolled back")
        acked = best.las - best.bat - fir
        k = min(index.count, acked)
        if k < acked:
            report.notes.append(
                f"events {fir + k + 1}..{fir + acked} were acknowledged by an earlier save, "
                f"but the deed of event {fir + k + 1} does not frame (damage, not a crash); "
                f"kept the {k} events before it whose framing holds")
        for c in cands[1:]:
            if c.las - fir == k and self._batch_ok(index, c):
                return k, c
        return k, None

    def _empty_payloads(self, index: OffsetIndex, cands: list[Slot]
                        ) -> tuple[int, Slot] | None:
        """The framing scan stopped at a deed of ``len_d = 0`` (16 zero bytes) inside what a
        valid slot claims.  vere's API can write such a 0-byte payload, and the reference
        keeps it when the batch CRC holds.  If, with 0-byte deeds allowed, a slot's
        committed state is on disk (its deed count and its batch CRC), that is what the
        reference keeps: an open made with ``empty_payloads=True`` (``bookfs fsck``) keeps
        it too, ``index`` extended and ``(count, slot)`` returned; any other open is refused
        with :class:`EmptyPayload` before anything is changed, never rolled back.  ``None``
        when no 0-byte deed explains the failed check (damage or a crash)."""
        fir = self._fir
        if index.count >= max(c.las - fir for c in cands) or os.pread(
                self._fd, 16, index.end) != bytes(16):
            return None
        for c in cands:
            k = c.las - fir
            if k <= index.count:
                continue
            trial = OffsetIndex(first=index.first, end=index.end, verified_end=index.end)
            trial.offsets.extend(index.offsets)
            scan_vere_framing(self._fd, trial, os.fstat(self._fd).st_size, k, min_len=0)
            if trial.count != k or not self._batch_ok(trial, c):
                continue
            ends = list(trial.offsets[1:]) + [trial.end]
            empty = [(fir + 1 + i, off) for i, (off, nxt) in enumerate(zip(trial.offsets, ends))
                     if nxt - off == VERE_DEED_OVERHEAD]
            event, off = empty[0]
            if not self._empty_ok:
                raise EmptyPayload(
                    f"{self.log_path}: event {event} at offset {off} has a 0-byte payload, "
                    f"in a batch whose CRC header slot {c.name} vouches for ({len(empty)} "
                    "such event(s)); the reference keeps it, but bookfs expects every event "
                    "to start with a 4-byte mug: refusing this log, nothing was changed "
                    "(`bookfs fsck --salvage OUT` copies every other event and keeps it "
                    "aside)",
                    event=event, offset=off)
            self.recovery.notes.append(
                f"events {', '.join(str(e) for e, _ in empty)} have 0-byte payloads, kept as "
                f"the reference keeps them (slot {c.name}'s batch CRC holds)")
            index.offsets = trial.offsets
            index.end = trial.end
            return k, c
        return None

    def _batch_ok(self, index: OffsetIndex, c: Slot) -> bool:
        """Slot ``c``'s committed state is on disk: its ``las_d - fir_d`` deeds are framed
        and the CRC of its last ``bat`` deeds equals its ``sum``."""
        k = c.las - self._fir
        if k > index.count:
            return False
        stop = index.offsets[k] if k < index.count else index.end
        start = index.offsets[k - c.bat] if c.bat else stop
        return crc_range(self._fd, start, stop) == c.sum

    def _handle_bad_region(self, off: int, size: int, *, claimed: bool) -> None:
        """Bytes ``[off, size)`` past the committed end.  ``claimed``: a valid header slot
        says events there were committed (a batch that failed its check), so however short
        they are they are evidence, never a torn tail: a flipped ``len_d`` can make a whole
        deed look incomplete."""
        report = self.recovery
        if not self.writable:
            report.bad_region = (off, size - off)
            log.warning("%s: %d bytes at offset %d are not committed deeds; a writable open "
                        "would recover them (read-only: left untouched)",
                        self.log_path, size - off, off)
            return
        if not claimed and is_torn_vere_tail(self._fd, off, size):
            report.torn_tail = (off, size - off)
            log.warning("%s: cut a torn final deed of %d bytes at offset %d",
                        self.log_path, size - off, off)
        else:
            qpath = recovery.quarantine(self.directory, self._fd, off, size)
            report.quarantined.append((qpath, off, size - off))
            log.warning("%s: %d bytes at offset %d are not committed; copied to %s "
                        "before cutting them (try `bookfs fsck --salvage`)",
                        self.log_path, size - off, off, qpath)
        os.ftruncate(self._fd, off)
        os.fsync(self._fd)

    def _repair_header(self, index: OffsetIndex, best: Slot, chosen: Slot | None) -> Slot:
        """After a rollback (writable open): write the recovered state, with a ``seq_d``
        above every valid slot's, into a slot that does not hold the state we kept, so the
        next open agrees and the next save's ``seq_d`` is unambiguous.  A crash during this
        write leaves the kept state's slot (or the same framing scan) to recover from."""
        k = index.count
        if chosen is not None:
            target, bat, sm = best.which, chosen.bat, chosen.sum
        else:
            target = 1 - best.which
            bat = 1 if k else 0
            sm = crc_range(self._fd, index.offsets[k - 1], index.end) if k else 0
        seq = max(s.seq for s in self._slots if s) + 1
        new = Slot(target, self._fir, self._fir + k, seq, bat, sm)
        os.pwrite(self._fd, new.pack(), new.offset)
        os.fdatasync(self._fd)
        self._slots[target] = new
        self.recovery.header_repaired = new.name
        log.warning("%s: rewrote header slot %s to describe the recovered log (las_d %d)",
                    self.log_path, new.name, new.las)
        return new

    # --- state ---------------------------------------------------------------------------

    # What readers see is the published view, replaced by one atomic assignment after the
    # index has grown, so a reader in another thread never sees a half-updated index.

    def _publish(self, batch: tuple[int, int]) -> None:
        """Publish (first, count, end, batch_start_i, batch_sum): events with index >=
        batch_start_i form the newest batch, whose CRC is batch_sum (-1: none)."""
        ix = self._index
        self._publish_view(ix.end if ix.count else VERE_DEEDS_START, *batch)

    @property
    def epoch(self) -> int:
        """``fir_d``: the epoch base, the event just before this file's first."""
        return self._fir

    @property
    def las_d(self) -> int:
        """The last committed event as the header says it (``fir_d`` when empty)."""
        return self._fir + self._view[1]

    @property
    def format(self) -> str:
        return "vere-book (two-slot layout)"

    # --- reading ---------------------------------------------------------------------------

    def read(self, event: int) -> bytes:
        """The payload of ``event`` (mug ++ jam), after checking its framing (``len_d`` and
        ``let_d`` equal the indexed size) and, for an event of the newest batch of at most
        ``BATCH_RECHECK_LIMIT`` bytes, that batch's CRC.

        Raises :class:`NoSuchEvent` or :class:`CorruptDeed` (with the event and offset).
        Holds the whole payload in memory: use :meth:`read_slice` for large events.
        """
        off, n = self._locate(event)
        i = event - self._view[0]
        buf = os.pread(self._fd, n + VERE_DEED_OVERHEAD, off)
        if (len(buf) != n + VERE_DEED_OVERHEAD or DEED_LEN.unpack_from(buf)[0] != n
                or DEED_LEN.unpack_from(buf, n + 8)[0] != n):
            self._corrupt(event, off, "framing (len_d/let_d)")
        self._check_batch(event, off, i)
        return bytes(memoryview(buf)[8 : n + 8])

    def _check_batch(self, event: int, off: int, i: int) -> None:
        _, count, end, b0, bsum = self._view
        if bsum < 0 or i < b0 or b0 >= count:
            return
        start = self._index.offsets[b0]
        if end - start <= BATCH_RECHECK_LIMIT and crc_range(self._fd, start, end) != bsum:
            self._corrupt(event, off, f"batch CRC (events {self._view[0] + b0}.."
                                      f"{self._view[0] + count - 1})")

    def _corrupt(self, event: int, off: int, what: str):
        msg = f"{self.log_path}: event {event} at offset {off} fails its {what} check"
        log.error("%s", msg)
        raise CorruptDeed(msg, event=event, offset=off)

    def verify_event(self, event: int) -> None:
        """Run :meth:`read`'s checks without holding the payload (constant memory), or raise
        :class:`CorruptDeed`."""
        off, n = self._locate(event)
        i = event - self._view[0]
        head = os.pread(self._fd, 8, off)
        tail = os.pread(self._fd, 8, off + 8 + n)
        if (len(head) != 8 or len(tail) != 8 or DEED_LEN.unpack(head)[0] != n
                or DEED_LEN.unpack(tail)[0] != n):
            self._corrupt(event, off, "framing (len_d/let_d)")
        self._check_batch(event, off, i)

    def verify(self, *, progress: Progress | None = None) -> list[tuple[int, int]]:
        """Check every deed's framing and the newest batch's CRC (whatever its size).
        Returns ``(event, offset)`` of each bad deed."""
        first, count, end, b0, bsum = self._view
        offsets = self._index.offsets
        bad = []
        for i in range(count):
            off = offsets[i]
            n = (offsets[i + 1] if i + 1 < count else end) - off - VERE_DEED_OVERHEAD
            head, tail = os.pread(self._fd, 8, off), os.pread(self._fd, 8, off + 8 + n)
            if head != DEED_LEN.pack(n) or tail != DEED_LEN.pack(n):
                bad.append((first + i, off))
        if bsum >= 0 and b0 < count:
            if crc_range(self._fd, offsets[b0], end) != bsum:
                bad.extend((first + i, offsets[i]) for i in range(b0, count)
                           if (first + i, offsets[i]) not in bad)
        if progress is not None:
            progress(end - VERE_DEEDS_START)
        return bad

    def refresh(self) -> int:
        """Pick up events another process committed (a new header slot whose last batch
        checks).  Deeds written but not yet committed by a header are left for a later call.
        Returns how many events were added.  If the log was rewritten under us (it shrank,
        a newer header's batch covers events already published, or, for a reader, a rename
        replaced the file) the view is rebuilt from scratch and ``generation`` grows.  A
        newly committed batch holding a 0-byte payload raises :class:`EmptyPayload` (see
        :meth:`open`) rather than being waited on forever.  Cheap (an ``fstat``, a
        ``stat`` and two 48-byte reads) when nothing changed."""
        if self._reopen_if_replaced():
            log.warning("%s was replaced (a new file at its path); re-indexing", self.log_path)
            return self._reindex()
        fd = self._fd
        size = os.fstat(fd).st_size
        raw = self._read_slots()
        if self._seen == (size, b"".join(raw)):
            return 0
        slots = [parse_slot(r, w)[0] for w, r in enumerate(raw)]
        cands = sorted((s for s in slots if s and s.fir == self._fir),
                       key=lambda s: (-s.seq, s.which))
        if not cands:
            return 0  # a header being rewritten under us, or damage: look again later
        ix = self._index
        before = ix.count
        best = cands[0]
        if best.las - self._fir < before or size < ix.end:
            log.warning("%s: the committed log shrank (las_d %d, %d bytes); re-indexing",
                        self.log_path, best.las, size)
            return self._reindex()
        active_seq = self._active.seq if self._active is not None else -1
        if before and (best.seq < active_seq or (
                best.seq > active_seq and best.las - best.bat - self._fir < before)):
            # a newer header whose batch covers events we already published (an append only
            # ever adds batches after them), or a header older than ours: rewritten
            log.warning("%s: header slot %s (seq %d) rewrote events from %d on; re-indexing",
                        self.log_path, best.name, best.seq, best.las - best.bat + 1)
            return self._reindex()
        scan_vere_framing(fd, ix, size, max(c.las - self._fir for c in cands))
        for c in cands:
            if c.las - self._fir >= before and self._batch_ok(ix, c):
                chosen = c
                break
        else:
            chosen = None
        if chosen is not best:  # a 0-byte payload the batch CRC vouches for is refused
            scanned = ix.count  # (EmptyPayload), never waited on forever
            try:
                kept = self._empty_payloads(ix, cands)
            finally:
                ix.truncate(scanned)
            if kept is not None:
                return self._reindex()
        if chosen is None:
            ix.truncate(before)  # not yet readable as committed: look again later
            return 0
        k = chosen.las - self._fir
        ix.truncate(k)
        self._slots = slots
        self._active = chosen
        if chosen is best:
            self._seen = (size, b"".join(raw))
        added = k - before
        if added:
            ix.note_growth(ix.first + before, time.time_ns())
        self._publish((k - chosen.bat, chosen.sum))
        return added

    def _reindex(self) -> int:
        before = self.count
        old = (self._index, self._view, self._slots, self._active, self.recovery)
        self.recovery = VereRecoveryReport()
        try:
            self._load(None)
        except BookError:
            self._index, self._view, self._slots, self._active, self.recovery = old
            raise
        finally:
            self.generation += 1  # published events may have changed
        return max(0, self.count - before)

    # --- writing ---------------------------------------------------------------------------

    def save(self, first_event: int, payloads: Iterable, epoch: int = 0) -> None:
        """Append ``payloads`` as events ``first_event, first_event + 1, ...``, durably.

        Contiguity: ``first_event`` must be ``las_d + 1`` (``fir_d + 1`` when empty; the
        epoch base is fixed at creation, so ``epoch`` may only be 0 or ``fir_d``).  A
        violation raises :class:`ContiguityError`, a payload under 4 bytes
        :class:`PayloadError`, one over 2^32 :class:`PayloadTooLarge`; nothing is written.
        Payloads are bytes-like or :class:`bookfs.formats.book.Blob` (streamed).  On a write or
        sync error the file is cut back and the inactive slot rewritten with its old bytes,
        so the log is exactly as before, and the ``OSError`` is raised.
        """
        payloads = self._checked_payloads(first_event, payloads)
        if not payloads:
            return
        ix = self._index
        fir = self._fir
        las = fir + ix.count
        if epoch not in (0, fir):
            raise ContiguityError(f"{self.log_path}: cannot save with epoch {epoch}: this log's "
                                  f"epoch base (fir_d) is {fir}")
        if first_event != las + 1:
            what = f"the log ends at event {las}" if ix.count else (
                f"the log is empty and its epoch base (fir_d) is {fir}")
            raise ContiguityError(f"{self.log_path}: cannot save event {first_event}: {what}, "
                                  f"so the next event must be {las + 1}")
        fd = self._fd
        start = ix.end if ix.count else VERE_DEEDS_START
        size_before = os.fstat(fd).st_size
        target = 1 - self._active.which if self._active is not None else 1
        old_slot = os.pread(fd, VERE_SLOT_SIZE, VERE_SLOT_OFFSETS[target])
        seq = max(s.seq for s in self._slots if s) + 1
        try:
            sizes, sm = self._write_deeds(payloads, start)
            new = Slot(target, fir, las + len(payloads), seq, len(payloads), sm)
            if os.pwrite(fd, new.pack(), new.offset) != VERE_SLOT_SIZE:
                raise OSError(errno.EIO, "short header write")
            os.fdatasync(fd)
        except OSError:
            self._undo(start, size_before, target, old_slot)
            raise
        offsets = ix.offsets
        b0 = ix.count
        off = start
        for n in sizes:
            offsets.append(off)
            off += n + VERE_DEED_OVERHEAD
        ix.end = ix.verified_end = off
        self._slots[target] = new
        self._active = new
        self._publish((b0, sm))
        self._seen = (os.fstat(fd).st_size, b"".join(self._read_slots()))
        ix.note_growth(first_event, time.time_ns())

    def _write_deeds(self, payloads: list, start: int) -> tuple[list[int], int]:
        """Write the deeds for ``payloads`` at ``start``: one ``pwritev`` for a batch of
        in-memory payloads; a :class:`Blob` is streamed once, in bounded chunks.  Returns
        the payload sizes and the crc32 of all deed bytes written (the batch ``sum``)."""
        bufs: list = []
        sizes = []
        crc = 0
        off = start
        for p in payloads:
            n = len(p)
            sizes.append(n)
            frame = DEED_LEN.pack(n)
            if isinstance(p, (bytes, bytearray, memoryview)):
                bufs += (frame, p, frame)
                crc = crc32(frame, crc32(p, crc32(frame, crc)))
                continue
            off = self._pwritev_all(bufs, off)
            bufs = []
            crc = crc32(frame, crc)
            off = self._pwritev_all([frame], off)
            got = 0
            for chunk in p.chunks():
                crc = crc32(chunk, crc)
                got += len(chunk)
                off = self._pwritev_all([chunk], off)
            if got != n:
                raise OSError(errno.EIO, f"payload changed size while written ({n} -> {got})")
            crc = crc32(frame, crc)
            off = self._pwritev_all([frame], off)
        self._pwritev_all(bufs, off)
        return sizes, crc

    def _undo(self, start: int, size_before: int, target: int, old_slot: bytes) -> None:
        try:
            if len(old_slot) == VERE_SLOT_SIZE:
                os.pwrite(self._fd, old_slot, VERE_SLOT_OFFSETS[target])
            os.ftruncate(self._fd, min(start, size_before))
            os.fsync(self._fd)
        except OSError as e:  # pragma: no cover - the disk is failing under us
            log.error("%s: could not undo a failed save: %s", self.log_path, e)

    # --- meta ----------------------------------------------------------------------------

    # --- closing -------------------------------------------------------------------------

    def close(self, save: bool = True) -> None:
        """Close the files and release the lock.  (``save`` is accepted for compatibility
        with :meth:`Book.close`; there is no persisted index to save.)"""
        self._close_files()


# --- telling the two Book layouts apart, without guessing ---------------------------------


def epoch_says_vere(directory: str | os.PathLike) -> bool:
    """True when ``directory`` is a pier's epoch whose ``epoc.txt`` is ``3``: vere opens
    such an epoch only in its own two-slot layout, so that is the layout its ``book.log``
    was written in (bookfs never writes a UIP-layout log beside ``epoc.txt`` 3).  An
    unreadable or absent ``epoc.txt`` says nothing."""
    try:
        fd = open_regular(os.path.join(os.fspath(directory), "epoc.txt"), os.O_RDONLY,
                          follow=True)
    except (OSError, BookError):
        return False
    try:
        return os.pread(fd, 64, 0).strip() == b"3"
    except OSError:
        return False
    finally:
        os.close(fd)


def detect_layout(log_path: str | os.PathLike) -> str:
    """``"vere"`` or ``"uip"`` for the ``book.log`` at ``log_path``, or a
    :class:`FormatError` saying why it is neither (nothing is parsed as a layout it has not
    been identified as).  Missing file: :class:`BookError`.

    Identification never guesses; a file is refused (untouched, one line saying why and
    what to do) unless its bytes decide, or bytes that are not decisive meet a context
    that is (``epoc.txt`` 3 beside it: :func:`epoch_says_vere`):

    * a header slot whose CRC holds and whose magic is Book's: vere's layout;
    * under 16 bytes: refused (no Book header of either layout);
    * the Book magic and version 1 at offset 0, and a whole UIP deed at offset 16 whose
      CRC holds: the UIP layout (a vere slot cannot hold one: its CRC would have to hold
      by chance);
    * otherwise the bytes after the 16-byte header are either a UIP log's torn first
      deed or the rest of a vere slot that lost its CRC, whose cutting would destroy
      vere's ``las_d``/``seq_d``: refused when the file is too short to hold a whole vere
      slot (16 < size <= 48), when vere's zero padding follows (both slots damaged), and
      whenever ``epoc.txt`` 3 says the file is vere's;
    * exactly the 16-byte header and nothing else, with no ``epoc.txt`` 3: the UIP layout
      (an empty UIP log is exactly this; a vere log is never shorter than 8192 bytes, so
      such a file holds no vere event, and appending after it cuts nothing);
    * longer files with non-zero bytes where vere keeps zeros: the UIP layout (a UIP log
      whose first deed is damaged, which its recovery quarantines before cutting)."""
    path = os.fspath(log_path)
    try:  # a FIFO or directory is refused here (NotRegularFile), never waited on
        fd = open_regular(path, os.O_RDONLY, follow=True)
    except FileNotFoundError:
        raise BookError(f"{path}: no such file (expected a Book log)") from None
    try:
        return _identify_fd(fd, path, epoch_says_vere(os.path.dirname(path) or "."))
    finally:
        os.close(fd)


_REFUSED = ("refused, nothing was changed; if it is a UIP log whose first append was torn, "
            "copy it aside and `truncate -s 16` it, else restore book.log from a backup")


_REFUSED_VERE = "refused, nothing was changed: restore book.log from a backup"


def _identify_fd(fd: int, path: str, vere_context: bool) -> str:
    """:func:`detect_layout` on an open descriptor (also the UIP engine's own check on
    open, so no path reaches a layout by another road)."""
    size = os.fstat(fd).st_size
    for off in VERE_SLOT_OFFSETS:
        raw = os.pread(fd, VERE_SLOT_SIZE, off)
        if _slot_crc_ok(raw) and struct.unpack_from("<I", raw)[0] == MAGIC:
            return "vere"
    context = " (epoc.txt 3 beside it says vere's layout)" if vere_context else ""
    head = os.pread(fd, 16, 0)
    if len(head) < 16:
        raise TooShort(f"{path}: {size} bytes, under the 16-byte header of either Book "
                       f"layout{context}; refused, nothing was changed: restore book.log "
                       "from a backup")
    magic, version, _ = HEADER.unpack(head)
    if magic != MAGIC:
        raise BadMagic(f"{path}: magic {magic:#010x}, expected {MAGIC:#010x} (BOOK); not "
                       "a Book log in either layout")
    if version != VERSION:
        raise BadVersion(f"{path}: version {version}, expected {VERSION}")
    if size == 16 and not vere_context:
        return "uip"  # an empty UIP log (see detect_layout)
    (n,) = DEED_LEN.unpack(os.pread(fd, 8, 16).ljust(8, b"\0"))
    if 4 <= n <= MAX_PAYLOAD and recovery.deed_crc_ok(fd, 16, n):
        return "uip"
    if size <= VERE_SLOT_SIZE and vere_context:
        raise TooShort(f"{path}: {size} bytes, but epoc.txt 3 beside it says vere's layout, "
                       f"whose header slot alone is {VERE_SLOT_SIZE} bytes (the file was cut "
                       f"and holds no whole slot); {_REFUSED_VERE}")
    if size <= VERE_SLOT_SIZE:
        raise TooShort(f"{path}: {size} bytes with Book's header: too short to tell a UIP "
                       "log with a torn first deed from vere's layout cut inside its "
                       f"{VERE_SLOT_SIZE}-byte header slot; {_REFUSED}")
    pad = os.pread(fd, min(size, VERE_SLOT_OFFSETS[1]) - VERE_SLOT_SIZE, VERE_SLOT_SIZE)
    if vere_context or not any(pad):
        raise FormatError(f"{path}: looks like vere's two-slot layout with both "
                          f"header slots damaged (no slot CRC holds){context}; refusing to "
                          "guess the committed state, nothing was changed: restore "
                          "book.log from a backup")
    return "uip"


# --- fsck: the recovery ladder for vere's layout --------------------------------------------


def short_payloads(b: VereBook) -> list[tuple[int, int, int]]:
    """``(event, offset, size)`` of each committed event of ``b`` whose payload is under
    4 bytes (vere's API can write one; bookfs never does)."""
    import numpy as np

    first, count, end = b._view[:3]
    if not count:
        return []
    offs = np.frombuffer(b._index.offsets, dtype=np.uint64)[:count].astype(np.int64)
    sizes = np.append(offs[1:], end) - offs - VERE_DEED_OVERHEAD
    return [(first + int(i), int(offs[i]), int(sizes[i]))
            for i in np.nonzero(sizes < MIN_PAYLOAD)[0]]


@dataclass
class VereFindings:
    """What :meth:`VereRecovery.check` found beyond the problem list."""

    short: bool = False  # under the 8192-byte header region
    fir: int = 0
    las: int = 0  # the best valid slot's las_d
    meta_missing: bool = False


class VereRecovery(recovery.Recovery):
    """``check``/``repair``/``salvage`` for a vere-layout Book directory, through
    :class:`VereBook` itself (the same recovery rule the mount applies).

    * ``check`` opens the log read-only (which changes nothing) and reports: damaged or
      missing header slots, a batch rolled back, bytes past the committed end (a torn tail
      or quarantine-worthy), every committed deed whose framing fails, the newest batch's
      CRC, a file under 8192 bytes, ``meta.bin``; optionally every mug (vere deeds carry
      no CRC, so the mug is the only check of an older payload).
    * ``repair`` pads a short file's header region (quarantining any bytes there), then
      does what a writable open does: roll back an unacknowledged batch and cut a torn
      tail, quarantining anything that may hold events first, and rewrite a header slot.
      It says each thing it did.
    * ``salvage`` copies the committed events (past damage: up to the end of a batch
      whose CRC a valid slot holds, found by trying every byte offset) into a new
      vere-layout log with the same epoch base; what was never committed, damaged bytes
      and payloads under 4 bytes are kept aside in ``salvage-left-out.bin``, never as
      events.  A log whose committed events include a 0-byte payload is checked and
      salvaged as the reference reads it; its repair is refused (:class:`EmptyPayload`).
    """

    kind = "vere"

    @property
    def log_path(self) -> str:
        return os.path.join(self.path, LOG_NAME)

    def size(self) -> int:
        return os.path.getsize(self.log_path)

    def open_log(self) -> VereBook:
        return VereBook.open(self.path)

    def check(self, *, mugs: bool = False, progress=None) -> recovery.CheckReport:
        P = recovery.Problem
        path = self.log_path
        rep = recovery.CheckReport(path, "vere-book (two-slot layout)")
        st = rep.state = VereFindings()
        size = os.path.getsize(path)
        st.meta_missing = recovery.check_meta_file(self.path, rep)
        if size < VERE_DEEDS_START:
            st.short = True
            rep.problems.append(P("header", size, f"{size} bytes, under the "
                                  f"{VERE_DEEDS_START}-byte header region (a writable open "
                                  "refuses it)"))
            rep.repairs.append(f"pad the header region to {VERE_DEEDS_START} bytes")
        with VereBook.open(self.path, empty_payloads=True) as b:
            r = b.recovery
            st.fir = b.epoch
            best = max((s for s in b._slots if s), key=lambda s: (s.seq, -s.which))
            st.las = best.las
            for why in r.bad_slots:
                rep.problems.append(P("slot", None, f"header {why}"))
            if r.bad_slots and not st.short:
                rep.repairs.append("rewrite the damaged header slot")
            if r.rolled_back is not None:
                lo, hi = r.rolled_back
                rep.problems.append(P("rollback", None, f"events {lo}..{hi} that slot "
                                      f"{best.name} names are not all on disk: " +
                                      "; ".join(r.notes), event=lo))
                rep.repairs.append(f"roll back events {lo}..{hi} (quarantining their bytes)")
            if r.bad_region is not None:
                off, n = r.bad_region
                torn = (r.rolled_back is None
                        and is_torn_vere_tail(b.fileno(), off, off + n))
                if torn:
                    rep.problems.append(P("torn-tail", off, f"{n} bytes at offset {off} are "
                                          "an incomplete final deed no header committed"))
                    rep.repairs.append(f"cut the torn tail at offset {off}")
                else:
                    rep.problems.append(P("garbage", off, f"{n} bytes at offset {off} are "
                                          "not committed deeds (they may hold events)"))
                    rep.repairs.append(f"quarantine {n} bytes at offset {off}, then cut them")
            for event, off in b.verify(progress=progress):
                rep.problems.append(P("framing", off, f"the deed of event {event} at offset "
                                      f"{off} fails its framing or batch CRC check",
                                      event=event))
            for event, off, n in short_payloads(b):
                rep.problems.append(P("payload", off, f"event {event} at offset {off} has a "
                                      f"{n}-byte payload, under a 4-byte mug" +
                                      (" (bookfs refuses to open a log with a 0-byte one)"
                                       if n == 0 else "") + "; --salvage OUT keeps it aside, "
                                      "not as an event", event=event))
            rep.first, rep.last = b.gulf()
            rep.events = b.count
        for p in rep.problems:
            p.path = p.path or path
        if mugs:
            self._check_mugs(rep, progress)
        return rep

    def repair(self, report: recovery.CheckReport) -> list[str]:
        st: VereFindings = report.state
        done = []
        lock = None if self.pier_locked else WriterLock(lock_path_for(self.path))
        try:
            if st.short:
                done += self._rebuild_short_header(st.fir)
            if st.meta_missing:
                made = recovery.create_meta_file(self.path)
                if made:
                    done.append(made)
            with VereBook.open(self.path, writable=True, lock=False) as b:
                r = b.recovery
                if r.rolled_back is not None:
                    done.append(f"rolled back events {r.rolled_back[0]}..{r.rolled_back[1]} "
                                "(their batch was never acknowledged, or does not frame)")
                if r.torn_tail is not None:
                    done.append(f"cut the torn tail of {r.torn_tail[1]} bytes at offset "
                                f"{r.torn_tail[0]}")
                for qpath, off, n in r.quarantined:
                    done.append(f"copied {n} bytes at offset {off} to {qpath}, then cut them")
                if r.header_repaired is not None:
                    done.append(f"rewrote header slot {r.header_repaired} (las_d {b.las_d})")
                elif r.bad_slots and not st.short:
                    done += self._rewrite_bad_slot(b)
        finally:
            if lock is not None:
                lock.release()
        return done

    def _rebuild_short_header(self, fir: int) -> list[str]:
        """A file under 8192 bytes: no deed can be in it.  Copy any bytes past slot A
        that are not zero to quarantine, then write the 8192-byte header region with both
        slots saying ``fir_d = las_d = fir`` and a ``seq_d`` above every valid slot's."""
        done = []
        fd = open_regular(self.log_path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            raw = os.pread(fd, size, 0)
            seq = max([s.seq for s in (parse_slot(raw[o:o + VERE_SLOT_SIZE], w)[0]
                                       for w, o in enumerate(VERE_SLOT_OFFSETS)) if s] + [0])
            if any(raw[VERE_SLOT_SIZE:]):
                q = recovery.quarantine(self.path, fd, VERE_SLOT_SIZE, size)
                done.append(f"copied {size - VERE_SLOT_SIZE} bytes at offset "
                            f"{VERE_SLOT_SIZE} to {q}")
            buf = bytearray(VERE_DEEDS_START)
            for which, off in enumerate(VERE_SLOT_OFFSETS):
                buf[off : off + VERE_SLOT_SIZE] = Slot(which, fir, fir, seq + 1, 0, 0).pack()
            os.pwrite(fd, bytes(buf), 0)
            os.ftruncate(fd, VERE_DEEDS_START)
            os.fsync(fd)
        finally:
            os.close(fd)
        done.append(f"grew {self.log_path} from {size} to {VERE_DEEDS_START} bytes: the "
                    f"header region, both slots saying epoch {fir} with no events")
        return done

    @staticmethod
    def _rewrite_bad_slot(b: VereBook) -> list[str]:
        """A damaged slot the recovery did not need to rewrite (the other one holds the
        state): write the committed state into it, so both slots are valid again."""
        active = b._active
        bad = [w for w, s in enumerate(b._slots) if s is None]
        if active is None or not bad:
            return []
        target = bad[0]
        new = Slot(target, active.fir, active.las, active.seq - 1 if active.seq else 0,
                   active.bat, active.sum)
        if target == 0 and new.seq == active.seq:  # pragma: no cover - seq 0 tie: A wins
            return []
        os.pwrite(b.fileno(), new.pack(), new.offset)
        os.fdatasync(b.fileno())
        return [f"rewrote damaged header slot {new.name} with the committed state "
                f"(las_d {new.las}, seq_d {new.seq}) below slot {active.name}'s"]

    def salvage_into(self, report: recovery.CheckReport, out: str, *, progress=None) -> dict:
        """Copy the committed events into a new vere-layout log in ``out`` (epoch base
        ``fir_d``), and keep every other byte past the header region aside.

        * The events are those the recovery rule keeps (:meth:`VereBook._committed_count`,
          what a mount serves), read as the reference reads them (a 0-byte payload the
          batch CRC vouches for is committed, and then, like every payload under 4
          bytes, kept aside and recorded as a gap of one event).
        * When damage breaks the framing inside acknowledged events, the deeds past it are
          found by trying every byte offset, and those up to the end of a batch whose CRC
          equals a valid header slot's ``sum`` are committed: they are copied, numbered on
          from the last event before the damage (the report lists the gaps).
        * Everything else is never an event of the new log: deeds past the committed end
          (a batch rolled back because its CRC fails or it is cut, deeds no header
          commits), the damaged bytes, and payloads under 4 bytes go byte for byte to
          ``salvage-left-out.bin``; ``past_committed_end`` counts the framed deeds past
          the committed end.  vere deeds carry no CRC, so check the payloads with
          ``bookfs verify --mugs``."""
        from bookfs.formats.book import SalvageBatch
        from bookfs.formats.layout import META_FIELDS

        gaps: list[dict] = []
        fd = open_regular(self.log_path, os.O_RDONLY, follow=True)
        try:
            size = os.fstat(fd).st_size
            with VereBook.open(self.path, empty_payloads=True) as src:
                fir, count, end = src.epoch, src.count, src._view[2]
                committed = src._index.offsets[:count]
                slots = [x for x in src._slots if x]
                rolled_back = src.recovery.rolled_back
            best = max(slots, key=lambda x: (x.seq, -x.which))
            acked = best.las - fir - (best.bat if rolled_back else 0)
            with VereBook.open(out, writable=True, create=True, epoch=fir) as dst, \
                    recovery.LeftOut(out) as left:
                try:
                    with open(os.path.join(self.path, META_NAME), "rb") as f:
                        raw = f.read(META_SIZE + 1)
                except FileNotFoundError:
                    raw = b""
                if len(raw) == META_SIZE:
                    for key, (o, n) in META_FIELDS.items():
                        dst.save_meta(key, raw[o : o + n])
                batch = SalvageBatch(dst, fir + 1, epoch=fir, left_out=left, gaps=gaps)
                for i, off in enumerate(committed):
                    nxt = committed[i + 1] if i + 1 < count else end
                    batch.add(os.pread(fd, nxt - off - VERE_DEED_OVERHEAD, off + 8),
                              offset=off, original_event=fir + 1 + i)
                    if progress is not None:
                        progress(nxt - off)
                pos, why = end, None
                if count < acked:  # damage inside acknowledged events, not a crash
                    pos, why = self._salvage_past_damage(fd, size, end, fir, slots, batch,
                                                         left, progress)
                past = 0
                if pos < size:
                    past = _count_framed(fd, pos, size)
                    if why is None:
                        why = (f"past the committed end (event {fir + count}): " +
                               (f"events {rolled_back[0]}..{rolled_back[1]} that slot "
                                f"{best.name} names fail their batch CRC or are cut, so "
                                "that save was never acknowledged (the reference rolls it "
                                "back too)" if rolled_back and count == acked else
                                "no valid header slot commits these bytes"))
                    left.copy(fd, pos, size - pos, kind=recovery.NOT_COMMITTED, why=why,
                              deeds=past)
                batch.flush()
                result = {
                    "source": self.log_path, "out": os.path.abspath(out), "layout": "vere",
                    "recovered": dst.count, "first": dst.first, "last": dst.last,
                    "past_committed_end": past, "gaps": gaps, "left_out": left.records,
                    "note": ("the committed events, numbered from the epoch base "
                             f"{fir}; deeds that were never committed are only in "
                             f"{recovery.LEFT_OUT_NAME}; vere deeds carry no CRC, so check "
                             "the payloads with `bookfs verify --mugs`"),
                }
        finally:
            os.close(fd)
        return result

    #: bytes of CRC computed while looking for a header's batch past damage, at least
    _COMMIT_SEARCH_BYTES = 64 << 20

    def _salvage_past_damage(self, fd: int, size: int, pos: int, fir: int, slots: list,
                             batch, left, progress) -> tuple[int, str]:
        """Damage at ``pos`` inside acknowledged events: find every framed deed after it
        (trying every byte offset past each break), then the last point where a valid
        slot's batch (its ``bat`` deeds, contiguous) has the CRC ``sum``, newest slot
        first: the deeds up to there are committed and added to ``batch``, each break
        before them recorded as a gap and its bytes copied to ``left``.  The search stops
        after CRCs over twice the bytes past ``pos`` (at least 64 MiB).  Returns where the
        committed deeds end and why the bytes after that are not committed."""
        before = batch.next_event - 1 - fir + batch.skipped
        runs: list[list[tuple[int, int]]] = []  # runs of contiguous framed deeds (off, len)
        breaks: list[tuple[int, int]] = []  # (offset, bytes) before each run
        at = pos
        while at < size:
            resume = find_framed_deed(fd, at + 1, size)
            if resume is None:
                break
            ix = OffsetIndex(first=1, end=resume)
            stop = scan_vere_framing(fd, ix, size, 1 << 62)
            ends = list(ix.offsets[1:]) + [stop]
            breaks.append((at, resume - at))
            runs.append([(o, e - o - VERE_DEED_OVERHEAD) for o, e in zip(ix.offsets, ends)])
            at = stop
        deeds = [(r, d) for r, run in enumerate(runs) for d in run]
        found = None
        budget = max(self._COMMIT_SEARCH_BYTES, 2 * (size - pos))
        for c in sorted(slots, key=lambda x: (-x.seq, x.which)):
            for j in range(len(deeds) - 1, c.bat - 2 if c.bat else len(deeds), -1):
                window = deeds[j - c.bat + 1 : j + 1]
                if window[0][0] != window[-1][0]:
                    continue  # a batch never spans a break
                lo = window[0][1][0]
                hi = window[-1][1][0] + window[-1][1][1] + VERE_DEED_OVERHEAD
                budget -= hi - lo
                if budget < 0:
                    break
                if crc_range(fd, lo, hi) == c.sum:
                    found = (j, c)
                    break
            if found is not None or budget < 0:
                break
        if found is None:
            return pos, (f"past damage at offset {pos} inside acknowledged events: no "
                         "valid header slot's batch CRC matches the deeds after it, so "
                         "none of them can be shown committed")
        j, c = found
        kept, done, end, used = j + 1, 0, pos, []
        for r, run in enumerate(runs):
            if done >= kept:
                break
            off, n = breaks[r]
            used.append({"offset": off, "bytes": n, "after_new_event": batch.next_event - 1,
                         "events_lost": "unknown"})
            batch.gaps.append(used[-1])
            left.copy(fd, off, n, kind=recovery.DAMAGED,
                      why="bytes inside acknowledged events that do not frame a deed")
            take = run[: kept - done]
            for o, m in take:
                batch.add(os.pread(fd, m, o + 8), offset=o)
                end = o + m + VERE_DEED_OVERHEAD
                if progress is not None:
                    progress(m + VERE_DEED_OVERHEAD)
            done += len(take)
        if len(used) == 1:  # one break: slot c says how many events it lost
            used[0]["events_lost"] = c.las - fir - before - kept
        return end, (f"past the committed end: slot {c.name}'s batch (up to event "
                     f"{c.las}) ends at offset {end} and its CRC holds; no newer valid "
                     "slot's batch matches the deeds after it")


def _count_framed(fd: int, pos: int, size: int) -> int:
    """How many deeds with sound framing lie in ``[pos, size)``, trying every byte offset
    past each break (a count for the salvage report)."""
    n = 0
    at = pos
    while at < size:
        ix = OffsetIndex(first=1, end=at)
        stop = scan_vere_framing(fd, ix, size, 1 << 62)
        n += ix.count
        if stop >= size:
            break
        nxt = find_framed_deed(fd, stop + 1, size)
        if nxt is None:
            break
        at = nxt
    return n
