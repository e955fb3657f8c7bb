"""The commit mark: how a bookfs writer tells readers in other processes what is committed.

**Why.**  A reader of a log (a read-only mount, a read-write mount's companion, a tool)
sees a writer's bytes as soon as they are in the page cache, before the writer's
``fdatasync`` has returned, and even when that ``fdatasync`` then fails and the writer
cuts the bytes back.  DESIGN.md's readers are given only what is *committed*: written,
``fdatasync``'d, and acknowledged by the writer's save.  Nothing in the UIP layout says
that (it has no commit record), and vere's header slot is written before the same
``fdatasync`` as the deeds (``docs/reliability.md``, "What a reader sees").  So every
bookfs writer publishes a *mark*: after each save has returned (the deeds and, for vere's
layout, the header are durable), it rewrites one small record, ``.bookfs-mark``, beside
its writer lock (``layout.py`` has the bytes): the file it speaks of (``st_dev``,
``st_ino``), the end of the last committed deed and the last committed event.

**Liveness.**  The writer holds an open-file-description write lock on byte 0 of the mark
file for as long as it has the log open; the kernel drops it when the writer closes it or
dies (``fs/locks.c``, ``locks_remove_file()`` on the last close of the description).  A
reader asks with ``F_OFD_GETLK`` whether anyone holds it.  So a reader tells three cases
apart (:meth:`MarkReader.look`):

* a **live mark** for this very file: serve exactly what it says, never more;
* a locked mark file whose record cannot be read whole (being rewritten, or not yet
  written by a writer that is starting): serve nothing new, look again;
* **no live mark** for this file (none, an unlocked one left by a writer that is gone, or
  one that speaks of another file, such as another epoch of the pier): the log has no
  bookfs writer, and the reader applies the format's own commit point after making the
  bytes durable itself (``SingleFileLog``'s ``_make_durable``).

A stale record is never wrong, only late: it says of bytes that they *were* committed,
which stays true.  The record is rewritten in place with one ``pwrite``; a read that
races it can see a mix of two records, which its CRC rejects, and the reader looks again.
Nothing syncs the mark: it only has to be seen by readers on this host while its writer
lives; after a crash it is either stale (true) or gone, and the next writer publishes a
new one once its recovery is done.

Cost: one ``pwrite`` of 56 bytes per save for the writer; one ``pread`` and one
``fcntl`` for a reader that found new bytes in the log.  This module knows nothing of
FUSE.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
from typing import NamedTuple

from bookfs.formats.layout import (
    FILE_MODE,
    MARK_BODY,
    MARK_CRC,
    MARK_MAGIC,
    MARK_NAME,
    MARK_SIZE,
    MARK_VERSION,
    crc32,
)

log = logging.getLogger(__name__)

__all__ = ["Mark", "MarkReader", "MarkWriter", "UNSURE", "mark_path_for"]

_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
_FLOCK = struct.Struct("@hhqqi4x")


def _flock(kind: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, 0, 1, 0)


def mark_path_for(directory: str | os.PathLike) -> str:
    """The mark file of the log in ``directory``: beside the writer lock that guards it
    (:func:`bookfs.formats.lock.lock_path_for`), so every path a writer may be given for
    one log (a pier, an epoch, a Book directory inside a pier) names one mark."""
    from bookfs.formats.lock import lock_path_for

    return os.path.join(os.path.dirname(lock_path_for(directory)), MARK_NAME)


class Mark(NamedTuple):
    """A live writer's word: every deed ending at or before ``end`` is committed, and
    event ``last`` is the last committed one.  ``seq`` grows with every update."""

    end: int
    last: int
    seq: int


class _Unsure:
    """A live writer's mark that could not be read whole: publish nothing new."""

    def __repr__(self) -> str:
        return "UNSURE"


UNSURE = _Unsure()


def pack(dev: int, ino: int, seq: int, end: int, last: int) -> bytes:
    body = MARK_BODY.pack(MARK_MAGIC, MARK_VERSION, dev, ino, seq, end, last)
    return body + MARK_CRC.pack(crc32(body))


def unpack(raw: bytes) -> tuple[int, int, Mark] | None:
    """``(dev, ino, mark)`` of a whole record, ``None`` for anything else."""
    if len(raw) < MARK_SIZE:
        return None
    body = raw[: MARK_BODY.size]
    (crc,) = MARK_CRC.unpack_from(raw, MARK_BODY.size)
    if crc32(body) != crc:
        return None
    magic, version, dev, ino, seq, end, last = MARK_BODY.unpack(body)
    if magic != MARK_MAGIC or version != MARK_VERSION:
        return None
    return dev, ino, Mark(end, last, seq)


class MarkWriter:
    """A writer's mark (module docstring).  :meth:`claim` it once the log is open and
    recovered, :meth:`publish` after every save that returned, :meth:`release` at close.
    A mark that cannot be claimed (the directory is not writable, or another open file
    description holds the lock) is logged and left: the writer works on, and its readers
    treat the log as one without a bookfs writer."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._dev = self._ino = 0
        self._seq = 0

    @classmethod
    def claim(cls, directory: str, log_fd: int, end: int, last: int) -> "MarkWriter":
        """Take the mark of the log in ``directory`` (open on ``log_fd``) and publish
        ``end``/``last`` as its committed state."""
        mark = cls(mark_path_for(directory))
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(mark.path, flags, FILE_MODE)
        except OSError as e:
            log.warning("%s: cannot publish the commit mark (%s); readers in other "
                        "processes make what they read durable themselves", mark.path,
                        e.strerror)
            return mark
        try:
            import stat

            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            if st.st_size == 0:
                os.fchmod(fd, FILE_MODE)  # ours: readable by whoever may read the log
            fcntl.fcntl(fd, _F_OFD_SETLK, _flock(fcntl.F_WRLCK))
        except OSError as e:
            os.close(fd)
            log.warning("%s: cannot publish the commit mark (%s); readers in other "
                        "processes make what they read durable themselves", mark.path,
                        e.strerror)
            return mark
        lst = os.fstat(log_fd)
        mark._fd, mark._dev, mark._ino = fd, lst.st_dev, lst.st_ino
        old = unpack(os.pread(fd, MARK_SIZE, 0))
        if old is not None and old[:2] == (lst.st_dev, lst.st_ino):
            mark._seq = old[2].seq  # one count across writers of this file
            if old[2][:2] == (end, last):
                return mark  # already says so: a writable open that wrote nothing
        mark.publish(end, last)
        return mark

    @property
    def held(self) -> bool:
        return self._fd is not None

    def publish(self, end: int, last: int) -> None:
        """Say that every deed up to byte ``end`` (event ``last``) is committed.  Call it
        only after the save that wrote them returned; never fails the save (a mark that
        cannot be written makes readers wait, which the next publish ends)."""
        if self._fd is None:
            return
        self._seq += 1
        try:
            os.pwrite(self._fd, pack(self._dev, self._ino, self._seq, end, last), 0)
        except OSError as e:  # pragma: no cover - the disk is failing under us
            log.error("%s: cannot update the commit mark: %s", self.path, e)

    def release(self) -> None:
        """Drop the lock (closing the description drops it); the record stays, true."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class MarkReader:
    """A reader's view of the mark of the log in ``directory`` (module docstring).  Holds
    the mark file open once it exists, so a writer's later rename or removal of the
    name does not hide a live mark from this reader."""

    def __init__(self, directory: str):
        self.path = mark_path_for(directory)
        self._fd: int | None = None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                             | os.O_NONBLOCK)
            except OSError:
                return None
            import stat

            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return None
            self._fd = fd
        return self._fd

    def look(self, st: os.stat_result) -> Mark | _Unsure | None:
        """The live mark for the log file ``st`` describes (an ``fstat`` of the reader's
        descriptor): a :class:`Mark`; :data:`UNSURE` when its writer lives but its record
        could not be read whole three times running; ``None`` when no live writer
        publishes a mark for this file."""
        fd = self._open()
        if fd is None:
            return None
        for _ in range(3):
            try:
                raw = os.pread(fd, MARK_SIZE, 0)
                res = fcntl.fcntl(fd, _F_OFD_GETLK, _flock(fcntl.F_RDLCK))
            except OSError:
                return None
            if _FLOCK.unpack(res)[0] == fcntl.F_UNLCK:
                return None  # its writer is gone (or never was)
            got = unpack(raw)
            if got is None:
                continue  # being rewritten, or a writer that has not written it yet
            dev, ino, mark = got
            if (dev, ino) != (st.st_dev, st.st_ino):
                return None  # a live writer of another file (another epoch of the pier)
            return mark
        return UNSURE

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
