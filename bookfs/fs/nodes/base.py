"""What every kind of node shares: cache timeouts, permissions, the :class:`Kind` base.

Cache timeouts (each kind's docstring says which it uses and why):

* ``FOREVER`` (a day): immutable entries and attributes (``events/<N>``, a complete
  segment, the names of the fixed directories and files);
* ``CHANGING`` (1 s): attributes an append changes (a directory's size and mtime,
  ``meta/*``'s mtime).  Without attribute caching on directories,
  ``default_permissions`` would cost a round trip per directory on every path walk;
* ``GROWING`` (0): files whose size an append changes (``info``, the last segment):
  every ``stat`` asks, so ``tail -f`` (which polls ``fstat``) sees the new size.

Permissions: the mount uses ``default_permissions``; owner, group and modes come from the
source log file (and its directory's search bits), so only users who could write the log
can append through ``new/`` or write ``meta/``, and only users who could read it can read.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, NamedTuple

import pyfuse3

from bookfs.fs.commit import refuse

if TYPE_CHECKING:
    from bookfs.fs.ops import BookOperations

FOREVER = 24 * 3600.0  # cache timeout for immutable entries (seconds)
CHANGING = 1.0  # attribute timeout for things an append changes (seconds)
GROWING = 0.0  # attribute timeout for files whose size an append changes


class Modes(NamedTuple):
    """Permission bits of the mount's files, derived from the source (``source_modes``)."""

    read: int  # events, segments, info files
    dir: int  # events/, meta/, epochs/, the root
    new: int  # new/: search and list for readers, create for writers
    meta: int  # meta/<key>
    staged: int  # a new/<N> being written


def _source_file(book) -> str:
    """The file whose owner and mode stand for the log: the newest epoch's log for a
    pier, ``book.log`` (or LMDB's ``data.mdb``) otherwise."""
    epochs = getattr(book, "epochs", None)
    if epochs:
        book = epochs[-1].log
    for attr in ("log_path", "data_path"):
        path = getattr(book, attr, None)
        if path and os.path.exists(path):
            return path
    data = os.path.join(book.directory, "data.mdb")
    return data if os.path.exists(data) else book.directory


def source_modes(book, readonly: bool, *, owner: tuple[int | None, int | None] = (None, None),
                 umask: int | None = None) -> tuple[int, int, Modes]:
    """``(uid, gid, modes)`` for the mount: the source log file's owner, and its mode
    bits for each class (user, group, other), dropped for a class that cannot search the
    log's directory.  Write bits are dropped on a read-only mount.  With the kernel's
    ``default_permissions`` this lets exactly the users who could read the log read the
    mount, and the users who could write it append (root is, as always, exempt).

    The mount options ``uid=``/``gid=`` (``owner``) replace the owner and group, and
    ``umask=`` replaces the log's mode bits with ``0o777 & ~umask`` (then the same rules:
    read bits for files, search where readable, write only on a read-write mount)."""
    return modes_of(_source_file(book), book.directory, readonly, owner=owner,
                    umask=umask)[:3]


def modes_of(path: str, directory: str, readonly: bool, *,
             owner: tuple[int | None, int | None] = (None, None),
             umask: int | None = None) -> tuple[int, int, Modes, os.stat_result]:
    """:func:`source_modes` of a log whose source file (the file whose owner and mode
    stand for it) is ``path`` and whose directory is ``directory``, and that file's
    ``stat``: what a fleet mount shows of a ship whose log is not open."""
    st = os.stat(path)
    mode = st.st_mode & 0o777
    dst = os.stat(os.path.dirname(path) if path != directory else path)
    if (dst.st_uid, dst.st_gid) == (st.st_uid, st.st_gid):
        for shift in (6, 3, 0):
            if not (dst.st_mode >> shift) & 1:
                mode &= ~(7 << shift)
    if umask is not None:
        mode = 0o777 & ~umask
    r = mode & 0o444
    w = 0 if readonly else mode & 0o222
    rx = r | (r >> 2)
    modes = Modes(read=r, dir=rx, new=rx | w | (w >> 1), meta=r | w, staged=w)
    uid, gid = owner
    return (st.st_uid if uid is None else uid), (st.st_gid if gid is None else gid), modes, st


def make_attrs(uid: int, gid: int, ino: int, mode: int, size: int, mtime_ns: int,
               timeout: float, nlink: int = 1, entry_timeout: float | None = None
               ) -> pyfuse3.EntryAttributes:
    """One node's attributes as every mount answers them: owner ``uid``/``gid``, 4 KiB
    blocks, atime = ctime = mtime, the attribute ``timeout`` (and the entry's, unless
    ``entry_timeout``)."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = ino
    a.st_mode = mode
    a.st_nlink = nlink
    a.st_uid, a.st_gid = uid, gid
    a.st_size = size
    a.st_blksize = 4096
    a.st_blocks = (size + 511) // 512
    a.st_atime_ns = a.st_ctime_ns = a.st_mtime_ns = mtime_ns
    a.attr_timeout = timeout
    a.entry_timeout = timeout if entry_timeout is None else entry_timeout
    return a


class BytesHandle:
    """A snapshot served to readers (``info``, a meta field, a rendering)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


def negative() -> pyfuse3.EntryAttributes:
    """A negative entry the kernel may cache: for names that can never exist."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = 0
    a.entry_timeout = FOREVER
    return a


class Kind:
    """One kind of node: the handlers the dispatcher (:mod:`bookfs.fs.ops`) routes the
    inodes of its range to.  The defaults are the answers for a kind that does not do
    the request (and for an inode no kind owns): no such file (``attrs``, ``open``), not
    readable (``read_inode``: EBADF), fixed attributes (``setattr``)."""

    def __init__(self, fs: BookOperations):
        self.fs = fs
        self.book = fs.book

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        """GETATTR (and the attributes a lookup answers)."""
        raise pyfuse3.FUSEError(errno.ENOENT)

    def existing(self, event: int) -> int:
        """``event``, once the log holds it: an event not seen yet makes the follower look
        at the log once (a writer may just have committed it); still absent, ENOENT."""
        if event not in self.book:
            self.fs.follower.follow()
            if event not in self.book:
                raise pyfuse3.FUSEError(errno.ENOENT)
        return event

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        """OPEN (on a mount that answers opens; ``writing``: the flags that would)."""
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        """A READ with no open behind it (fh 0: the no-open path)."""
        raise pyfuse3.FUSEError(errno.EBADF)

    async def setattr(self, ino: int, attr, fields, fh, ctx) -> pyfuse3.EntryAttributes:
        """SETATTR: a node's attributes are fixed unless its kind says otherwise."""
        if fields.update_size:
            raise refuse(errno.EROFS, f"inode {ino}: events are immutable; append through new/")
        raise refuse(errno.EPERM, f"inode {ino}: attributes are fixed")
