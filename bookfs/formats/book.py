"""The Book storage engine: one append-only event log in the UIP's layout.

A Book is a directory holding ``book.log`` and ``meta.bin`` (layouts in ``layout.py``).
Its ``bookfs fsck`` is ``book_recovery.py``; what it shares with vere's layout (opening,
the published view, bad-region handling, meta, writes) is ``logbase.py``.  No FUSE here.

Contract
--------
* **Readers** (``writable=False``) take no lock and never modify any file.  They see only
  whole deeds whose framing holds and whose CRC has been checked: ``read`` checks the CRC
  of every deed it returns, ``refresh`` checks new deeds before exposing them.
* **One writer** (``writable=True``) holds an exclusive lock (``lock.py``); a second one is
  refused with :class:`LockHeld` naming the holder.
* **Durability**: ``fir_d`` is written and ``fdatasync``'d before the first deed; each
  ``save`` writes its whole batch with one ``pwritev`` where possible and ``fdatasync``s
  before returning; ``save_meta`` ``fsync``s.  A failed write (ENOSPC, EIO) is undone by
  cutting the file back, so the log is exactly as before, and the error is raised.
* **Recovery** on a writable open follows ``recovery.py``: a torn tail is cut, anything
  else past the valid prefix is quarantined first.  A writable open checks the CRC of
  every deed the persisted index has not seen verified (all of them on a cold open).
* **Index**: 8 bytes an event, persisted outside the pier, validated on open (``index.py``).
* **Memory** does not grow with event size: ``read_slice`` and ``verify_event`` stream.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from bookfs.formats import deedcheck, reports
from bookfs.errors import (BadMagic, BadVersion, BookError, ContiguityError, TooShort,
    UnsupportedLayout)
from bookfs.formats.index import (FileStamp, OffsetIndex, discard_index, load_index,
    save_index)
from bookfs.formats.datecolumn import DateColumn, fill
from bookfs.formats.deeds import UIP, BadDeed
from bookfs.formats.framing import confirm_chain, newest_deeds, walk_ahead
from bookfs.formats.layout import (FIR_OFFSET, HEADER, HEADER_SIZE, LOG_NAME, MAGIC,
    META_NAME, VERSION)
from bookfs.formats.detect import epoch_says_vere, identify_fd, looks_padded, slot_crc_ok
from bookfs.formats.lock import WriterLock
from bookfs.formats.seals import Seal, Sealer
from bookfs.formats.logbase import SingleFileLog
from bookfs.types import Progress

log = logging.getLogger(__name__)



class Blob(Protocol):
    """A payload that need not fit in memory (a staged ``new/`` file, say): its length and
    its bytes in bounded chunks, repeatable."""

    def __len__(self) -> int: ...

    def chunks(self) -> Iterator[bytes]: ...

class Book(SingleFileLog):
    """An open Book log.  Use :meth:`open`; close with :meth:`close` or ``with``.  The
    state, meta and read accessors it shares with vere's layout are in ``logbase.py``."""

    DEEDS = UIP
    WHAT = "a Book log"

    def __init__(self, directory: str, fd: int, meta_fd: int | None, writable: bool,
                 lock: WriterLock | None):
        super().__init__(directory, LOG_NAME, META_NAME, fd, meta_fd, writable, lock)
        self._view = (0, 0, HEADER_SIZE)
        self._seen_size = 0
        self._stamp = b""  # see _read_stamp
        self.recovery = reports.RecoveryReport()
        self._index_dirty = False
        self._dates_saved = 0  # dates the persisted index holds (persist_dates)
        self._index_untrusted = False  # a read found the index wrong: never persist it
        #: The log as it was when every deed below ``verified_end`` was last known good
        #: (``index.FileStamp``); ``None``: persist no stamp, so no later writable open
        #: trusts the mark.
        self._vstamp: FileStamp | None = None
        #: Held by ``save`` and by a rebuild after an index was found to lie.
        self._mutex = threading.RLock()
        #: ``offsets[0 .. _chain_ok]`` are confirmed deed starts: built by a framing scan,
        #: or walked (each ``len_d`` spans exactly to the next offset) from the header.
        #: A persisted index is only a hint until this walk reaches the event read.
        self._chain_ok = 0
        #: a reader's deeds held back as not yet committed: what must change before they
        #: are worth scanning again (``_held_key``); None when none is held back
        self._held: tuple | None = None
        self._sealer = Sealer(UIP)  # large deeds' block CRCs, kept beside the index

    # --- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, writable: bool = False, create: bool = False, *,
             lock: bool = True, progress: Progress | None = None,
             use_index_cache: bool = True, persist: bool = True) -> "Book":
        """Open the log in directory ``path``.

        ``create=True`` (needs ``writable``) makes the directory's ``book.log`` (header with
        ``fir_d = 0``) and ``meta.bin`` (zeros) if missing.  A writable open takes the
        writer lock :func:`bookfs.formats.lock.lock_path_for` names: the enclosing pier's
        ``.vere.lock`` when ``path`` lies inside a pier (an epoch), else ``book.lock``;
        ``lock=False`` skips it for a caller that already holds it (a writable pier).
        Raises a :class:`FormatError` subclass for a file that is not a Book log
        (:class:`NotRegularFile` for a FIFO, directory, ... where a file belongs),
        :class:`LockHeld` if another writer holds the lock, :class:`PathEscape` for a file
        that resolves outside ``path`` (or any symlink, for a writable open).
        ``progress`` is called with byte counts during long scans.
        ``persist=False``: an index built or grown by the open is not saved yet; the
        caller saves it once, with what it adds (:meth:`save_card`, :meth:`save_index`,
        or :meth:`close`), rather than twice.
        """
        return cls._open_directory(
            path, writable, create, lock, lambda _: HEADER.pack(MAGIC, VERSION, 0),
            lambda book: book._load(progress, use_index_cache, persist))

    def _read_header(self, size: int) -> int:
        if size <= 48:  # too short for a whole vere slot: only identification may decide
            identify_fd(self._fd, self.log_path, epoch_says_vere(self.directory))
        if size < HEADER_SIZE:
            raise TooShort(f"{self.log_path}: {size} bytes, under the {HEADER_SIZE}-byte header")
        head = os.pread(self._fd, 48, 0)
        magic, version, fir = HEADER.unpack_from(head)
        if magic != MAGIC:
            raise BadMagic(f"{self.log_path}: magic {magic:#010x}, expected {MAGIC:#010x} (BOOK)")
        if version != VERSION:
            raise BadVersion(f"{self.log_path}: version {version}, expected {VERSION}")
        slot_b = os.pread(self._fd, 48, 4096) if size >= 4096 + 48 else b""
        if slot_crc_ok(head) or (slot_b[:8] == head[:8] and slot_crc_ok(slot_b)):
            raise UnsupportedLayout(
                f"{self.log_path}: this is vere's two-slot Book layout (header CRC matches), "
                "not the UIP layout this engine reads"
            )
        return fir

    def _load(self, progress: Progress | None, use_cache: bool, persist: bool = True) -> None:
        fd = self._fd
        st = os.fstat(fd)
        size, self._seen_ctime = st.st_size, st.st_ctime_ns
        fir = self._read_header(size)
        cached = load_index(self.log_path, fd, size) if use_cache else None
        if cached is not None and cached.first != fir and cached.count:
            cached = None
        if cached is not None and self.writable and cached.stamp is None:
            # A writer appends behind every deed: it trusts no mark and no offsets that do
            # not speak of this file's current contents (index.FileStamp), so the log was
            # written since (or the stamp was racy): check it all, as a first open does.
            log.info("%s: changed since its index was saved (size, mtime or ctime); a "
                     "writable open checks every deed again", self.log_path)
            cached = None
        while True:
            index = cached or OffsetIndex(first=fir)
            if cached is None:
                index.times.append((fir, os.fstat(fd).st_mtime_ns))
            index.first = fir
            before = index.count
            self._index = index
            if fir == 0 and size > HEADER_SIZE:
                end = HEADER_SIZE  # deeds without a first event number cannot be numbered
                self.recovery.notes.append(
                    f"{self.log_path}: fir_d is 0 but data follows the header")
            else:
                end = UIP.scan(fd, index, size, progress=progress)
            if cached is None or end == size:
                break
            # Damage past a persisted index: never cut or quarantine on a cache's word.
            log.info("%s: the framing breaks after the persisted index; rebuilding it",
                     self.log_path)
            cached = None
        self._chain_ok = 0 if cached is not None else index.count
        self._dates_saved = len(index.dates)
        if end == HEADER_SIZE and size > HEADER_SIZE and looks_padded(self._fd, size):
            raise UnsupportedLayout(
                f"{self.log_path}: deeds use the padded January 2026 layout (len_d + 28 bytes); "
                "bookfs refuses it: convert it with the C code that wrote it"
            )
        # CRC checks: a writer checks everything not yet known good; a reader, the last deed.
        if self.writable:
            start_i = _first_at_or_after(index.offsets, index.verified_end)
            bad = deedcheck.first_bad_deed(fd, index.offsets, start_i, index.end,
                                          progress=progress)
        elif index.count and index.verified_end < index.end:
            i = index.count - 1
            ok = UIP.sound(fd, index.offsets[i], index.payload_size(index.first + i))
            bad = None if ok else i
        else:
            bad = None
        if bad is not None:
            index.truncate(bad)
        good_end = index.end
        if good_end < size:
            self._handle_bad_region(good_end, size)
        if self.writable:
            index.verified_end = index.end
            self._vstamp = FileStamp.of(os.fstat(fd))
        else:
            self._vstamp = cached.stamp if cached is not None else None
        self._seen_size = os.fstat(fd).st_size
        if not self.writable:
            self._keep_committed(index, HEADER_SIZE, settle=True)
        self._publish()
        if index.count != before or index.end != self._seen_size:
            self._index_dirty = True
        if index.count > before and before:
            index.note_growth(index.first + before, time.time_ns())
        if not use_cache:
            self._index_dirty = True
        if self._index_dirty and persist:
            self._persist_index()

    def _is_torn_tail(self, off: int, size: int) -> bool:
        return deedcheck.is_torn_tail(self._fd, off, size)

    def _persist_index(self, card: bytes | None = None) -> None:
        if not self._index_untrusted:
            save_index(self.log_path, self._fd, self._index, self._vstamp, card)
            self._dates_saved = len(self._index.dates)
        self._index_dirty = False

    def save_card(self, card: bytes) -> None:
        """Persist the index as it is now with ``card`` beside it (``index.py``: a fleet
        mount's figures of this log, ``formats/shipcard.py``).  Like every save of the
        index: atomic, and a failure is logged, not raised."""
        self._persist_index(card)

    def save_index(self) -> None:
        """Persist the index now if it changed since it was last saved (an open with
        ``persist=False``); atomic, and a failure is logged, not raised."""
        if self._index_dirty:
            self._persist_index()

    def fstat(self) -> os.stat_result:
        """``fstat`` of the open ``book.log``."""
        return os.fstat(self._fd)

    def _publish(self) -> None:
        self._publish_view(self._index.end)
        self._stamp = self._read_stamp()

    def _read_stamp(self) -> bytes:
        """The header and the last published deed's CRC and ``let_d``: if a later look
        finds them different, published events were rewritten (a writer's recovery)."""
        ix = self._index
        tail = UIP.tail_before(self._fd, ix.end) if ix.count else b""
        return os.pread(self._fd, HEADER_SIZE, 0) + tail

    def _rebuild(self, why: str) -> int:
        """Throw the view away and index the log again from its start (no cache); bump
        ``generation``.  Returns how many more events than before there are (0 or more)."""
        log.warning("%s %s; re-indexing it from scratch", self.log_path, why)
        before = self.count
        old, synced = self._index, self._synced
        self._index = OffsetIndex()
        self._seen_size = 0
        self._synced = (0, b"")  # another log: nothing of it is known durable yet
        self.recovery = reports.RecoveryReport()
        try:
            self._load(None, use_cache=False)
        except BookError:
            self._index, self._synced = old, synced
            raise
        finally:
            self.generation += 1
        return max(0, self.count - before)

    # --- state ---------------------------------------------------------------------------

    @property
    def format(self) -> str:
        return "book-v1 (UIP layout)"

    # --- reading ---------------------------------------------------------------------------

    def read(self, event: int) -> bytes:
        """The payload of ``event`` (mug ++ jam), after checking its CRC.

        Raises :class:`NoSuchEvent` or :class:`CorruptDeed` (with the event and offset).
        Holds the whole payload in memory: use :meth:`read_slice` for large events.
        """
        off, n = self._locate(event)
        if self._confirm_offset(event, event - self._view[0]):
            off, n = self._locate(event)  # the index was rebuilt
        try:
            return UIP.read(self._fd, off, n)
        except BadDeed as e:
            self._corrupt(event, off, e.what, e.detail)

    def _confirm_offset(self, event: int, i: int) -> bool:
        """Walk the chain of deeds from the last confirmed offset through deed ``i`` (one
        8-byte ``pread`` per deed, once per log open): each ``len_d`` must span exactly
        to the next indexed offset (the last deed's, to the published end), so an index
        loaded from the cache can never point a read at another event's deed, nor give
        an event another's size.  A break means the persisted index lied: it is
        discarded, in memory and on disk, the log is indexed again from its header
        (:meth:`_index_lied`), and True is returned: the caller locates ``event`` again
        and serves it from the rebuilt index."""
        k = self._chain_ok
        if i < k:
            return False
        seen = self._index
        count, end = self._view[1], self._view[2]
        k = confirm_chain(self._fd, seen.offsets, k, i, count, end, UIP.overhead)
        if self._index is seen:  # (a walk in another thread may have gone further)
            self._chain_ok = max(self._chain_ok, k)
        if k <= i:
            self._index_lied(event, seen.offsets[k], seen)
            return True
        return False

    def _index_lied(self, event: int, at: int, seen: OffsetIndex) -> None:
        """The persisted index this log was opened with disagrees with the log's framing
        at offset ``at``: delete its file, throw the in-memory index away and index the
        log's published bytes again from the header, as a first open does (a writer also
        checks every CRC again: it trusted the same index's mark).  The new index takes
        the old one's place in one assignment.  ``generation`` stays: every event served
        so far (its size or its bytes) lies in the confirmed chain, which the new index
        repeats offset for offset, so nothing a mount cached changes (only the count may
        grow, which a mount follows as growth).  If the bytes do not index cleanly
        (damage the lying index hid), the log is reloaded as by a first open
        (:meth:`_rebuild`, which does bump ``generation``).  Raises
        :class:`CorruptDeed` only if that fails too.  ``seen``: the index found lying (if
        another thread has replaced it meanwhile, nothing is left to do)."""
        if self._index is not seen:
            return
        log.warning("%s: its persisted index disagrees with the log's framing at offset %d "
                    "(read of event %d); discarding it and indexing the log again",
                    self.log_path, at, event)
        discard_index(self.log_path, self._fd)
        with self._mutex:  # never beside a save: a writer's rebuild rereads the end
            if self._index is not seen:
                return  # another thread rebuilt it first
            old = self._index
            end = self._view[2]
            fresh = OffsetIndex(first=old.first, times=list(old.times))
            UIP.scan(self._fd, fresh, end)
            clean = fresh.end == end and (not self.writable or deedcheck.first_bad_deed(
                self._fd, fresh.offsets, 0, fresh.end) is None)
            try:
                if not clean:
                    self._rebuild(f"has a persisted index that hid damage at offset {at}")
                    return
            except BookError as e:
                self._index_dirty = False
                self._index_untrusted = True
                self._corrupt(event, at, "index", f"the persisted index disagrees with the "
                              f"log's framing and the log could not be indexed again: {e}")
            fresh.verified_end = fresh.end if self.writable else HEADER_SIZE
            self._index = fresh
            self._chain_ok = fresh.count
            self._publish()
            self._index_untrusted = False
            self._index_dirty = True
            if self.writable:
                self._vstamp = FileStamp.of(os.fstat(self._fd))
            self._persist_index()

    def chain_confirmed(self, event: int) -> bool:
        """True when the chain of deeds is confirmed through ``event`` (or ``event`` is not
        in the log): reading it, or its size, walks none first (:meth:`_confirm_offset`)."""
        return not 0 <= event - self._view[0] < self._view[1] or \
            event - self._view[0] < self._chain_ok

    def confirm_to(self, event: int, ahead: bool = True) -> None:
        """Walk the chain of deeds through ``event`` now (:meth:`_confirm_offset`: up to
        the whole log, once an open), and ``ahead``, on past it by up to one step of the
        walk (:func:`~bookfs.formats.framing.walk_ahead`), for a caller that runs it off
        its event loop (``fs/nodes/events.py``), once a step rather than once an event of
        a forward read.  :class:`NoSuchEvent` if it is not in the log."""
        self._locate(event)
        i = event - self._view[0]
        if not self._confirm_offset(event, i) and ahead:  # (True: the index was rebuilt)
            self._confirm_offset(event, walk_ahead(self._index.offsets, i, self._view[1]))

    def payload_size(self, event: int) -> int:
        """Bytes of ``event``'s payload (mug + jam), from the index, once the chain of deeds
        up to it is confirmed (:meth:`_confirm_offset`): what a mount answers as the
        event's size must be the deed's, or the kernel would cut or pad its reads."""
        self._locate(event)
        self._confirm_offset(event, event - self._view[0])
        return self._locate(event)[1]

    def verify_event(self, event: int) -> None:
        """Check ``event``'s framing (``len_d``, ``let_d``: the deed is the one the index
        names) and its CRC by streaming its deed (constant memory), or raise
        :class:`CorruptDeed`.  A later :meth:`read_slice` of it is then safe.  Always the
        whole check, a kept seal or not (it also keeps the deed's seal)."""
        self.seal(event, fresh=True)

    def seal(self, event: int, *, fresh: bool = False) -> Seal | None:
        """:meth:`verify_event`, which for a large deed also gives its seal: the one kept
        from an earlier check of this very deed (not if ``fresh``), else one made in the
        same pass (``seals.py``).  None for a deed under ``seals.SEALED_FROM``."""
        off, n = self._locate(event)
        if self._confirm_offset(event, event - self._view[0]):
            off, n = self._locate(event)  # the index was rebuilt
        try:
            return self._sealer.seal(self._fd, self.log_path, event, off, n, fresh=fresh)
        except BadDeed as e:
            self._corrupt(event, off, e.what, e.detail)

    def newest_heads(self, most: int, size: int) -> Iterator[bytes]:
        """The first ``size`` bytes of the payloads of up to ``most`` of the newest deeds,
        newest first, each CRC-checked, found from the published end back without the
        index (:func:`~bookfs.formats.framing.newest_deeds`).  For a caller that wants
        the log's newest payloads and not their event numbers (``info``'s dates): a few
        reads whatever the log's size, where a read by number first confirms the index's
        chain of deeds up to it (:meth:`_confirm_offset`: the whole log, once an open)."""
        _, count, end = self._view
        floor = self._index.offsets[0] if count else end
        for start, n in newest_deeds(self._fd, floor, end, most, overhead=UIP.overhead):
            if not UIP.sound(self._fd, start, n):
                return
            yield UIP.payload_at(self._fd, start, min(size, n))

    def verify(self, *, progress: Progress | None = None) -> list[tuple[int, int]]:
        """Check every deed's CRC.  Returns ``(event, offset)`` of each bad deed.  The chain
        of deeds is confirmed first (:meth:`_confirm_offset`), so an index that lied is
        rebuilt rather than reported as damage."""
        if self.count:
            self._confirm_offset(self.last, self.count - 1)
        ix = self._index
        bad, seals = [], []  # each large deed is sealed in the same pass (seals.py)
        i = 0
        while True:
            k = deedcheck.first_bad_deed(self._fd, ix.offsets, i, ix.end, progress=progress,
                                         seals=seals)
            if k is None:
                self._sealer.keep(self._fd, self.log_path, [(ix.first + j, s)
                                                            for j, s in seals])
                return bad
            bad.append((ix.first + k, ix.offsets[k]))
            i = k + 1

    def refresh(self) -> int:
        """Pick up deeds another process appended.  Only whole deeds whose CRC checks are
        exposed; a deed still being written is left for a later call.  Returns how many
        events were added.  If the log was rewritten under us (it shrank, its header or
        the last published deed's tail changed, or, for a reader, a rename replaced it),
        the view is rebuilt from scratch and ``generation`` grows.  Cheap (an ``fstat``, a
        ``stat`` and two small ``pread`` calls) when the log has not changed."""
        if self._reopen_if_replaced():
            return self._rebuild("was replaced (a new file at its path)")
        st = os.fstat(self._fd)
        size = st.st_size
        ix = self._index
        if size < ix.end:
            return self._rebuild(f"shrank from {ix.end} to {size} bytes")
        if ix.count and self._read_stamp() != self._stamp:
            return self._rebuild("was rewritten (its header or last published deed changed)")
        if self._rewritten_in_place(st, size == self._seen_size):
            return self._rebuild("was rewritten in place (its ctime moved, its size did not)")
        if size == self._seen_size and (self._held is None
                                        or self._still_held(self._held, st)):
            return 0
        if not ix.offsets:
            (_, _, fir) = HEADER.unpack(os.pread(self._fd, HEADER_SIZE, 0))
            if fir == 0:
                self._seen_size = size
                return 0
            ix.first = fir
        before = ix.count
        published_end = ix.end
        UIP.scan(self._fd, ix, size)
        # expose only deeds whose CRC checks; stop at the first that does not (yet)
        bad = deedcheck.first_bad_deed(self._fd, ix.offsets, before, ix.end)
        if bad is not None:
            ix.truncate(bad)
        scanned_end = ix.end
        if not self.writable:
            self._keep_committed(ix, published_end, st=st)
        if bad is None and scanned_end == size:  # all consumed; else look again next time
            self._seen_size = size
        added = ix.count - before
        if added:
            ix.note_growth(ix.first + before, time.time_ns())
            self._index_dirty = True
        self._publish()
        return added

    def _keep_committed(self, ix: OffsetIndex, floor: int, *, st=None,
                        settle: bool = False) -> None:
        """A reader keeps only the committed deeds of ``ix`` (each whole and CRC-checked;
        ``committed.py``), never fewer than those ending at ``floor`` (published: nothing
        is taken back on a mark's word).  Deeds held back are looked at again once the
        file, the mark or this reader's sync moved (``_held``)."""
        st = st if st is not None else os.fstat(self._fd)
        limit, self._held = self._committed_limit(ix.end, floor, st, settle=settle)
        if limit < ix.end:
            ix.truncate(max(0, bisect.bisect_right(ix.offsets, limit) - 1))

    # --- writing ---------------------------------------------------------------------------

    def save(self, first_event: int, payloads: Iterable[bytes], epoch: int = 0) -> None:
        """Append ``payloads`` as events ``first_event, first_event + 1, ...``, durably.

        Contiguity: an empty log takes ``epoch + 1`` first; otherwise ``last + 1``.  A
        violation raises :class:`ContiguityError`, a payload under 4 bytes
        :class:`PayloadError`, one over 2^32 :class:`PayloadTooLarge`; nothing is written.
        On a write or sync error the file is cut back to exactly its state before the call
        and the ``OSError`` is raised.
        """
        with self._mutex:
            self._save(first_event, payloads, epoch)

    def _save(self, first_event: int, payloads: Iterable[bytes], epoch: int) -> None:
        payloads = self._checked_payloads(first_event, payloads)
        if not payloads:
            return
        ix = self._index
        expected = ix.last + 1 if ix.offsets else epoch + 1
        if first_event != expected:
            what = f"the log ends at event {ix.last}" if ix.offsets else (
                f"the log is empty and the epoch is {epoch}")
            raise ContiguityError(f"{self.log_path}: cannot save event {first_event}: {what}, "
                                  f"so the next event must be {expected}")
        fd = self._fd
        start = ix.end
        was_empty = not ix.offsets
        # only a log nobody else wrote since it was known good stays vouched for
        known = self._vstamp is not None and FileStamp.of(os.fstat(fd)) == self._vstamp
        self._vstamp = None
        try:
            if was_empty:
                os.pwrite(fd, struct.pack("<Q", first_event), FIR_OFFSET)
                os.fdatasync(fd)
            UIP.write(fd, payloads, start)
            os.fdatasync(fd)
        except OSError:
            self._undo(start, was_empty)
            raise
        if was_empty:
            ix.first = first_event
            ix.times[:] = []
        offsets = ix.offsets
        off = start
        for p in payloads:
            offsets.append(off)
            off += UIP.size(len(p))
        ix.end = ix.verified_end = off
        if known:
            self._vstamp = FileStamp.of(os.fstat(fd))
        self._publish()
        self._publish_mark()
        self._seen_size = off
        ix.note_growth(first_event, time.time_ns())
        self._index_dirty = True
        ix.dates.record(len(offsets) - len(payloads), payloads)  # the writer's dates

    # --- dates (datecolumn.py) -----------------------------------------------------------

    @property
    def dates(self) -> DateColumn:
        """The dates of the first ``len(dates)`` events, persisted with the index."""
        return self._index.dates

    def fill_dates(self, most: int, stop=None) -> int:
        """The date pass over up to ``most`` published events past the column's end
        (``datecolumn.fill``; safe in a worker thread).  Returns how many were added."""
        ix = self._index
        last = self.gulf()[1]
        end = min(last, ix.first + len(ix.dates) + most - 1)
        return fill(self, ix.dates, ix.first, end, stop=stop) if last else 0

    def persist_dates(self) -> None:
        """Persist the index if it holds dates its saved file does not (the date pass
        calls this when it catches up; ``close`` does too)."""
        with self._mutex:
            if len(self._index.dates) != self._dates_saved and self._fd >= 0:
                self._persist_index()

    def _undo(self, start: int, was_empty: bool) -> None:
        try:
            os.ftruncate(self._fd, start)
            if was_empty:
                os.pwrite(self._fd, struct.pack("<Q", 0), FIR_OFFSET)
            os.fsync(self._fd)
        except OSError as e:  # pragma: no cover - the disk is failing under us
            log.error("%s: could not undo a failed save: %s", self.log_path, e)

    # --- closing -------------------------------------------------------------------------

    def close(self, save: bool = True) -> None:
        """Persist the index (if it changed), close the files and release the lock."""
        if self._fd < 0:
            return
        if save and (self._index_dirty or len(self._index.dates) != self._dates_saved):
            self._persist_index()
        self._index.dates.close()
        self._close_files()


def _first_at_or_after(offsets, pos: int) -> int:
    import bisect

    return bisect.bisect_left(offsets, pos)
