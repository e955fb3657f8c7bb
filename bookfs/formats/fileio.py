"""Small file-I/O helpers shared by the format modules.

Every file bookfs opens inside a log directory, or writes anywhere, is opened through
:func:`open_regular` (or created through :func:`create_new`): a planted symlink is never
followed for a write, and a FIFO, socket, device or directory where a regular file belongs
is refused with one clear line instead of hanging the open (a FIFO blocks ``open`` until a
writer appears) or raising ``IsADirectoryError``.  :func:`pwritev_all` writes buffers
contiguously with as few syscalls as it can.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

from bookfs.errors import NotRegularFile, PathEscape, UnsafeDirectory
from bookfs.formats.layout import CREATING_SUFFIX, FILE_MODE


def _kind(mode: int) -> str:
    """What a non-regular file is, in words, for error messages."""
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return word
    return "not a regular file"


def _refuse(path: str, found: str):
    raise NotRegularFile(f"{path}: {found}, expected a regular file; refusing it")


def open_regular(path: str, flags: int, mode: int = FILE_MODE, *,
                 follow: bool = False) -> int:
    """``os.open(path, flags, mode)`` for a file that must be a regular file; returns the fd.

    * Never blocks on a FIFO and never follows a symlink (``O_NOFOLLOW``) unless
      ``follow=True`` is given (only for read-only opens whose target the caller has
      checked, e.g. with :func:`bookfs.formats.logbase.contained`); a symlink refused this way
      raises :class:`PathEscape`.
    * The opened file is ``fstat``-checked: a directory, FIFO, socket or device raises
      :class:`NotRegularFile` (a :class:`FormatError`) naming the path and what it found.
    * ``O_CLOEXEC`` is always added.  Other ``OSError``\\ s (``FileNotFoundError``, ...)
      propagate unchanged.
    """
    if follow and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
        raise ValueError("follow=True is only for read-only opens")
    extra = os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise PathEscape(f"{path}: a symlink; bookfs does not follow symlinks for "
                             "files it writes (expected a regular file)") from None
        if e.errno in (errno.EISDIR, errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
            try:
                found = _kind(os.stat(path).st_mode)
            except OSError:
                found = "not a regular file"
            _refuse(path, found)
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _refuse(path, _kind(st.st_mode))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_new(path: str, mode: int = FILE_MODE) -> int:
    """Create ``path`` for writing, exclusively (``O_CREAT | O_EXCL``, so nothing that is
    already there, a symlink included, is ever opened or followed); returns the fd, with
    ``mode`` applied regardless of umask.  A stale *regular* file at ``path`` (a temp file
    left by a crash) is unlinked first; anything else there (a symlink, FIFO, directory)
    raises :class:`NotRegularFile` and is left alone."""
    st = None
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            _refuse(path, _kind(st.st_mode))
        os.unlink(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
    except FileExistsError:  # planted between the lstat and the open
        _refuse(path, _kind(os.lstat(path).st_mode))
    os.fchmod(fd, mode)
    return fd


def private_dir(path: str, what: str, *, create: bool = True) -> str:
    """``path``, created 0700 (parents too) if missing and ``create``; raises
    :class:`UnsafeDirectory` (one line naming ``what`` the directory is for) unless it is
    a real directory, not a symlink, owned by this user and not writable by group or
    others.  ``FileNotFoundError`` when it is missing and ``create`` is false."""
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UnsafeDirectory(f"{path}: the {what} must be a directory (not a symlink) owned "
                              f"by uid {os.getuid()} and not writable by others")
    return path


def pread_into(fd: int, buf: bytearray, size: int, offset: int) -> memoryview:
    """Read up to ``size`` bytes at ``offset`` into the reusable ``buf`` (no allocation, no
    fresh page faults per chunk); returns a view of the bytes read."""
    view = memoryview(buf)
    got = os.preadv(fd, [view[:size]], offset)
    return view[:got]


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a create, rename or unlink in it) durable."""
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def publish_dir(staged: str, dest: str) -> None:
    """Move the finished directory ``staged`` to ``dest`` (absent, or an empty directory)
    with one ``rename``, then fsync ``dest``'s parent: a reader finds either nothing at
    ``dest`` or the whole result, never part of it.  The caller has made ``staged``'s
    contents durable, and it lies on ``dest``'s filesystem (beside it)."""
    if os.path.isdir(dest) and not os.path.islink(dest):
        os.rmdir(dest)  # empty, or this raises: nothing is ever overwritten
    os.rename(staged, dest)
    fsync_dir(os.path.dirname(os.path.abspath(dest)))


def create_files(directory: str, files: list[tuple[str, bytes]]) -> None:
    """Create each missing ``(path, content)`` atomically and durably: written to a fresh
    ``<path>.creating`` temp file (:func:`create_new`: exclusive, mode 0644 regardless of
    umask, never through a planted symlink), fsync'd, renamed into place, then the
    directory fsync'd.  Existing files are left alone."""
    made = False
    for path, content in files:
        if os.path.lexists(path):
            continue
        tmp = path + CREATING_SUFFIX
        fd = create_new(tmp)
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        made = True
    if made:
        fsync_dir(directory)


_IOV_MAX = 1024  # buffers per pwritev (IOV_MAX)
_JOIN_LIMIT = 1 << 20  # buffers adding up to less than this are joined into one write


def pwritev_all(fd: int, bufs: list, off: int) -> int:
    """Write ``bufs`` contiguously at ``off`` with as few syscalls as possible (one
    ``pwritev`` per 1024 buffers; small batches joined first), resuming short writes.
    Returns the offset after them."""
    if not bufs:
        return off
    if len(bufs) > 1 and sum(len(b) for b in bufs) <= _JOIN_LIMIT:
        bufs = [b"".join(bufs)]
    for i in range(0, len(bufs), _IOV_MAX):
        group = bufs[i : i + _IOV_MAX]
        want = sum(len(b) for b in group)
        written = os.pwritev(fd, group, off)
        off += written
        if written < want:  # short write: continue from where it stopped
            rest = memoryview(b"".join(bytes(b) for b in group))[written:]
            while rest:
                k = os.pwrite(fd, rest, off)
                if k == 0:
                    raise OSError(errno.EIO, "short write")
                off += k
                rest = rest[k:]
    return off
