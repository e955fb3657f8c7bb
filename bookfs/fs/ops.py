"""The pyfuse3 ``Operations`` that present a Book as the layout DESIGN.md fixes.

Caching contract
----------------
* ``events/<N>`` files are immutable: entry and attribute timeouts of a day, and the
  kernel page cache is kept across opens (``keep_cache``).  ``st_ino`` is derived from
  the event number, so it is stable across remounts; ``st_size`` is exact.
* The names of the fixed directories and files never change: entries cached for a day.
  Their attributes (``events/``'s size and mtime, ``info``'s size, ``meta/*``'s mtime)
  change on append and are cached for ``CHANGING`` (1 s); the content of ``info`` and
  ``meta/*`` is served with ``direct_io``, so it is always current.  Without attribute
  caching on directories, ``default_permissions`` would cost a round trip per directory
  on every path walk.
* Extended attributes are not supported (ENOSYS), which the kernel remembers, so ``ls -l``
  does not ask once per file.
* ``new/<N>`` entries are never cached, so every ``open(O_CREAT)`` reaches ``create``.

Errors follow DESIGN.md's table.  Every handler is guarded: a ``BookError`` becomes its
errno, an ``OSError`` its errno, anything else EIO plus a logged traceback, and the mount
stays up.  Every refusal is logged once, in one line that says what was expected.

Reading an event checks its CRC on ``open`` (streamed, in a worker thread, for large
events), so corrupt bytes are never served; small events are read once and served from
the handle, large ones with ``pread`` per request, so memory never holds a whole large
event.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time

import pyfuse3
import trio

from ..book import Book
from ..eventlog import EventLog
from ..errors import BookError
from ..info import render, summary
from ..layout import META_FIELDS, META_KEYS, MIN_PAYLOAD
from ..segments import DEFAULT_SPAN, Segment, Segments
from . import inodes as I
from .commit import CommitQueue, Reservation, refuse
from .staging import Staging

log = logging.getLogger(__name__)

FOREVER = 24 * 3600.0  # cache timeout for immutable entries (seconds)
CHANGING = 1.0  # attribute timeout for things an append changes (seconds)
SMALL_EVENT = 128 << 10  # events up to this size are read whole on open
PF_EXITING = 0x4  # /proc/<pid>/stat flags bit: the task is exiting


def guarded(fn):
    """Turn anything but FUSEError into an errno, so no exception can kill the mount."""

    @functools.wraps(fn)
    async def wrapper(self, *args):
        if self.debug:
            log.debug("%s%r", fn.__name__, args)
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except BookError as e:
            log.warning("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno) from None
        except OSError as e:
            log.warning("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("unexpected error in %s%r; answering EIO", fn.__name__, args)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def killed_by_signal(pid: int) -> bool:
    """True if ``pid`` is exiting because a signal killed it (its descriptors are being
    closed by the kernel, not by the program).  A process that exits normally, or is
    still running, returns False."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    fields = data[data.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state); flags is field 9, exit_code field 52
    flags = int(fields[6])
    exit_code = int(fields[49]) if len(fields) > 49 else 0
    return bool(flags & PF_EXITING) and (exit_code & 0x7F) != 0


def still_open_elsewhere(pid: int, path: str) -> bool:
    """True if process ``pid`` still has ``path`` open on some descriptor.  Used at
    ``flush``: a shell's ``> new/N`` opens the file, ``dup2``s it to stdout and closes the
    original descriptor, which flushes before anything is written; that flush must not
    commit.  Only ``readlink`` is used (a ``stat`` would re-enter this filesystem)."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"{fd_dir}/{name}") == path:
                return True
        except OSError:
            continue
    return False


class _EventHandle:
    __slots__ = ("event", "data")

    def __init__(self, event: int, data: bytes | None):
        self.event, self.data = event, data


class _SegmentHandle:
    __slots__ = ("seg",)

    def __init__(self, seg: Segment):
        self.seg = seg


class _BytesHandle:
    """A snapshot served to readers (``info``, a meta field)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


class _MetaWriteHandle:
    __slots__ = ("key", "staging", "dirty")

    def __init__(self, key: str):
        self.key, self.staging, self.dirty = key, Staging(4096), False


class BookOperations(pyfuse3.Operations):
    """FUSE operations over one open log: a :class:`Book`, or any ``EventLog`` (a vere
    log, an LMDB epoch, a :class:`~bookfs.pier.Pier`, whose epochs appear under
    ``epochs/``)."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, book: EventLog, *, stall_timeout: float = 30.0, debug: bool = False,
                 spill_dir: str | None = None, mountpoint: str | None = None,
                 segment_span: int = DEFAULT_SPAN):
        super().__init__()
        self.book = book
        # the bulk view needs the UIP layout's deeds; a pier shows its epochs instead
        self.segments = Segments(book, segment_span) if isinstance(book, Book) else None
        self._verified_segments: set[int] = set()
        self.epochs = list(getattr(book, "epochs", []))
        self._epoch_by_name = {e.name.encode(): k for k, e in enumerate(self.epochs)}
        self._root = list(_ROOT_ENTRIES)
        if self.segments is not None:
            self._root.append((b"segments", I.SEGMENTS))
        if self.epochs:
            self._root.append((b"epochs", I.EPOCHS))
        self._root_names = dict(self._root)
        self._dirs = {ino for _, ino in self._root if ino != I.INFO} | {I.ROOT}
        self.mountpoint = mountpoint
        self.readonly = not book.writable
        self.debug = debug
        self.queue = CommitQueue(book, stall_timeout=stall_timeout, spill_dir=spill_dir)
        self._handles: dict[int, object] = {}
        self._next_fh = 1
        self._verified_large: set[int] = set()
        st = os.stat(book.directory)
        self._uid, self._gid = st.st_uid, st.st_gid
        self._mounted_ns = time.time_ns()

    # --- helpers -------------------------------------------------------------------------

    def _new_fh(self, handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return fh

    def _attrs(self, ino: int, mode: int, size: int, mtime_ns: int, timeout: float,
               nlink: int = 1, entry_timeout: float | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = mode
        a.st_nlink = nlink
        a.st_uid, a.st_gid = self._uid, self._gid
        a.st_size = size
        a.st_blksize = 4096
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = a.st_ctime_ns = a.st_mtime_ns = mtime_ns
        a.attr_timeout = timeout
        a.entry_timeout = timeout if entry_timeout is None else entry_timeout
        return a

    def _follow(self) -> None:
        """On a read-only mount, pick up events another process committed."""
        if self.readonly:
            self.book.refresh()

    def _log_mtime(self) -> int:
        last = self.book.last
        return self.book.mtime_ns(last) if last else self._mounted_ns

    def _event_attrs(self, event: int) -> pyfuse3.EntryAttributes:
        return self._attrs(I.event_inode(event), stat.S_IFREG | 0o444,
                           self.book.payload_size(event), self.book.mtime_ns(event), FOREVER)

    def _dir_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        if ino == I.NEW:
            mode = 0o333 if not self.readonly else 0o111
        elif ino == I.ROOT:
            mode = 0o755 if not self.readonly else 0o555
        else:
            mode = 0o555
        size = self.book.count if ino == I.EVENTS else 0
        return self._attrs(ino, stat.S_IFDIR | mode, size, self._log_mtime(), CHANGING,
                           nlink=2, entry_timeout=FOREVER)

    def _segment_attrs(self, seg: Segment) -> pyfuse3.EntryAttributes:
        return self._attrs(I.segment_inode(seg.index), stat.S_IFREG | 0o444, seg.size,
                           self.book.mtime_ns(seg.last), FOREVER if seg.complete else 0,
                           entry_timeout=FOREVER)

    def _negative(self) -> pyfuse3.EntryAttributes:
        """A negative entry the kernel may cache: for names that can never exist."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        a.entry_timeout = FOREVER
        return a

    def _info_bytes(self) -> bytes:
        return render(summary(self.book)).encode()

    def _epoch_info(self, k: int) -> bytes:
        e = self.epochs[k]
        first, last = e.log.gulf()
        return render({"epoch": e.name, "format": e.log.format, "base": e.base,
                       "first": first, "last": last, "events": e.log.count,
                       "bytes": e.log.log_bytes, "path": e.log.directory}).encode()

    def _meta_mtime(self) -> int:
        book = self.book
        log = self.epochs[-1].log if self.epochs else book
        path = getattr(log, "meta_path", None)
        return os.stat(path).st_mtime_ns if path else self._mounted_ns

    def _epoch_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        k, kind = I.inode_epoch(ino)
        if k >= len(self.epochs):
            raise pyfuse3.FUSEError(errno.ENOENT)
        if kind == I.EPOCH_INFO:
            return self._attrs(ino, stat.S_IFREG | 0o444, len(self._epoch_info(k)),
                               self._log_mtime(), CHANGING, entry_timeout=FOREVER)
        if kind in (I.EPOCH_DIR, I.EPOCH_EVENTS):
            size = self.epochs[k].log.count if kind == I.EPOCH_EVENTS else 0
            return self._attrs(ino, stat.S_IFDIR | 0o555, size, self._log_mtime(), CHANGING,
                               nlink=2, entry_timeout=FOREVER)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def _attrs_of(self, ino: int) -> pyfuse3.EntryAttributes:
        if I.is_event(ino):
            event = I.inode_event(ino)
            if event not in self.book:
                self._follow()
            if event not in self.book:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._event_attrs(event)
        if I.is_epoch(ino):
            self._follow()
            return self._epoch_attrs(ino)
        if I.is_segment(ino) and self.segments is not None:
            seg = self.segments.get(ino - I.SEGMENT_BASE)
            if seg is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._segment_attrs(seg)
        if ino in self._dirs:
            self._follow()
            return self._dir_attrs(ino)
        if ino == I.INFO:
            self._follow()
            return self._attrs(ino, stat.S_IFREG | 0o444, len(self._info_bytes()),
                               self._log_mtime(), CHANGING, entry_timeout=FOREVER)
        if ino in I.META_BY_INODE:
            key = I.META_BY_INODE[ino]
            mode = 0o444 if self.readonly else 0o644
            mtime = self._meta_mtime()
            return self._attrs(ino, stat.S_IFREG | mode, META_FIELDS[key][1], mtime, CHANGING,
                               entry_timeout=FOREVER)
        if I.is_staging(ino):
            r = self._handles.get(ino - I.STAGING_BASE)
            if isinstance(r, Reservation):
                return self._attrs(ino, stat.S_IFREG | 0o200, len(r.staging), time.time_ns(),
                                   CHANGING, entry_timeout=0)
        raise pyfuse3.FUSEError(errno.ENOENT)

    # --- lookups and attributes ----------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode == I.EVENTS:
            event = I.parse_number(name)
            if event is None:  # can never exist (Hadoop's .<name>.crc, say): cache that
                return self._negative()
            if event not in self.book:
                self._follow()
                if event not in self.book:
                    raise pyfuse3.FUSEError(errno.ENOENT)
            return self._event_attrs(event)
        if parent_inode == I.EPOCHS and self.epochs:
            k = self._epoch_by_name.get(name)
            if k is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._epoch_attrs(I.epoch_inode(k, I.EPOCH_DIR))
        if I.is_epoch(parent_inode):
            k, kind = I.inode_epoch(parent_inode)
            if k >= len(self.epochs):
                raise pyfuse3.FUSEError(errno.ENOENT)
            if kind == I.EPOCH_DIR:
                sub = {b"events": I.EPOCH_EVENTS, b"info": I.EPOCH_INFO}.get(name)
                if sub is None:
                    raise pyfuse3.FUSEError(errno.ENOENT)
                return self._epoch_attrs(I.epoch_inode(k, sub))
            event = I.parse_number(name)
            if event is None or event not in self.epochs[k].log:
                self._follow()
                if event is None or event not in self.epochs[k].log:
                    raise pyfuse3.FUSEError(errno.ENOENT)
            return self._event_attrs(event)
        if parent_inode == I.SEGMENTS and self.segments is not None:
            event = I.parse_number(name)
            self._follow()
            seg = self.segments.containing_first(event) if event is not None else None
            if seg is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._segment_attrs(seg)
        if parent_inode == I.ROOT:
            ino = self._root_names.get(name)
        elif parent_inode == I.META:
            ino = I.META_INODES.get(name.decode("utf-8", "replace"))
        else:  # new/: entries are never looked up, so that open(O_CREAT) reaches create
            ino = None
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self._attrs_of(ino)

    @guarded
    async def getattr(self, inode, ctx=None):
        return await self._attrs_of(inode)

    @guarded
    async def setattr(self, inode, attr, fields, fh, ctx):
        if I.is_staging(inode):
            r = self._handles.get(inode - I.STAGING_BASE)
            if not isinstance(r, Reservation):
                raise pyfuse3.FUSEError(errno.ENOENT)
            if fields.update_size:
                r.staging.truncate(attr.st_size)
            return await self._attrs_of(inode)
        if inode in I.META_BY_INODE and not self.readonly:
            if fields.update_size and fh in self._handles:
                h = self._handles[fh]
                if isinstance(h, _MetaWriteHandle):
                    h.staging.truncate(attr.st_size)
                    h.dirty = True
            if fields.update_mode or fields.update_uid or fields.update_gid:
                raise refuse(errno.EPERM, "meta files keep their owner and mode")
            return await self._attrs_of(inode)
        if fields.update_size:
            raise refuse(errno.EROFS, f"inode {inode}: events are immutable; append through new/")
        raise refuse(errno.EPERM, f"inode {inode}: attributes are fixed")

    # --- directories ---------------------------------------------------------------------

    @guarded
    async def opendir(self, inode, ctx):
        if inode == I.NEW:
            raise refuse(errno.EACCES, "new/ is write-only: create new/<N> with the next "
                                       "event number instead of listing it")
        is_dir = inode in self._dirs or (
            I.is_epoch(inode) and I.inode_epoch(inode)[1] != I.EPOCH_INFO)
        if not is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        self._follow()
        return inode

    @guarded
    async def readdir(self, fh, start_id, token):
        if fh == I.EVENTS or (I.is_epoch(fh) and I.inode_epoch(fh)[1] == I.EPOCH_EVENTS):
            # cookie = the event number of the entry just returned: O(1) resume
            log = self.book if fh == I.EVENTS else self.epochs[I.inode_epoch(fh)[0]].log
            first, last = log.gulf()
            if not last:
                return
            event = max(first, start_id + 1)
            if event > last:
                return
            # readdir_reply copies the attributes into the reply buffer, so one object is
            # reused and only the fields that differ are set (this is the ls -l hot path)
            a = self._event_attrs(event)
            reply, name = pyfuse3.readdir_reply, I.event_name
            size_of, mtime_of = log.payload_size, log.mtime_ns
            base = I.EVENT_BASE
            while event <= last:
                size = size_of(event)
                a.st_ino = base + event
                a.st_size = size
                a.st_blocks = (size + 511) >> 9
                a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = mtime_of(event)
                if not reply(token, name(event), a, event):
                    return
                event += 1
            return
        if fh == I.SEGMENTS:  # cookie = segment index + 1
            for k in range(start_id, self.segments.slots()):
                seg = self.segments.get(k)
                if seg is not None and not pyfuse3.readdir_reply(
                        token, I.event_name(seg.first), self._segment_attrs(seg), k + 1):
                    return
            return
        entries = self._small_dir(fh)
        for i in range(start_id, len(entries)):  # cookie = position + 1
            name, ino = entries[i]
            if not pyfuse3.readdir_reply(token, name, await self._attrs_of(ino), i + 1):
                return

    def _small_dir(self, fh: int) -> list[tuple[bytes, int]]:
        """The fixed entries of /, meta/, epochs/ and an epoch's directory."""
        if fh == I.ROOT:
            return self._root
        if fh == I.META:
            return [(k.encode(), ino) for k, ino in I.META_INODES.items()]
        if fh == I.EPOCHS:
            return [(e.name.encode(), I.epoch_inode(k, I.EPOCH_DIR))
                    for k, e in enumerate(self.epochs)]
        k = I.inode_epoch(fh)[0]
        return [(b"events", I.epoch_inode(k, I.EPOCH_EVENTS)),
                (b"info", I.epoch_inode(k, I.EPOCH_INFO))]

    @guarded
    async def releasedir(self, fh):
        return None

    # --- reading -------------------------------------------------------------------------

    @guarded
    async def open(self, inode, flags, ctx):
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND)
        if I.is_event(inode):
            if writing:
                raise refuse(errno.EROFS, f"events/{I.inode_event(inode)} is immutable; "
                                          "append through new/")
            event = I.inode_event(inode)
            if event not in self.book:
                raise pyfuse3.FUSEError(errno.ENOENT)
            size = self.book.payload_size(event)
            if size <= SMALL_EVENT:
                data = self.book.read(event)  # CRC-checked
            else:
                if event not in self._verified_large:
                    await trio.to_thread.run_sync(self.book.verify_event, event)
                    self._verified_large.add(event)
                data = None
            return pyfuse3.FileInfo(fh=self._new_fh(_EventHandle(event, data)), keep_cache=True)
        if I.is_epoch(inode):
            k, kind = I.inode_epoch(inode)
            if kind != I.EPOCH_INFO or k >= len(self.epochs):
                raise pyfuse3.FUSEError(errno.EISDIR)
            if writing:
                raise refuse(errno.EACCES, "epochs/*/info is read-only")
            return pyfuse3.FileInfo(fh=self._new_fh(_BytesHandle(self._epoch_info(k))),
                                    direct_io=True, keep_cache=False)
        if I.is_segment(inode) and self.segments is not None:
            if writing:
                raise refuse(errno.EROFS, "segments are read-only")
            seg = self.segments.get(inode - I.SEGMENT_BASE)
            if seg is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if not (seg.complete and seg.index in self._verified_segments):
                await trio.to_thread.run_sync(self.segments.verify, seg)
                if seg.complete:
                    self._verified_segments.add(seg.index)
            return pyfuse3.FileInfo(fh=self._new_fh(_SegmentHandle(seg)),
                                    keep_cache=seg.complete)
        if inode == I.INFO:
            if writing:
                raise refuse(errno.EACCES, "info is read-only")
            self._follow()
            return pyfuse3.FileInfo(fh=self._new_fh(_BytesHandle(self._info_bytes())),
                                    direct_io=True, keep_cache=False)
        if inode in I.META_BY_INODE:
            key = I.META_BY_INODE[inode]
            if writing:
                if self.readonly:
                    raise refuse(errno.EROFS, f"meta/{key}: the mount is read-only")
                if flags & os.O_APPEND:
                    raise refuse(errno.EINVAL, f"meta/{key}: write the whole field, "
                                               "not an append")
                return pyfuse3.FileInfo(fh=self._new_fh(_MetaWriteHandle(key)),
                                        direct_io=True, keep_cache=False)
            return pyfuse3.FileInfo(fh=self._new_fh(_BytesHandle(self.book.read_meta(key))),
                                    direct_io=True, keep_cache=False)
        if I.is_staging(inode):
            raise refuse(errno.EBUSY, "an event being written cannot be opened again")
        raise pyfuse3.FUSEError(errno.EISDIR if inode in self._dirs else errno.ENOENT)

    @guarded
    async def read(self, fh, off, size):
        h = self._handles.get(fh)
        if isinstance(h, _EventHandle):
            if h.data is not None:
                return h.data[off : off + size]
            return self.book.read_slice(h.event, off, size)
        if isinstance(h, _BytesHandle):
            return h.data[off : off + size]
        if isinstance(h, _SegmentHandle):
            return self.segments.read(h.seg, off, size)
        raise pyfuse3.FUSEError(errno.EBADF)

    # --- writing -------------------------------------------------------------------------

    @guarded
    async def create(self, parent_inode, name, mode, flags, ctx):
        if self.readonly:
            raise refuse(errno.EROFS, "the mount is read-only")
        if parent_inode == I.META:  # an existing key never reaches create: unknown key
            raise refuse(errno.ENOENT, f"meta/{name.decode('utf-8', 'replace')}: unknown "
                                       f"meta key; expected one of {', '.join(I.META_INODES)}")
        if parent_inode != I.NEW:
            where = {I.EVENTS: "events/", I.ROOT: "/"}.get(parent_inode, "")
            raise refuse(errno.EROFS if parent_inode == I.EVENTS else errno.EPERM,
                         f"cannot create {where}{name.decode('utf-8', 'replace')}: "
                         "append by creating new/<next event number>")
        r = self.queue.reserve(name, ctx.pid)
        fh = self._new_fh(r)
        attrs = await self._attrs_of(I.staging_inode(fh))
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), attrs

    @guarded
    async def write(self, fh, off, buf):
        h = self._handles.get(fh)
        if isinstance(h, Reservation):
            if h.state == "done":
                raise refuse(errno.EINVAL, f"new/{h.number} is already committed")
            return h.staging.write(off, buf)
        if isinstance(h, _MetaWriteHandle):
            h.dirty = True
            return h.staging.write(off, buf)
        raise pyfuse3.FUSEError(errno.EBADF)

    @guarded
    async def flush(self, fh):
        h = self._handles.get(fh)
        if isinstance(h, Reservation):
            if h.state in ("open", "ready"):
                if h.state == "open":
                    if killed_by_signal(h.pid):
                        self.queue.abandon(h, f"writer pid {h.pid} was killed before closing")
                        raise pyfuse3.FUSEError(errno.EIO)
                    if (len(h.staging) < MIN_PAYLOAD and self.mountpoint
                            and still_open_elsewhere(h.pid, f"{self.mountpoint}/new/{h.name}")):
                        return  # an early close (a shell's dup2 dance): commit later
                await self.queue.commit(h)
            elif h.state == "failed":
                raise pyfuse3.FUSEError(h.error)
        elif isinstance(h, _MetaWriteHandle) and h.dirty:
            h.dirty = False
            value = h.staging.getvalue()
            await trio.to_thread.run_sync(self.book.save_meta, h.key, value)

    @guarded
    async def release(self, fh):
        h = self._handles.pop(fh, None)
        if isinstance(h, Reservation):
            if h.state in ("open", "ready"):
                self.queue.abandon(h, "closed without a flush")
            h.staging.close()
        elif isinstance(h, _MetaWriteHandle):
            h.staging.close()

    @guarded
    async def fsync(self, fh, datasync):
        return None  # committed events are already durable; new/ commits on close

    # --- refusals ------------------------------------------------------------------------

    def _refuse_change(self, parent_inode, name, what: str):
        where = "events/" if parent_inode == I.EVENTS else ""
        name = name.decode("utf-8", "replace")
        if self.readonly:
            raise refuse(errno.EROFS, f"cannot {what} {where}{name}: the mount is read-only")
        raise refuse(errno.EPERM, f"cannot {what} {where}{name!r}: the log is append-only")

    @guarded
    async def unlink(self, parent_inode, name, ctx):
        self._refuse_change(parent_inode, name, "unlink")

    @guarded
    async def rmdir(self, parent_inode, name, ctx):
        self._refuse_change(parent_inode, name, "remove")

    @guarded
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._refuse_change(parent_inode_old, name_old, "rename")

    @guarded
    async def mkdir(self, parent_inode, name, mode, ctx):
        self._refuse_change(parent_inode, name, "mkdir")

    @guarded
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        self._refuse_change(parent_inode, name, "mknod")

    @guarded
    async def symlink(self, parent_inode, name, target, ctx):
        self._refuse_change(parent_inode, name, "symlink")

    @guarded
    async def link(self, inode, new_parent_inode, new_name, ctx):
        self._refuse_change(new_parent_inode, new_name, "link")

    @guarded
    async def getxattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel stops asking

    @guarded
    async def listxattr(self, inode, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def setxattr(self, inode, name, value, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def removexattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (self.book.log_bytes + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = self.book.count + 16
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s


_ROOT_ENTRIES = [(b"events", I.EVENTS), (b"meta", I.META), (b"new", I.NEW), (b"info", I.INFO)]

assert set(META_KEYS) == set(I.META_INODES)
