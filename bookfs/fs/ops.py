"""The pyfuse3 ``Operations`` that present a Book as the layout DESIGN.md fixes: one
dispatcher that routes every request to the kind of node that owns its inode.

What a node is follows from its inode number alone (``inodes.py``), and each kind holds
its own lookup, attributes, open, read and write logic, with its contract (what the
kernel may cache and for how long, which errno answers what, when a write is durable)
in its docstring:

=================================  ==========================  =======================
inodes                             nodes                       module
=================================  ==========================  =======================
``2^63 + ...``                     ``events/<N>``              ``nodes/events.py``
``3*2^59 + ...``                   ``pretty/<N>``              ``nodes/pretty.py``
``10`` (and events' inodes)        ``follow/next``, ``<N>``    ``nodes/follow_dir.py``
``2^40 + ...``                     ``segments/<K>``            ``nodes/segments.py``
``2^48 + handle``                  ``new/<N>`` being written   ``nodes/new.py``
``16 + ...``                       ``meta/<key>``              ``nodes/meta.py``
``1..8``, ``2^36 + ...``           directories, info files     ``nodes/dirs.py``
=================================  ==========================  =======================

A request that names a parent (LOOKUP) goes to the kind that lists it; one that names
a handle (READ, WRITE, FLUSH, RELEASE) to the kind that opened it.  Watching the writer
and the log's generations (which file belongs to which log, ESTALE, the kernel's caches
to drop) is :mod:`bookfs.fs.watch`'s; lookups that wait for the next event
(``follow/``) are :mod:`bookfs.fs.tail`'s; what every kind shares (cache timeouts,
permissions) is ``nodes/base.py``'s.  Extended attributes are not supported (ENOSYS),
which the kernel remembers, so ``ls -l`` does not ask once per file; the one exception
is a ``new/<N>`` file's ``user.bookfs.unchecked`` (``nodes/new.py``; a ``new/`` file
accepts any other and keeps none, as it does its mode and times), which is why setting
any other attribute elsewhere answers ENOTSUP (what ENOSYS shows the caller too) and never
ENOSYS: the kernel would then refuse every later setxattr of the mount.  Nothing can be
removed, renamed or linked: EPERM (EROFS on a read-only mount).

Errors follow DESIGN.md's table.  Every handler is guarded (:func:`guarded`): a
``BookError`` becomes its errno, an ``OSError`` its errno, anything else EIO plus a
logged traceback, and the mount stays up (a handler raising anything but ``FUSEError``
would kill it).  Every refusal is logged once, in one line that says what was expected.

Fewer requests (issue 12).  With pyfuse3 built with ``mount_scripts/pyfuse3-3.5.0-bookfs.patch``
(:data:`FEATURES`; ``info`` says which path a mount is on):

* a read-only mount answers OPEN with ENOSYS, so the kernel opens every file without
  asking and never sends RELEASE, and reads arrive by inode (``read_inode``).  The check
  an open made moves to the first read of an event: a failed check answers EIO, and the
  kernel caches no byte of that event.  A warm read of an event costs no request at all;
  a cold one LOOKUP and READ.  Files whose content changes (``info``, ``epochs/*/info``,
  ``meta/*``) report a new mtime whenever their content changed, so the kernel (which
  rechecks their attributes before reading, ``GROWING``) drops its stale pages;
  ``pretty/N`` reports its rendering's real size;
* every open that cannot write says ``noflush``, so its close sends no FLUSH;
* directories are opened with ``cache_readdir``, and keep the kernel's listing while the
  log has not changed since the last opendir (``ls -l events/`` costs OPENDIR and
  RELEASEDIR).

On stock pyfuse3 everything works as before: every open and close is a request.  FLUSH
on a read-only mount is answered ENOSYS either way (there is no ``new/``), and the kernel
stops sending it.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import secrets
import time

import pyfuse3

from bookfs.errors import BookError, Refused, refuse
from bookfs.formats.book import Book
from bookfs.formats.eventlog import EventLog
from bookfs.formats.segments import DEFAULT_SPAN, Segments
from bookfs.fs import inodes as I
from bookfs.fs.append import rule
from bookfs.fs.append.commit_queue import (
    CommitQueue,
    Refusals,
    Reservation,
    WorkerThread,
)
from bookfs.fs.watch import LogWatch
from bookfs.fs.generations import Generations
from bookfs.fs.nodes.base import BytesHandle, Kind, Modes, make_attrs, source_modes
from bookfs.fs.nodes.dirs import Directories
from bookfs.fs.nodes.events import EventFiles, EventHandle
from bookfs.fs.nodes.follow_dir import FollowFiles
from bookfs.fs.nodes.meta import MetaFiles, MetaWriteHandle
from bookfs.fs.nodes.new import NewFiles
from bookfs.fs.nodes.pretty import PrettyFiles
from bookfs.fs.nodes.segments import SegmentFiles, SegmentHandle
from bookfs.fs.tail import DEFAULT_TIMEOUT, Tail

__all__ = ["FEATURES", "LogOperations", "Modes", "fuse_path", "guarded", "source_modes"]

log = logging.getLogger(__name__)

#: What the pyfuse3 in use offers beyond stock (``read_inode``, ``noflush``,
#: ``cache_readdir``: see mount_scripts/pyfuse3-3.5.0-bookfs.patch).  The environment
#: variable ``BOOKFS_STOCK_PYFUSE3=1`` makes bookfs use none of them (tests, benchmarks).
FEATURES: frozenset[str] = (frozenset() if os.environ.get("BOOKFS_STOCK_PYFUSE3")
                            else frozenset(getattr(pyfuse3, "FEATURES", ())))


def _interrupted(ctx):
    """The request's ``interrupted`` event (set when the kernel interrupts it: the caller
    got a signal), with pyfuse3's ``interrupts`` (:data:`FEATURES`); else None."""
    return getattr(ctx, "interrupted", None)


def guarded(fn):
    """Turn anything but FUSEError into an errno, so no exception can kill the mount: a
    :class:`~bookfs.errors.Refused` (logged when it was built) and any other bookfs error
    answer their own errno, anything else EIO."""

    @functools.wraps(fn)
    async def wrapper(self, *args):
        if self.debug:
            log.debug("%s%r", fn.__name__, args)
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Refused as e:  # turned down on purpose: logged once where it was built
            raise pyfuse3.FUSEError(e.errno) from None
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


def fuse_path(readonly: bool) -> str:
    """Which request path a mount (read-only or not) is on with this pyfuse3
    (:data:`FEATURES`), as its ``info`` says."""
    parallel = ", parallel lookups" if "parallel_dirops" in FEATURES else ""
    if readonly and "read_inode" in FEATURES:
        return f"patched pyfuse3: no-open reads by inode, noflush, cached listings{parallel}"
    if "noflush" in FEATURES:
        return (f"patched pyfuse3: noflush, cached listings{parallel} (opens kept for new/ "
                f"and meta/); the commit rule's descriptor scan in {rule.SCAN}")
    refused = "" if readonly else "; appends and meta writes refused"
    return (f"stock pyfuse3: a request for every open and close{refused} "
            "(mount_scripts/setup.sh builds the patched one)")


class LogOperations(pyfuse3.Operations):
    """FUSE operations over one open log: a :class:`Book`, or any ``EventLog`` (a vere
    log, an LMDB epoch, a :class:`~bookfs.formats.pier.Pier`, whose epochs appear under
    ``epochs/``)."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, log: EventLog, *, stall_timeout: float = 30.0, debug: bool = False,
                 spill_dir: str | None = None, mountpoint: str | None = None,
                 segment_span: int = DEFAULT_SPAN,
                 owner: tuple[int | None, int | None] = (None, None),
                 umask: int | None = None, follow_timeout: float = DEFAULT_TIMEOUT):
        super().__init__()
        self.log = log
        # the bulk view needs the UIP layout's deeds; a pier shows its epochs instead
        self.segments = Segments(log, segment_span) if isinstance(log, Book) else None
        # the pier's own list: a read-only mount's follower adds the epochs a roll
        # creates (Pier.refresh), and every view (epochs/, info) sees them
        self.epochs = getattr(log, "epochs", [])
        # resolved before mounting: descriptors' links name files by their real path
        self.mountpoint = mountpoint
        self.readonly = not log.writable
        self.debug = debug
        self.refusals = Refusals()  # refused appends and meta writes: in info
        # lookups under follow/ waiting for an event; woken by each commit, and by the
        # watch of a read-only mount (watch.py)
        self.tail = Tail(self, follow_timeout)
        self.queue = CommitQueue(log, stall_timeout=stall_timeout, spill_dir=spill_dir,
                                 refusals=self.refusals, check_deadline=rule.PROBE_DEADLINE,
                                 on_commit=self._committed)
        #: a read-write mount's read-only companion, once it runs (fs/daemon/companion.py)
        self.companion = None
        self._handles: dict[int, object] = {}
        # handles start at a random point, so a new/ file's inode (2^48 + its handle)
        # names it on this mount alone: the commit rule finds its descriptors in another
        # process's table by inode, and another mount's leftovers must not look like it
        self._next_fh = secrets.randbelow(1 << 40) + 1
        self._uid, self._gid, self.modes = source_modes(log, self.readonly, owner=owner,
                                                        umask=umask)
        self.mounted_ns = time.time_ns()
        #: how event reads reach the log, for info's ``reads:`` (``fs/daemon/companion.py``)
        self.reads_note = "through this connection (the read-only companion is starting)"
        # fewer requests (module docstring): which of pyfuse3's extensions this mount uses
        self.no_open = self.readonly and "read_inode" in FEATURES
        self.noflush = "noflush" in FEATURES
        self.cache_dirs = "cache_readdir" in FEATURES
        # the commit rule needs each FLUSH's and WRITE's caller (pyfuse3 then passes ctx)
        self.request_owner = "request_owner" in FEATURES
        # -o readdirplus=auto: the kernel sends plain READDIR where nobody stats the
        # entries (find -type f): no inode per entry (fs/nodes/dirs.py, "Listings")
        self.readdirplus_auto = False
        self.mounts = rule.Mounts(None)  # set_device() once mounted
        # what tells the kernel about this mount's inodes: pyfuse3's own functions, which
        # a fleet's ship replaces by ones that map its inodes into the fleet's (fs/fleet/ops.py)
        self.readdir_reply = pyfuse3.readdir_reply
        self.invalidate_inode = pyfuse3.invalidate_inode
        self.invalidate_entry = pyfuse3.invalidate_entry
        self.prober = WorkerThread("bookfs-probe")
        #: the log's generation and the inodes' slots (fs/generations.py)
        self.generations = Generations(getattr(log, "generation", 0))
        self.watch = LogWatch(self)  # a read-only mount follows the writer
        # the kinds of node (module docstring)
        self.event_files = EventFiles(self)
        self.pretty_files = PrettyFiles(self)
        self.segment_files = SegmentFiles(self)
        self.new_files = NewFiles(self)
        self.meta_files = MetaFiles(self)
        self.follow_files = FollowFiles(self)
        self.dirs = Directories(self)
        self._nothing = Kind(self)  # an inode no kind owns
        self._by_parent = {I.EVENTS: self.event_files, I.PRETTY: self.pretty_files,
                           I.META: self.meta_files, I.NEW: self.new_files,
                           I.FOLLOW: self.follow_files}
        if self.segments is not None:
            self._by_parent[I.SEGMENTS] = self.segment_files

    # --- what the kinds share ------------------------------------------------------------

    def handle(self, fh: int):
        """The open handle ``fh`` (None if there is none)."""
        return self._handles.get(fh)

    def new_fh(self, handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return fh

    def file_info(self, fh: int, **kw) -> pyfuse3.FileInfo:
        """A FileInfo for an open that cannot write: ``noflush`` where pyfuse3 offers it
        (a close then sends no FLUSH; only ``new/`` and ``meta/`` writes need one)."""
        fi = pyfuse3.FileInfo(fh=fh, **kw)
        if self.noflush:
            fi.noflush = True
        return fi

    def fuse_path(self) -> str:
        """Which request path this mount is on, for ``info``: :func:`fuse_path`."""
        return fuse_path(self.readonly)

    def entry_attrs(self, ino: int, mode: int, size: int, mtime_ns: int, timeout: float,
                    nlink: int = 1, entry_timeout: float | None = None
                    ) -> pyfuse3.EntryAttributes:
        return make_attrs(self._uid, self._gid, ino, mode, size, mtime_ns, timeout, nlink,
                          entry_timeout)

    # --- routing -------------------------------------------------------------------------

    def _kind(self, ino: int) -> Kind:
        """The kind of node that owns inode ``ino`` (``inodes.py``'s ranges)."""
        if I.is_event(ino):
            return self.event_files
        if I.is_pretty(ino):
            return self.pretty_files
        if I.is_staging(ino):
            return self.new_files
        if I.is_segment(ino):
            return self.segment_files if self.segments is not None else self._nothing
        if ino in I.META_BY_INODE:
            return self.meta_files
        if ino == I.FOLLOW_NEXT:
            return self.follow_files
        if self.dirs.owns(ino):
            return self.dirs
        return self._nothing

    async def attrs_of(self, ino: int) -> pyfuse3.EntryAttributes:
        """The attributes of any inode (ESTALE for one of an older generation)."""
        self.generations.current(ino, f"inode {ino}")
        return await self._kind(ino).attrs(ino)

    # --- generations (follow.py) ---------------------------------------------------------

    @guarded
    async def forget(self, inode_list):
        self.generations.forget(inode_list)

    def _committed(self, first: int, last: int) -> None:
        """After each save, before the writers' closes are answered: lookups waiting
        under ``follow/`` look again, and every kernel connection that shows this log's
        directories forgets their attributes, which an append changed (``events/``'s
        size is the event count): this connection's, and the companion's
        (``fs/daemon/companion.py``), so a ``stat`` right after the close returned asks again.
        Attributes only: no page, so nothing waits for a request in flight.

        Only those whose size or content changed (:meth:`LogWatch.changing_inodes` of the
        newest epoch, without ``mtimes``: ``events/``, ``info``, the newest epoch's
        ``events/`` and ``info``), not the directories whose mtime alone did (the root,
        each epoch's directory, the older epochs' ``events/``: every directory's mtime is
        the newest event's), which may so lag by up to ``CHANGING`` (1 s), as a read-only
        mount's may. Two costs went with them. The root's: with ``default_permissions`` the
        kernel asks for the attributes of each directory a path walk crosses once they are
        dropped (``fs/fuse/dir.c``, ``fuse_permission()``: ``fuse_perm_getattr()`` when the
        attribute time has passed or ``fi->inval_mask`` holds the mode, uid or gid, which
        the notice sets: ``fuse_reverse_inval_inode()`` -> ``fuse_invalidate_attr()``,
        ``STATX_BASIC_STATS``), so every writer's next ``open("MNT/new/<N+1>")`` paid a
        GETATTR of the root: one request in seven of an append. The epochs': three notices
        an epoch on each connection, before the close is answered: a pier of 20 epochs
        appended at 0.6x a pier of one."""
        self.tail.published()
        inodes = self.watch.changing_inodes(since=len(self.epochs) - 1, mtimes=False)
        if self.companion is not None:
            self.companion.drop_attrs(inodes)
        if self.mountpoint:
            self.watch.drop_attrs_now(inodes)

    def source_here(self) -> bool:
        """Whether the log's source is still where this mount found it (a fleet's ship
        checks its directory: ``fs/fleet/ship.py``); a single mount follows its path."""
        return True

    async def watch_loop(self) -> None:
        """Run by the daemon of a read-only mount (:meth:`LogWatch.loop`)."""
        await self.watch.loop()

    # --- lookups and attributes ----------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        kind = self._by_parent.get(parent_inode)
        if parent_inode == I.FOLLOW:  # waits: the caller's signal ends the wait (EINTR)
            attrs = await self.follow_files.lookup(name, _interrupted(ctx))
        elif parent_inode == I.NEW:  # a name just committed, to its writer (nodes/new.py)
            attrs = await self.new_files.lookup(name, ctx)
        elif kind is not None:
            attrs = await kind.lookup(name)
        elif parent_inode in (I.ROOT, I.EPOCHS) or I.is_epoch(parent_inode):
            attrs = await self.dirs.lookup(parent_inode, name)
        else:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if I.slot_of(attrs.st_ino) is not None:
            self.generations.entry(attrs)
            ino = attrs.st_ino
            if parent_inode == I.SEGMENTS:  # the name SegmentFiles.names notes
                names = {self.segment_files.names.get((I.inode_segment(ino), I.is_sizes(ino)))}
            else:
                number = I.parse_number(name)
                names = {I.event_name(number), str(number).encode()}
            if name not in names:
                # a third spelling of a number (``0042``): never cached, so that a
                # replacement, which drops the canonical names (LogWatch._invalidate_sync),
                # leaves no dentry that holds an old generation's inode
                attrs.entry_timeout = 0
        return attrs

    @guarded
    async def readlink(self, inode, ctx):
        """``follow/next`` (``nodes/follow_dir.py``): waits for the next event."""
        if inode != I.FOLLOW_NEXT:
            raise pyfuse3.FUSEError(errno.EINVAL)  # no other node is a symlink
        return await self.follow_files.readlink(inode, _interrupted(ctx))

    @guarded
    async def getattr(self, inode, ctx=None):
        attrs = await self.attrs_of(inode)
        self.generations.current(inode, f"inode {inode}")  # the log may have changed meanwhile
        return attrs

    @guarded
    async def setattr(self, inode, attr, fields, fh, ctx):
        return await self._kind(inode).setattr(inode, attr, fields, fh, ctx)

    # --- directories (nodes/dirs.py) -----------------------------------------------------

    @guarded
    async def opendir(self, inode, ctx):
        return await self.dirs.opendir(inode)

    @guarded
    async def readdir(self, fh, start_id, token):
        return await self.dirs.readdir(fh, start_id, token)

    @guarded
    async def releasedir(self, fh):
        return None

    # --- reading -------------------------------------------------------------------------

    @guarded
    async def open(self, inode, flags, ctx):
        if self.no_open:
            # the kernel takes ENOSYS as "opens need no request" for the whole mount: it
            # opens every file itself (a read-only mount: the kernel refuses writes) and
            # reads arrive by inode (read_inode), where the open's checks now happen
            raise pyfuse3.FUSEError(errno.ENOSYS)
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND)
        self.generations.current(inode, f"inode {inode}")
        return await self._kind(inode).open(inode, flags, writing, ctx)

    @guarded
    async def read(self, fh, off, size):
        return await self._read_handle(fh, off, size)

    @guarded
    async def read_inode(self, inode, fh, off, size):
        """Every read, with patched pyfuse3 (``read_inode`` in :data:`FEATURES`): through
        the handle an open made, or by inode when the kernel opened the file itself
        (fh 0: the no-open path, where the open's checks happen)."""
        if fh:
            return await self._read_handle(fh, off, size)
        return await self._kind(inode).read_inode(inode, off, size)

    async def _read_handle(self, fh: int, off: int, size: int) -> bytes:
        h = self._handles.get(fh)
        if isinstance(h, EventHandle):
            return await self.event_files.read_handle(h, off, size)
        if isinstance(h, BytesHandle):
            return h.data[off : off + size]
        if isinstance(h, SegmentHandle):
            return self.segment_files.read_handle(h, off, size)
        raise pyfuse3.FUSEError(errno.EBADF)

    # --- writing (nodes/new.py, nodes/meta.py) -------------------------------------------

    def set_device(self, device: str) -> None:
        """The mount's ``major:minor`` (from mountinfo, once mounted): how the commit rule
        knows this mount's descriptors in another process's table."""
        self.mounts = rule.Mounts(device)

    @guarded
    async def create(self, parent_inode, name, mode, flags, ctx):
        if parent_inode == I.META:
            return await self.meta_files.create(name, ctx)
        return await self.new_files.create(parent_inode, name, ctx)

    @guarded
    async def write(self, fh, off, buf, ctx=None):
        h = self._handles.get(fh)
        if isinstance(h, Reservation):
            return await self.new_files.write(h, off, buf, ctx)
        if isinstance(h, MetaWriteHandle):
            return await self.meta_files.write(h, off, buf, ctx)
        raise pyfuse3.FUSEError(errno.EBADF)

    @guarded
    async def flush(self, fh, ctx=None):
        if self.readonly:
            # nothing commits on a read-only mount; ENOSYS makes the kernel stop sending
            # FLUSH on every close
            raise pyfuse3.FUSEError(errno.ENOSYS)
        h = self._handles.get(fh)
        if isinstance(h, Reservation):
            await self.new_files.flush(h, fh, ctx)
        elif isinstance(h, MetaWriteHandle):
            await self.meta_files.flush(h, fh, ctx)

    @guarded
    async def release(self, fh, ctx=None):
        h = self._handles.pop(fh, None)
        if isinstance(h, Reservation):
            self.new_files.release(h)
        elif isinstance(h, MetaWriteHandle):
            self.meta_files.release(h)

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
        if I.is_staging(inode):  # new/<N>: user.bookfs.unchecked (nodes/new.py)
            return await self.new_files.getxattr(inode, name, ctx)
        raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel stops asking

    @guarded
    async def listxattr(self, inode, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def setxattr(self, inode, name, value, ctx):
        if I.is_staging(inode):  # new/<N>: user.bookfs.unchecked (nodes/new.py)
            return await self.new_files.setxattr(inode, name, value, ctx)
        # what the caller saw with ENOSYS too (the kernel turns it into EOPNOTSUPP), but
        # ENOSYS would also make the kernel refuse every later setxattr of the mount,
        # new/'s user.bookfs.unchecked included (bookfs append --unchecked)
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    @guarded
    async def removexattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (self.log.log_bytes + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = self.log.count + 16
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s
