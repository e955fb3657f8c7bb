"""The exceptions bookfs raises.  Every message is one line that names the file (where there
is one) and says what was expected and what was found."""

from __future__ import annotations

import errno as _errno
import logging


class BookError(Exception):
    """Base class of every bookfs error.  ``errno`` is what the FUSE layer answers with."""

    errno = _errno.EIO


class UsageError(BookError):
    """A request that does not fit: arguments that contradict each other or what is on
    disk.  Nothing was done.  The ``bookfs`` command prints it as one line and exits 2
    (``bookfs.cli.args``)."""

    errno = _errno.EINVAL


class FormatError(BookError):
    """A file is not a log bookfs can open (bad magic, bad version, too short, ...)."""

    errno = _errno.EINVAL


class NotRegularFile(FormatError):
    """A FIFO, socket, device or directory where a regular file (``book.log``,
    ``meta.bin``, a lock file) belongs; the message names the path and what was found."""


class BadMagic(FormatError):
    """The first four bytes are not the Book magic."""


class BadVersion(FormatError):
    """A format version this code does not read."""


class TooShort(FormatError):
    """A file shorter than its fixed header."""


class UnsupportedLayout(FormatError):
    """A recognised layout that bookfs refuses (the padded January 2026 layout, vere's)."""


class MetaError(BookError):
    errno = _errno.EINVAL


class BadMetaKey(MetaError):
    errno = _errno.ENOENT


class BadMetaSize(MetaError):
    errno = _errno.EINVAL


class MetaAbsent(MetaError):
    """``meta.bin`` is missing and the log was opened read-only: the meta reads as absent."""

    errno = _errno.ENOENT


class BadMetaFile(MetaError):
    """A ``meta.bin`` that is not exactly 256 bytes."""


class ContiguityError(BookError):
    """A save that would leave a gap or overwrite an event.  Nothing was written."""

    errno = _errno.EINVAL


class PayloadError(BookError):
    """A payload under 4 bytes (EINVAL) or larger than the format allows (EFBIG)."""

    errno = _errno.EINVAL


class PayloadTooLarge(PayloadError):
    errno = _errno.EFBIG


class CorruptDeed(BookError):
    """A deed whose CRC or framing fails.  Its bytes are never returned as data."""

    errno = _errno.EIO

    def __init__(self, message: str, *, event: int | None = None, offset: int | None = None):
        super().__init__(message)
        self.event = event
        self.offset = offset


class NoSuchEvent(BookError, LookupError):
    errno = _errno.ENOENT


class LockHeld(BookError):
    """Another process holds the writer lock; the message names it."""

    errno = _errno.EBUSY


class PathEscape(BookError):
    """A log file that resolves outside its directory (a symlink elsewhere, say)."""

    errno = _errno.EPERM


class UnsafeDirectory(BookError):
    """A directory bookfs keeps private files in (daemon logs, the index cache) that is
    not a real directory owned by this user and closed to others' writes."""

    errno = _errno.EPERM


class ReadOnly(BookError):
    errno = _errno.EROFS


class Refused(BookError):
    """A request bookfs turns down on purpose, with its own ``errno``: an append or a meta
    write refused (the contiguity rule, a payload that is no event, a close that is not
    the writer's), a file of an older generation of the log (ESTALE), ...  Built by
    :func:`refuse`, which logs the reason once; the FUSE adapter answers its ``errno``
    without logging it again (``fs/ops.py``, ``guarded``), and ``bookfs append`` prints
    it.  Nothing was changed."""

    def __init__(self, err: int, message: str):
        super().__init__(message)
        self.errno = err


def refuse(err: int, message: str) -> Refused:
    """Log a refusal once, in one line, and build the :class:`Refused` to raise."""
    logging.getLogger("bookfs.refused").warning(
        "refused (%s): %s", _errno.errorcode.get(err, err), message)
    return Refused(err, message)
