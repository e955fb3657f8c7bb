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
This module is the engine, :class:`VereBook`; beside it are ``vere_header.py`` (the slots),
``vere_deeds.py`` (framing scans, batch CRCs), ``vere_recovery.py`` (``bookfs fsck``) and
``detect.py`` (telling this layout from the UIP's); what both Book layouts share is in
``logbase.py``.  It is about 700 lines, over the 600 lines a module should keep to, because the
contract below is stated here in full, and the open-time recovery rule, ``refresh`` (with
what a reader may publish of it) and ``save`` all read and replace the same header state
(``_slots``, ``_active``, ``_seen``), so they stay one class.
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
import time
from collections.abc import Iterable

from bookfs.errors import BookError, ContiguityError, FormatError, TooShort
from bookfs.formats import reports
from bookfs.formats.deeds import VERE, BadDeed
from bookfs.formats.index import OffsetIndex
from bookfs.formats.layout import (
    LOG_NAME,
    META_NAME,
    VERE_DEEDS_START,
    VERE_SLOT_OFFSETS,
    VERE_SLOT_SIZE,
    epoch_of_directory,
)
from bookfs.formats.lock import WriterLock
from bookfs.formats.logbase import SingleFileLog
from bookfs.formats.mark import UNSURE, Mark
from bookfs.formats.vere_deeds import crc_range, is_torn_vere_tail
from bookfs.formats.vere_header import (Slot, durable_slots, initial_log_bytes, parse_slot,
                                         read_header, read_slots)
from bookfs.types import Progress

log = logging.getLogger(__name__)


#: Events of the newest batch get the batch CRC recomputed on every read when the batch's
#: deeds take at most this many bytes.
BATCH_RECHECK_LIMIT = 1 << 20

class EmptyPayload(FormatError):
    """A committed event of a vere log has a 0-byte payload (see :meth:`VereBook.open`)."""

    def __init__(self, message: str, *, event: int, offset: int):
        super().__init__(message)
        self.event = event
        self.offset = offset


class VereBook(SingleFileLog):
    """An open vere-layout log.  Use :meth:`open`; close with :meth:`close` or ``with``.
    The state, meta and read accessors it shares with the UIP layout are in
    ``logbase.py``."""

    DEEDS = VERE
    WHAT = "a vere-layout Book log"
    _NOT_VALID = "committed deeds"
    _QUARANTINED = "are not committed"
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
        #: a reader's newer header states held back as not yet committed: what must
        #: change before they are worth looking at again; None when none is held back
        self._held: tuple | None = None
        self.recovery = reports.VereRecoveryReport()

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
        if empty_payloads and writable:
            raise ValueError("empty_payloads=True is for read-only opens")

        def initial_log(directory: str) -> bytes:
            named = epoch_of_directory(directory)
            if named is not None and epoch is not None and epoch != named:
                raise ValueError(f"{directory}: the directory name says epoch {named}, "
                                 f"but epoch={epoch} was given")
            return initial_log_bytes(named if named is not None else (epoch or 0))

        def load(book: "VereBook") -> None:
            book._empty_ok = empty_payloads
            book._load(progress)
            named = epoch_of_directory(book.directory)
            if named is not None and named != book._fir:
                book.recovery.notes.append(f"{book.log_path}: fir_d is {book._fir} but the "
                                           f"directory is named 0i{named}")

        return cls._open_directory(path, writable, create, lock, initial_log, load)

    #: The 8192 bytes of a fresh log with epoch base ``fir`` (``vere_header.py``).
    initial_log_bytes = staticmethod(initial_log_bytes)

    def _load(self, progress: Progress | None) -> None:
        fd = self._fd
        report = self.recovery
        st = os.fstat(fd)
        size, self._seen_ctime = st.st_size, st.st_ctime_ns
        slots, cands, why = read_header(fd, self.log_path, size)
        best = cands[0]
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
        VERE.scan(fd, index, size, limit=max(c.las - fir for c in cands), progress=progress)

        held = False
        if not self.writable:  # a reader: only the states a writer committed
            gate = self._reader_gate(st, settle=True)
            allowed = [c for c in cands if gate(c, index)]
            if not allowed:  # an unreadable live mark, or a failed sync: rare, passing
                raise BookError(f"{self.log_path}: no header state can be read as committed "
                                "yet (its writer's mark is unreadable, or a sync failed)")
            held, cands, best = len(allowed) < len(cands), allowed, allowed[0]

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
        if end < size and not held:  # (held back: a writer's save not committed yet)
            self._handle_bad_region(end, size, claimed=k < best.las - fir)
        if self.writable and chosen is not best:
            chosen = self._repair_header(index, best, chosen)
            batch = (k - chosen.bat, chosen.sum)
        elif batch is None:
            batch = (k, -1)  # read-only, no header vouches for a batch: framing only
        self._active = chosen
        if self.writable:
            index.verified_end = index.end
        self._seen = None if held else (os.fstat(fd).st_size, b"".join(read_slots(self._fd)))
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
            VERE.scan(self._fd, trial, os.fstat(self._fd).st_size, limit=k, min_len=0)
            if trial.count != k or not self._batch_ok(trial, c):
                continue
            ends = list(trial.offsets[1:]) + [trial.end]
            empty = [(fir + 1 + i, off) for i, (off, nxt) in enumerate(zip(trial.offsets, ends))
                     if VERE.payload_size(off, nxt) == 0]
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

    def _is_torn_tail(self, off: int, size: int) -> bool:
        return is_torn_vere_tail(self._fd, off, size)

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

    # --- what a reader may publish (docs/reliability.md, "What a reader sees") ----------

    def _mark_last(self) -> int:
        return self.las_d

    def _header_witness(self) -> bytes:  # vere rewrites its slots in place
        return b"".join(read_slots(self._fd))

    def _reader_gate(self, st: os.stat_result, *, settle: bool = False):
        """Which header states a reader may publish, as ``gate(slot, index) -> bool``:
        with a live commit mark (``mark.py``), those up to its last event; with none
        (vere itself writes the log, or no one does), those whose slot and deeds this
        reader has made durable itself (:meth:`make_durable`): vere writes the header
        slot before the same ``fdatasync`` as the deeds, so the slot alone says nothing
        of durability (``docs/reliability.md``)."""
        mark = self._look_mark_settled(st) if settle else self.look_mark(st)
        if isinstance(mark, Mark):
            return lambda c, ix: c.las <= mark.last
        if mark is UNSURE:
            published = self.las_d
            return lambda c, ix: c.las <= published
        self._durable_or_wait(st.st_size, self._header_witness())
        return durable_slots(self._fir, *self._synced)

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
        try:
            payload = VERE.read(self._fd, off, n)
        except BadDeed as e:
            self._corrupt(event, off, e.what, e.detail)
        self._check_batch(event, off, i)
        return payload

    def _check_batch(self, event: int, off: int, i: int) -> None:
        _, count, end, b0, bsum = self._view
        if bsum < 0 or i < b0 or b0 >= count:
            return
        start = self._index.offsets[b0]
        if end - start <= BATCH_RECHECK_LIMIT and crc_range(self._fd, start, end) != bsum:
            self._corrupt(event, off, f"batch CRC (events {self._view[0] + b0}.."
                                      f"{self._view[0] + count - 1})")

    def verify_event(self, event: int) -> None:
        """Run :meth:`read`'s checks without holding the payload (constant memory), or raise
        :class:`CorruptDeed`."""
        off, n = self._locate(event)
        i = event - self._view[0]
        try:
            VERE.verify(self._fd, off, n)
        except BadDeed as e:
            self._corrupt(event, off, e.what, e.detail)
        self._check_batch(event, off, i)

    def verify(self, *, progress: Progress | None = None) -> list[tuple[int, int]]:
        """Check every deed's framing and the newest batch's CRC (whatever its size).
        Returns ``(event, offset)`` of each bad deed."""
        first, count, end, b0, bsum = self._view
        offsets = self._index.offsets
        bad = []
        for i in range(count):
            off = offsets[i]
            n = VERE.payload_size(off, offsets[i + 1] if i + 1 < count else end)
            if not VERE.sound(self._fd, off, n):
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
        st = os.fstat(fd)
        size = st.st_size
        raw = read_slots(self._fd)
        unchanged = self._seen == (size, b"".join(raw))
        if self._rewritten_in_place(st, unchanged):
            log.warning("%s was rewritten in place (its ctime moved, its size and header "
                        "did not); re-indexing", self.log_path)
            return self._reindex()
        if unchanged:
            return 0
        ix = self._index
        if size < ix.end:
            log.warning("%s: shrank from %d to %d bytes; re-indexing", self.log_path,
                        ix.end, size)
            return self._reindex()
        slots = [parse_slot(r, w)[0] for w, r in enumerate(raw)]
        cands = sorted((s for s in slots if s and s.fir == self._fir),
                       key=lambda s: (-s.seq, s.which))
        if not cands:
            return 0  # a header being rewritten under us, or damage: look again later
        gate = None
        if not self.writable:  # a reader: only the states a writer committed
            if self._still_held(self._held, st, b"".join(raw)):
                return 0  # held back, and neither the file nor the mark moved since
            held_key = (b"".join(raw), self._held_key(st))
            gate = self._reader_gate(st)
        before = ix.count
        best = cands[0]
        if best.las - self._fir < before or size < ix.end:
            log.warning("%s: the committed log shrank (las_d %d, %d bytes); re-indexing",
                        self.log_path, best.las, size)
            return self._reindex()
        active_seq = self._active.seq if self._active is not None else -1
        if before and (best.seq < active_seq or (
                best.seq > active_seq and best.las - best.bat - self._fir < before) or any(
                c.seq == active_seq and c != self._active for c in cands)):
            # a newer header whose batch covers events we already published (an append only
            # ever adds batches after them), a header older than ours, or the active state
            # changed in place (a writer writes the other slot; an undo restores it)
            log.warning("%s: header slot %s (seq %d) rewrote events from %d on; re-indexing",
                        self.log_path, best.name, best.seq, best.las - best.bat + 1)
            return self._reindex()
        VERE.scan(fd, ix, size, limit=max(c.las - self._fir for c in cands))
        if gate is not None:
            allowed = [c for c in cands if gate(c, ix)]
            if len(allowed) < len(cands):
                self._held = held_key
                if not allowed or allowed[0].las - self._fir < before:
                    ix.truncate(before)  # nothing newer committed yet: look again later
                    return 0
                cands = allowed
                best = cands[0]
            else:
                self._held = None
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
        if chosen is best and self._held is None:
            self._seen = (size, b"".join(raw))
        added = k - before
        if added:
            ix.note_growth(ix.first + before, time.time_ns())
        self._publish((k - chosen.bat, chosen.sum))
        return added

    def _reindex(self) -> int:
        before = self.count
        old = (self._index, self._view, self._slots, self._active, self.recovery,
               self._synced)
        self.recovery = reports.VereRecoveryReport()
        self._synced = (0, b"")  # another log: nothing of it is known durable yet
        try:
            self._load(None)
        except BookError:
            (self._index, self._view, self._slots, self._active, self.recovery,
             self._synced) = old
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
            sm = VERE.write(fd, payloads, start)
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
        for p in payloads:
            offsets.append(off)
            off += VERE.size(len(p))
        ix.end = ix.verified_end = off
        self._slots[target] = new
        self._active = new
        self._publish((b0, sm))
        self._publish_mark()
        self._seen = (os.fstat(fd).st_size, b"".join(read_slots(self._fd)))
        ix.note_growth(first_event, time.time_ns())

    def _undo(self, start: int, size_before: int, target: int, old_slot: bytes) -> None:
        try:
            if len(old_slot) == VERE_SLOT_SIZE:
                os.pwrite(self._fd, old_slot, VERE_SLOT_OFFSETS[target])
            os.ftruncate(self._fd, min(start, size_before))
            os.fsync(self._fd)
        except OSError as e:  # pragma: no cover - the disk is failing under us
            log.error("%s: could not undo a failed save: %s", self.log_path, e)

    # --- closing -------------------------------------------------------------------------

    def close(self, save: bool = True) -> None:
        """Close the files and release the lock.  (``save`` is accepted for compatibility
        with :meth:`Book.close`; there is no persisted index to save.)"""
        self._close_files()
