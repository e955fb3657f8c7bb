"""``new/<N>``: appends.  Creating ``new/<N>``, writing it and closing it appends event
``N`` to the log.

Caching: ``new/<N>`` entries are never cached and never looked up (``lookup`` answers
ENOENT), so every ``open(O_CREAT)`` reaches ``create``; ``new/`` lists as empty
(``dirs.py``).  While it is written, a file's inode is ``2^48`` plus its handle
(``inodes.py``), its attributes are cached for ``CHANGING`` and its entry not at all.
Writes are ``direct_io``, so the kernel keeps none of their pages.

Durability: ``new/<N>`` commits on the writer's **last** close of the open file, told
from the others by what the kernel sends with each FLUSH and WRITE (the commit rule:
``closer.py`` and docs/reliability.md): the close of a ``dup``, a forked child's exit or
an ``exec``'s copy commits nothing, and a writer killed by a signal commits nothing.
Where the rule cannot tell, the append fails (EIO) with nothing committed.  A close that
returns 0 has its event saved and ``fdatasync``'d, in order, by the ordered group-commit
queue (``commit.py``); ``fsync`` adds nothing.  A write that fails poisons the file: its
last close fails with that errno and nothing is saved.  A file whose last descriptor is
closed by a process other than its writer is abandoned, nothing saved.  The rule needs
the patched pyfuse3 (``request_owner``); on stock pyfuse3 ``new/`` and ``meta/`` writes
are refused (EROFS) with a line that says so (:func:`need_rule`).

Payloads are checked (issue 21; :class:`PayloadStream`): a ``new/<N>`` file must hold a
4-byte mug and a jam that cues completely and exactly, or vere's ram encoding, whatever
the mug (Arvo's after the event: only a replay checks it;
:class:`~bookfs.noun.payload.PayloadCheck`).  The check is fed
as the written prefix grows (a write at the end of what was fed so far; a write
elsewhere waits for the close), on the event loop for small writes and, from the first
large one on, in order on the ``bookfs-check`` worker thread, so the writer's last close
costs about the end of the scan.  A payload that is not one is refused at that close:
EINVAL, nothing saved, the reason (with the byte where parsing failed) in the refusal
record and the log.  ``-o unchecked_payloads`` turns the check off for the mount
(:attr:`NewFiles.checked`); the extended attribute ``user.bookfs.unchecked`` set to ``1``
on an open ``new/<N>`` file (``setxattr``, as ``bookfs append --unchecked`` does) turns it
off for that file.  It is the only extended attribute a ``new/`` file has: setting
another answers ENOTSUP, reading another ENOSYS (as every other node answers, so the
kernel stops asking).

Errors follow DESIGN.md's table (``CommitQueue.reserve``: EINVAL for a name that is not
the next number, EEXIST for one the log holds, ETIMEDOUT for a stalled predecessor); a
create on a read-only mount is EROFS, elsewhere than ``new/`` EROFS (``events/``) or
EPERM.  Refused appends are recorded and shown in ``info`` (a shell ignores close()'s
errno).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time

import pyfuse3

from bookfs.errors import BookError
from bookfs.fs import closer
from bookfs.fs import inodes as I
from bookfs.fs.closer import Writer
from bookfs.fs.commit import HOLD, Reservation, WorkerThread, refuse
from bookfs.fs.nodes.base import CHANGING, Kind
from bookfs.fs.staging import CHUNK, Staging
from bookfs.noun.payload import PayloadCheck, Problem

log = logging.getLogger(__name__)

PROBE_DEADLINE = 10.0  # seconds the commit rule's /proc probe may take (closer.probe)
#: ``BOOKFS_BENCH_SKIP_PROBE=1`` (benchmarks only: bench/bench_append.py's "bookfs-noprobe"
#: source) commits at every close of the writer's table without probing it, so the probe's
#: cost can be measured; it gives up the dup and killed-writer checks.
SKIP_PROBE = bool(os.environ.get("BOOKFS_BENCH_SKIP_PROBE"))


#: the extended attribute that turns the payload check off for one ``new/<N>`` file
UNCHECKED_XATTR = b"user.bookfs.unchecked"
#: writes (and rests to scan at close) below this are scanned on the event loop; a larger
#: one moves the file's check to the worker thread for good
INLINE_BYTES = 64 << 10
#: bytes handed to the worker thread and not yet scanned, per file, before a write waits
QUEUED_BYTES = 16 << 20


# --- the payload check -------------------------------------------------------------------

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


# --- the commit rule, shared with meta/ ----------------------------------------------------

def need_rule(fs, path: str, ctx) -> None:
    """Refuse a write to ``new/`` or ``meta/`` that the commit rule could not judge:
    stock pyfuse3 does not say which process closes a file."""
    if not fs.request_owner and fs.mountpoint:
        raise fs.refusals.refuse(
            path, errno.EROFS, f"{path}: appends and meta writes need pyfuse3 built "
            "with bookfs's patch (bash mount_scripts/setup.sh); stock pyfuse3 does not "
            "say which process closes a file", ctx.pid)


async def closing(fs, writer: Writer | None, inode: int, ctx) -> tuple[str, str]:
    """What this FLUSH is (the commit rule, ``closer.py``): ``(verdict, why)`` with
    verdict COPY (another table: commit nothing), HELD (the writer's table holds
    another descriptor), LAST (commit), KILLED or UNKNOWN (commit nothing; fail).

    Decided from the request where it can be (a copy's close costs no probe); the
    writer's closes are probed off the event loop, with ``PROBE_DEADLINE``.  Without
    a mount (operations driven directly) or a caller (``ctx`` None), every close is
    the last."""
    if writer is None or ctx is None or not fs.mountpoint:
        return closer.LAST, ""
    known = writer.closing(ctx)
    if known is False:
        return closer.COPY, ""
    if SKIP_PROBE:
        return closer.LAST, ""
    try:
        return await fs.prober.run(closer.probe, ctx.pid, writer, inode, fs.mounts,
                                   known, deadline=PROBE_DEADLINE)
    except TimeoutError as e:
        return closer.UNKNOWN, f"the close could not be judged ({e})"


class NewFiles(Kind):
    """``new/<N>`` files being written (a :class:`~bookfs.fs.commit.Reservation` each)."""

    def __init__(self, fs):
        super().__init__(fs)
        #: payloads are checked (False: ``-o unchecked_payloads``, set by ``mount.py``)
        self.checked = True
        self.checker = WorkerThread("bookfs-check")

    async def lookup(self, name: bytes) -> pyfuse3.EntryAttributes:
        # entries are never looked up, so that open(O_CREAT) reaches create
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        fs = self.fs
        r = fs.handle(ino - I.STAGING_BASE)
        if isinstance(r, Reservation):
            return fs.entry_attrs(ino, stat.S_IFREG | fs.modes.staged, len(r.staging),
                                  time.time_ns(),
                                  CHANGING, entry_timeout=0)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def setattr(self, ino: int, attr, fields, fh, ctx) -> pyfuse3.EntryAttributes:
        r = self.fs.handle(ino - I.STAGING_BASE)
        if not isinstance(r, Reservation):
            raise pyfuse3.FUSEError(errno.ENOENT)
        if fields.update_size:
            try:
                r.staging.truncate(attr.st_size)
            except (OSError, BookError) as e:
                r.poison(getattr(e, "errno", None) or errno.EIO)
                raise
            if r.payload is not None:
                r.payload.truncated(attr.st_size)
        return await self.attrs(ino)

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        raise refuse(errno.EBUSY, "an event being written cannot be opened again")

    async def create(self, parent_inode: int, name: bytes, ctx):
        """CREATE anywhere but ``meta/``: an append when ``parent_inode`` is ``new/``."""
        fs = self.fs
        if parent_inode == I.NEW and fs.readonly:  # an append: recorded
            path = f"new/{name.decode('utf-8', 'replace')}"
            raise fs.refusals.refuse(path, errno.EROFS, f"{path}: the mount is read-only",
                                     ctx.pid)
        if fs.readonly:
            raise refuse(errno.EROFS, "the mount is read-only")
        if parent_inode != I.NEW:
            where = {I.EVENTS: "events/", I.ROOT: "/"}.get(parent_inode, "")
            raise refuse(errno.EROFS if parent_inode == I.EVENTS else errno.EPERM,
                         f"cannot create {where}{name.decode('utf-8', 'replace')}: "
                         "append by creating new/<next event number>")
        need_rule(fs, f"new/{name.decode('utf-8', 'replace')}", ctx)
        r = fs.queue.reserve(name, ctx.pid)
        fh = fs.new_fh(r)
        r.writer = Writer(ctx.pid)
        if self.checked:
            r.payload = PayloadStream(self.checker)
        attrs = await self.attrs(I.staging_inode(fh))
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), attrs

    async def write(self, h: Reservation, off: int, buf: bytes, ctx) -> int:
        if h.check is not None:
            await h.judged.wait()  # a close of its writer's table is being judged
        if h.state != "open":
            path = f"new/{h.name}"
            raise self.fs.refusals.refuse(path, errno.EBADF, f"{path}: write of {len(buf)} "
                                          f"bytes at {off} after the file was {h.state}; "
                                          "nothing of it is saved",
                                          None if ctx is None else ctx.pid)
        if ctx is not None:
            h.writer.saw(ctx)
        try:
            n = h.staging.write(off, buf)
        except (OSError, BookError) as e:
            h.poison(getattr(e, "errno", None) or errno.EIO)
            raise
        if h.payload is not None:
            await h.payload.wrote(off, buf)
        return n

    async def flush(self, h: Reservation, fh: int, ctx) -> None:
        """The commit rule for ``new/<N>``: a copy's close returns at once; the writer's
        last close commits and returns the outcome; a killed writer, or a close that
        cannot be judged, fails the append with nothing committed.  The writer's closes
        are probed on the commit thread, in the hand-off of the save itself."""
        fs = self.fs
        if h.state == "failed":
            raise pyfuse3.FUSEError(h.error)
        writer = h.writer
        known = None if ctx is None else writer.closing(ctx)
        if known is False or h.state == "done":
            return  # a copy's close (another table): commits nothing, waits for nothing
        check = None
        if h.state == "open" and known is None and fs.mountpoint:
            # the writer's table is not known yet: another thread closes (the writer's,
            # or a forked child's).  Judged before anything is frozen, since a child's
            # close must not stop the writer's writes.
            verdict, why = await closing(fs, writer, I.staging_inode(fh), ctx)
            if verdict == closer.COPY:
                return
            if verdict != closer.UNKNOWN and not writer.table:
                writer.table = ctx.lock_owner  # a thread of the writer: its table now
            if verdict == closer.HELD:
                if h.poisoned:
                    raise pyfuse3.FUSEError(h.poisoned)
                return
            if verdict in (closer.KILLED, closer.UNKNOWN):
                if h.state == "open":
                    fs.queue.abandon(h, why, errno.EIO)  # noted in the refusals
                raise pyfuse3.FUSEError(errno.EIO)
        elif h.state == "open" and ctx is not None and fs.mountpoint and not SKIP_PROBE:
            check = functools.partial(self._judge_close, ctx.pid, writer,
                                      I.staging_inode(fh), known)
        if h.state == "open" and not h.poisoned:
            # the payload's check, finished before the commit freezes the bytes (nothing
            # awaits in between); refused by the queue only if this close is the last
            why = None if h.payload is None else await h.payload.verdict(h.staging)
            h.refused = None if why is None else (errno.EINVAL, why.refusal)
        if h.state == "failed":
            raise pyfuse3.FUSEError(h.error)
        if not await fs.queue.commit(h, check) and h.poisoned:
            raise pyfuse3.FUSEError(h.poisoned)  # a dup's close: its write failed

    def _judge_close(self, tid: int, writer: Writer, inode: int, known,
                     scans: dict) -> object:
        """The commit queue's check of a writer's close (on the commit thread; ``scans``
        shared by one batch): None to commit, ``HOLD`` if it was not the last close,
        ``(EIO, why)`` to fail."""
        verdict, why = closer.probe(tid, writer, inode, self.fs.mounts, known, scans)
        if verdict == closer.LAST:
            return None
        if verdict in (closer.HELD, closer.COPY):
            return HOLD
        return errno.EIO, why

    # --- extended attributes: the per-file opt-out of the payload check ------------------

    async def setxattr(self, ino: int, name: bytes, value: bytes, ctx) -> None:
        """``user.bookfs.unchecked``: ``1`` turns the payload check off for this file,
        ``0`` on again (unless the mount is ``-o unchecked_payloads``).  Another name
        answers ENOTSUP (not ENOSYS, which would make the kernel stop asking, for every
        file of the mount)."""
        r = self.fs.handle(ino - I.STAGING_BASE)
        if not isinstance(r, Reservation):
            raise pyfuse3.FUSEError(errno.ENOENT)
        if name != UNCHECKED_XATTR:
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        if value not in (b"0", b"1"):
            raise refuse(errno.EINVAL, f"new/{r.name}: {UNCHECKED_XATTR.decode()} is 1 "
                         f"(do not check the payload) or 0, not {value[:20]!r}")
        if r.state != "open":
            raise refuse(errno.EBUSY, f"new/{r.name}: {UNCHECKED_XATTR.decode()} set "
                         f"after the file was {r.state}")
        if value == b"1":
            if r.payload is not None:
                log.info("new/%s: payload check turned off (%s, pid %s)", r.name,
                         UNCHECKED_XATTR.decode(), None if ctx is None else ctx.pid)
            r.payload = None
        elif r.payload is None and self.checked:
            r.payload = PayloadStream(self.checker)
            r.payload.stale = True  # nothing was fed: all of it is read at the close

    async def getxattr(self, ino: int, name: bytes, ctx) -> bytes:
        """``user.bookfs.unchecked``: ``1`` if this file's payload is not checked, else
        ``0``.  Another name answers ENOSYS, as every other node does (the kernel then
        stops asking, for the whole mount)."""
        if name != UNCHECKED_XATTR:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        r = self.fs.handle(ino - I.STAGING_BASE)
        if not isinstance(r, Reservation):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return b"0" if r.payload is not None else b"1"

    def release(self, h: Reservation) -> None:
        try:
            if h.state in ("open", "ready"):
                # no close of the writer committed it (its last holder was a copy, or
                # the writer's last close came while a dup was open elsewhere): nobody
                # was told it was saved, so nothing is
                self.fs.queue.abandon(h, "its last descriptor was closed by a process "
                                         "other than its writer")
        finally:
            h.staging.close()
