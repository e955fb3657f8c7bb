"""What a reader is given: only what is committed (docs/reliability.md, "What a reader
sees"; DESIGN.md: "committed means durable and acknowledged").

Every reader of a log (a read-only mount, a read-write mount's companion, ``bookfs info``,
``show``, Spark through a mount) publishes an event only once it is committed:

* **a live bookfs writer's commit mark** (``mark.py``) says how far: the writer rewrites
  it after each save has returned (written, ``fdatasync``'d, acknowledged), so a reader
  never serves a deed whose sync has not returned, nor one whose save failed and was cut
  back;
* **with no live mark** (the log's writer is vere, an older bookfs or nobody), the
  format's own commit point (the UIP layout: whole deeds whose CRC holds; vere's layout:
  the header slot whose last batch checks; LMDB: the newest meta page's transaction),
  once this reader has made those bytes durable itself with an ``fdatasync`` of its own
  descriptor.  A power cut can then not take back what a reader was given.  Whether the
  writer *acknowledged* it cannot be known without a mark; vere acknowledges an event only
  after that same sync returned and exits on a failed one, and its next open keeps what
  is durable (``docs/reliability.md`` cites ``pkg/vere/db/book.c``), so what the reader
  serves is what the log holds and keeps.

:class:`CommittedReads` is the reader half that the engines share (``SingleFileLog`` for
both Book layouts, ``LmdbLog``): looking at the mark, the reader's own sync, and the
rewrite-in-place test.  Each engine decides, with these, what of its scan it publishes.
This module knows nothing of FUSE.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from bookfs.formats.mark import UNSURE, Mark, MarkReader

log = logging.getLogger(__name__)

__all__ = ["CommittedReads", "Mark", "UNSURE"]


class CommittedReads:
    """A reader's side of "only what is committed" (module docstring).  The engine calls
    :meth:`_init_reads` in ``__init__`` and provides ``log_path``, ``writable``,
    :meth:`_sync_fd` (the descriptor an ``fdatasync`` makes durable) and
    :meth:`_header_witness` (header bytes that a writer rewrites in place, if any)."""

    #: A reader that finds no live commit mark makes new bytes durable itself before it
    #: publishes them: inside ``refresh`` (True, the default: tools), or, when False,
    #: in :meth:`make_durable`, which the caller runs off its event loop whenever
    #: ``wants_sync`` is set (the FUSE follower's periodic look), then refreshes again.
    inline_sync = True

    def _init_reads(self, marks: MarkReader | None) -> None:
        self._marks = marks
        #: this reader's own proof of durability: the log's size (an LMDB epoch: its
        #: newest transaction id) and header bytes as they were just *before* its last
        #: ``fdatasync`` that succeeded (:meth:`make_durable`)
        self._synced: tuple[int, bytes] = (0, b"")
        self._seen_ctime: int | None = None  # the log's ctime at the last look
        #: set by a ``refresh`` with ``inline_sync`` off that held bytes back until they
        #: are durable: the caller runs :meth:`make_durable`, then refreshes again
        self.wants_sync = False

    def _sync_fd(self) -> int:
        raise NotImplementedError

    def _header_witness(self) -> bytes:
        return b""

    def _durable_witness(self) -> tuple[int, bytes]:
        """What an ``fdatasync`` started now will cover: the size and the header."""
        return os.fstat(self._sync_fd()).st_size, self._header_witness()

    # --- the mark ------------------------------------------------------------------------

    def look_mark(self, st: os.stat_result | None = None) -> Mark | object | None:
        """The live commit mark of this log (``mark.py``): a :class:`Mark`; ``UNSURE``
        (a live writer's record that could not be read whole: publish nothing new);
        ``None`` when no bookfs writer publishes one for this file."""
        if self._marks is None:
            return None
        return self._marks.look(st if st is not None else os.fstat(self._sync_fd()))

    def _look_mark_settled(self, st: os.stat_result) -> Mark | object | None:
        """:meth:`look_mark`, looked at again for up to 20 ms while ``UNSURE`` (a writer
        between taking its mark and writing it, or a rewrite: microseconds), for an open
        that has no earlier view to fall back on."""
        mark = self.look_mark(st)
        for _ in range(20):
            if mark is not UNSURE:
                break
            time.sleep(0.001)
            mark = self.look_mark(st)
        return mark

    # --- the reader's own sync -----------------------------------------------------------

    def is_durable(self, end: int, header: bytes = b"") -> bool:
        """Whether this reader's own ``fdatasync`` covered the bytes up to ``end`` (an
        LMDB epoch: the transaction ``end``) and the header bytes ``header`` (as read
        before asking)."""
        size, head = self._synced
        return end <= size and (not header or header == head)

    def make_durable(self) -> bool:
        """Make what the log holds now durable (``fdatasync`` of the reader's own
        descriptor: the kernel writes every dirty page of the file, whoever dirtied it,
        and waits for them, ``mm/filemap.c``, ``file_write_and_wait_range()``), and
        remember what that covers: the size and header as they were *before* the call.
        True when it did.  A filesystem that cannot hold dirty pages answers EINVAL (no
        ``fsync``: ``fs/sync.c``, ``vfs_fsync_range()``) or EROFS: nothing there can be
        lost, so that counts as durable.  EIO and the like: nothing is published, and
        the next look tries again (the error is reported to this descriptor alone:
        ``mm/filemap.c``, ``file_check_and_advance_wb_err()``)."""
        before = self._durable_witness()
        try:
            os.fdatasync(self._sync_fd())
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EROFS):
                log.warning("%s: could not make what a writer wrote durable (%s); "
                            "serving nothing new until it is", self.log_path, e.strerror)
                return False
        self._synced = before
        return True

    def _durable_or_wait(self, end: int, header: bytes = b"") -> bool:
        """For a reader with no live mark: True once the bytes up to ``end`` (and
        ``header``) are durable, syncing here when ``inline_sync``; else False and
        ``wants_sync`` set."""
        if self.is_durable(end, header):
            return True
        if self.inline_sync:
            return self.make_durable() and self.is_durable(end, header)
        self.wants_sync = True
        return False

    def _committed_limit(self, end: int, floor: int, st: os.stat_result, *,
                         settle: bool = False) -> tuple[int, tuple | None]:
        """For a log of whole deeds scanned up to byte ``end``: ``(limit, held)``, the
        byte up to which a reader may publish (what a live mark says; with no live mark,
        ``end`` once durable, else what this reader's last sync covered; never below
        ``floor``, what is published already) and, when that holds deeds back, what
        must change before they are worth scanning again (:meth:`_held_key`)."""
        mark = self._look_mark_settled(st) if settle else self.look_mark(st)
        if isinstance(mark, Mark):
            limit = mark.end
        elif mark is UNSURE:
            limit = floor
        elif self._durable_or_wait(end):
            limit = end
        else:
            limit = self._synced[0]
        limit = max(limit, floor)
        return limit, (None if limit >= end else self._held_key(st, mark))

    def _still_held(self, held: tuple | None, st: os.stat_result, extra=None) -> bool:
        """Whether bytes held back (``held``: their :meth:`_held_key`, paired with
        ``extra`` if given) need no new look: nothing moved, and this caller cannot make
        them durable now (one that syncs inline can, where no live mark holds them)."""
        if held is None:
            return False
        mark = self.look_mark(st)
        if mark is None and self.inline_sync:
            return False
        key = self._held_key(st, mark)
        return held == (key if extra is None else (extra, key))

    def _held_key(self, st: os.stat_result, mark=False) -> tuple:
        """What must change before held-back bytes are worth looking at again: the
        file's size, the mark's ``seq`` (or that it is gone), or this reader's sync."""
        if mark is False:
            mark = self.look_mark(st)
        return (st.st_size, mark.seq if isinstance(mark, Mark) else repr(mark),
                self._synced)

    # --- rewritten in place --------------------------------------------------------------

    def _rewritten_in_place(self, st: os.stat_result, unchanged: bool) -> bool:
        """For a reader: whether the log was written without anything a writer's append
        explains.  ``unchanged``: the size (and header, for vere's layout; the newest
        transaction, for LMDB) are as at the last look.  Every write, truncate or ``cp``
        over the file, and every ``touch``, sets its ctime to the current time, and no
        system call sets it to anything else (``fs/attr.c``, ``notify_change()``;
        ``fs/inode.c``, ``inode_set_ctime_current()``), so a ctime that moved while the
        rest stayed is a rewrite in place (another log of the same size, or a ``touch``
        after one), unless a live bookfs writer explains it (the undo of a failed save
        restores the size).  A ctime that moved with growth is an append: the engine's
        stamp (header and last published deed) catches a rewrite that also grew.
        Remembers ``st``'s ctime for the next look."""
        ctime, self._seen_ctime = self._seen_ctime, st.st_ctime_ns
        if self.writable or ctime is None or ctime == st.st_ctime_ns or not unchanged:
            return False
        return self.look_mark(st) is None
