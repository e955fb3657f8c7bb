"""The single-writer lock.

A writable log is guarded by an exclusive lock on byte 0 of a lock file: ``book.lock`` beside
a plain log, or the runtime's own ``.vere.lock`` for a pier, so bookfs and a running ship
never write at once.  The lock is an open-file-description lock (``F_OFD_SETLK``): it belongs
to the open file, not to the process, so closing some other descriptor of the same file in
this process (a reader, say) cannot drop it, and it conflicts with the classic ``fcntl``
record lock the Urbit runtime takes.  The kernel releases it when the holder dies.

The holder writes its PID (first line, as the runtime does) and a description into the file,
so a refused writer can say who holds it.

Which lock guards a log does not depend on the path it was opened by:
:func:`lock_path_for` walks up from any path inside a pier (the pier, ``.urb/log``, an
epoch directory, a Book directory anywhere below it) to the pier's ``.vere.lock``, so a
mount of a pier and a mount of one of its epochs can never both be writers.  Only a Book
directory that is not inside a pier uses its own ``book.lock``.

Lock files are opened with ``O_NOFOLLOW`` and must be regular files
(``fileio.open_regular``): a ``book.lock`` planted as a symlink to ``book.log`` is refused,
never truncated.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
import sys

from bookfs.errors import BookError, LockHeld
from bookfs.formats.fileio import open_regular
from bookfs.formats.layout import FILE_MODE, LOCK_NAME, PIER_LOG_DIR, VERE_LOCK_NAME

_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
_FLOCK = struct.Struct("@hhqqi4x")


def _flock(kind: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, 0, 1, 0)


def enclosing_pier(path: str | os.PathLike) -> str | None:
    """The pier directory (one holding ``.urb/log/``) that ``path`` is or lies inside, after
    resolving symlinks; ``None`` if there is none.  The nearest enclosing pier wins."""
    d = os.path.realpath(os.fspath(path))
    while True:
        if os.path.isdir(os.path.join(d, PIER_LOG_DIR)):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def lock_path_for(source: str | os.PathLike) -> str:
    """The writer-lock file that guards the log at ``source``, whatever path names it: the
    enclosing pier's ``.vere.lock`` for a pier, its ``.urb/log``, an epoch directory or any
    directory inside a pier (see :func:`enclosing_pier`); else ``source/book.lock``."""
    pier = enclosing_pier(source)
    if pier is not None:
        return os.path.join(pier, VERE_LOCK_NAME)
    return os.path.join(os.fspath(source), LOCK_NAME)


def describe_holder(path: str) -> str:
    """What the lock file says about its holder (PID and command), or a plain fallback."""
    try:
        fd = open_regular(path, os.O_RDONLY)
        try:
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    except (OSError, BookError):  # missing, a symlink, a FIFO: say nothing
        text = ""
    if not text:
        return "an unknown process"
    lines = text.splitlines()
    pid = lines[0].strip()
    rest = " ".join(line.strip() for line in lines[1:]).strip()
    return f"pid {pid}" + (f" ({rest})" if rest else "")


class WriterLock:
    """An exclusive, non-blocking writer lock on ``path`` (created 0644 if missing).

    ``WriterLock(path)`` either holds the lock or raises :class:`LockHeld` naming the holder.
    A ``path`` that is a symlink, FIFO, directory or device raises (:class:`PathEscape`,
    :class:`NotRegularFile`) without touching anything.  ``release()`` (or the context
    manager) drops it; so does the holder's death.
    """

    def __init__(self, path: str, *, what: str = "bookfs"):
        self.path = path
        try:  # a lock file we create is 0644 regardless of umask
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, FILE_MODE)
            os.fchmod(fd, FILE_MODE)
        except FileExistsError:  # someone else's (or a stale one): leave its mode
            fd = open_regular(path, os.O_RDWR)
        try:
            fcntl.fcntl(fd, _F_OFD_SETLK, _flock(fcntl.F_WRLCK))
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise LockHeld(
                    f"{path}: the log is locked for writing by {describe_holder(path)}"
                ) from None
            raise
        self._fd: int | None = fd
        note = f"{os.getpid()}\n{what} on {socket.gethostname()}: {' '.join(sys.argv)[:300]}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)

    @staticmethod
    def is_held(path: str) -> bool:
        """True if some open file description holds the lock on ``path`` (readers' probe)."""
        try:
            fd = open_regular(path, os.O_RDONLY)
        except (FileNotFoundError, BookError):  # missing, or not a lock file
            return False
        try:
            res = fcntl.fcntl(fd, _F_OFD_GETLK, _flock(fcntl.F_RDLCK))
            return _FLOCK.unpack(res)[0] != fcntl.F_UNLCK
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):  # the holder note is a courtesy
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the description drops the lock

    def __enter__(self) -> "WriterLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
