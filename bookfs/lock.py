"""The single-writer lock.

A writable log is guarded by an exclusive lock on byte 0 of a lock file: ``book.lock`` beside
a plain log, or the runtime's own ``.vere.lock`` for a pier, so bookfs and a running ship
never write at once.  The lock is an open-file-description lock (``F_OFD_SETLK``): it belongs
to the open file, not to the process, so closing some other descriptor of the same file in
this process (a reader, say) cannot drop it, and it conflicts with the classic ``fcntl``
record lock the Urbit runtime takes.  The kernel releases it when the holder dies.

The holder writes its PID (first line, as the runtime does) and a description into the file,
so a refused writer can say who holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
import sys

from .errors import LockHeld
from .layout import FILE_MODE

_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
_FLOCK = struct.Struct("@hhqqi4x")


def _flock(kind: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, 0, 1, 0)


def describe_holder(path: str) -> str:
    """What the lock file says about its holder (PID and command), or a plain fallback."""
    try:
        with open(path, "rb") as f:
            text = f.read(4096).decode("utf-8", "replace").strip()
    except OSError:
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
    ``release()`` (or the context manager) drops it; so does the holder's death.
    """

    def __init__(self, path: str, *, what: str = "bookfs"):
        self.path = path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
            os.fchmod(fd, FILE_MODE)  # a lock file we create is 0644 regardless of umask
        except FileExistsError:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)  # someone else's: leave its mode
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
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
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
