"""The payload check as the bytes stream in, and the hole check, of a file being written
into ``new/`` (issues 21 and 33): what its writer's last close is judged by, before the
commit queue (``commit_queue.py``) saves it.  No FUSE here: the adapter (``fs/nodes/new.py``)
feeds each write and asks for the verdict at the close.

The check is fed as the written prefix grows (a write at the end of what was fed so far; a
write elsewhere waits for the close), on the event loop for small writes and, from the
first large one on, in order on a worker thread, so the writer's last close costs about the
end of the scan."""

from __future__ import annotations

from bookfs.fs.append.commit_queue import WorkerThread
from bookfs.fs.append.staging import CHUNK, Staging
from bookfs.noun.payload import PayloadCheck, Problem

#: writes (and rests to scan at close) below this are scanned on the event loop; a larger
#: one moves the file's check to the worker thread for good
INLINE_BYTES = 64 << 10
#: bytes handed to the worker thread and not yet scanned, per file, before a write waits
QUEUED_BYTES = 16 << 20


class PayloadStream:
    """The payload check of one ``new/<N>`` file, fed as its contiguous written prefix
    grows (:meth:`wrote`), finished at its writer's last close (:meth:`verdict`).

    ``fed`` bytes from the start have been handed to the check, in order.  A write at
    ``fed`` is handed over at once: scanned on the event loop while the file's writes are
    small, else queued on ``worker`` (one thread, first in first out, so the order holds),
    with at most :data:`QUEUED_BYTES` waiting.  A write beyond ``fed`` leaves a gap: it and
    what follows are read back from the staging buffer at the close.  A write inside the
    bytes already handed over, a truncate below them, or a write after a close that turned
    out not to be the last (the check was finished) makes the check *stale*: it starts
    over, from the staging buffer, at the next close."""

    def __init__(self, worker: WorkerThread):
        self.worker = worker
        self._reset()
        self.changes = 0  # writes and truncates seen (a verdict is for one state)
        self._verdict: Problem | None | bool = False  # False: none yet

    def _reset(self) -> None:
        self.check = PayloadCheck()
        self.fed = 0
        self.stale = False
        self.threaded = False  # the check is fed on the worker from now on
        self._queued: list[tuple[object, int]] = []  # (done, bytes) handed to the worker

    def _changed(self) -> None:
        self.changes += 1
        if self._verdict is not False:  # finished at a close that was not the last
            self._verdict, self.stale = False, True

    async def wrote(self, off: int, data: bytes) -> None:
        """``data`` was written at ``off`` (the staging buffer holds it)."""
        self._changed()
        if self.stale:
            return
        if off != self.fed:
            self.stale = off < self.fed  # a gap is read back at the close
            return
        self.fed += len(data)
        if not self.threaded and len(data) < INLINE_BYTES:
            self.check.feed(data)
            return
        self.threaded = True
        done, _ = self.worker.submit(self.check.feed, data)
        self._queued.append((done, len(data)))
        queued = self._queued
        while queued and queued[0][0].is_set():
            queued.pop(0)
        while queued and sum(n for _, n in queued) > QUEUED_BYTES:
            await queued[0][0].wait()  # the scan is behind: the writer waits for it
            queued.pop(0)

    def truncated(self, size: int) -> None:
        self._changed()
        if size < self.fed:
            self.stale = True

    async def verdict(self, staging: Staging) -> Problem | None:
        """None if the bytes written are an event's payload, else why not;
        the rest of the scan (what was not fed yet) runs on the worker thread when it is
        large or the check is fed there already."""
        while self._verdict is False:
            changes = self.changes
            if self.stale:
                self._reset()
            start, end = self.fed, len(staging)
            self.fed = end
            if self.threaded or end - start >= INLINE_BYTES:
                self.threaded = True
                verdict = await self.worker.run(self._finish, self.check, staging, start, end)
                self._queued = []
            else:
                verdict = self._finish(self.check, staging, start, end)
            if self.changes == changes:
                self._verdict = verdict
            else:  # written meanwhile (another thread of the writer): again, from scratch
                self.stale = True
        return self._verdict  # type: ignore[return-value]

    @staticmethod
    def _finish(check: PayloadCheck, staging: Staging, start: int,
                end: int) -> Problem | None:
        return check.feed_from(staging.read, start, end, CHUNK)


def hole_refusal(staging: Staging) -> str | None:
    """Why a file with bytes nobody wrote cannot be an event (issue 33, item 2), naming
    its first hole, or None if every byte of it was written."""
    hole = staging.first_hole()
    if hole is None:
        return None
    a, b = hole
    size = len(staging)
    n = staging.written.holes(size)
    more = "" if n == 1 else f", the first of {n:,} holes"
    return (f"bytes {a:,} to {b - 1:,} ({b - a:,} of {size:,}{more}) were never written: "
            "every byte of an event must be written by its writer (a pwrite or lseek past "
            "the end, a gap between writes or a truncate up leaves a hole)")
