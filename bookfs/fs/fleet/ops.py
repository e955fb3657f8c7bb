"""A fleet mount (``bookfs mount --fleet DIR MNT``, read-only): every log under ``DIR``
as ``MNT/<ship>/``, with a single mount's layout, served by one daemon.

**Ships.** ``MNT/`` lists the ships of ``DIR`` (``formats/fleet.py``: the @p from each
log's meta, the directory name as a fallback), and is read again whenever ``DIR``
changes (checked every second, :meth:`FleetOperations.loop`): a pier added appears, one
removed disappears (the kernel is told to drop its entry), within about a second.

**Opening on first use, closing when idle.** Listing ``MNT/`` and each ship's root, and
looking a ship up, open no log: the names are known and a ship's root lists the fixed
entries of a single mount (``events``, ``meta``, ``new``, ``info``, ``pretty``,
``follow``).  Their attributes (``events/``'s size is the event count, ``info``'s its
summary's length) come, while the log is closed, from the ship's *card*, kept with its
persisted index and believed only while the log's files are exactly as they were when it
was written (``formats/shipcard.py``; :class:`~bookfs.fs.fleet.ship.ShipFaces`): the
same attributes the open log gives, so ``find MNT -maxdepth 2`` opens no log once each
ship has a card (a pier's is in a card file of its own in the index cache).  Without
one (the first open of a ship, a log that changed since, a single vere-layout Book
directory or LMDB epoch) a ``stat`` of those entries opens the log, as
does any other request inside ``MNT/<ship>/``: its log is opened (read-only, in a worker
thread; :func:`~bookfs.formats.pier.open_source`; then its card written, when it has
none that holds) and the request handed to a
:class:`ShipOperations`: the :class:`~bookfs.fs.ops.LogOperations` of a single
read-only mount, unchanged but for its inode numbers, which are mapped into the fleet's
(``fs/fleet/inodes.py``).  At most ``max_open`` logs are open (the least recently used
one with no request in flight is closed to open another) and a log unused for
``idle_close`` seconds is closed.  The mapped inode numbers of a ship are the same after
its log is closed and opened again, so nothing the kernel cached goes stale.  Small
events are cached in one :class:`~bookfs.fs.cache.EventCache` shared by every ship
(64 MiB by default).  Memory per ship: about 300 bytes while its log is closed; an open
log costs what a single mount's does (its index: 8 bytes per event).

**A ship that cannot be opened** (a damaged log, a directory that holds no log, a file
that cannot be read) is shown, once an open failed, as a regular read-only file
``MNT/<name>`` whose content is one line saying why (``cat MNT/<name>``); the request
that found it answers EIO and the kernel is told to look the name up again.  The other
ships are not affected.  The open is tried again at a lookup of the name once
:data:`RETRY` seconds have passed.  A pier whose ``.vere.lock`` a live ship holds is no
error: a read-only open takes no lock (as ``-o ro`` on a single mount), so the fleet
follows that ship's log as it grows.

**Tools.** ``MNT/.bookfs-fleet`` (not listed) says that ``MNT`` is a fleet mount and
holds a summary of the daemon (ships, open logs, cache): ``bookfs info MNT`` and
``format("bookfs")`` look for it.

Every handler is guarded (:func:`~bookfs.fs.ops.guarded`): it answers FUSEError only.
Writes of any kind answer EROFS.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections import OrderedDict

import pyfuse3
import trio

from bookfs.formats import index as X
from bookfs.formats.fleet import FLEET_MARKER, FleetDir, Ship
from bookfs.formats.info import render
from bookfs.formats.shipcard import open_keeping_card
from bookfs.fs.fleet import inodes as F
from bookfs.fs.fleet.ahead import MAX_SHIPS, CardsAhead
from bookfs.fs import inodes as I
from bookfs.fs.cache import DEFAULT_MAX_BYTES, EventCache
from bookfs.fs.fleet.ship import SHIP_ROOT, SHIP_ROOT_NAMES, ShipFaces, ShipOperations
from bookfs.fs.nodes.base import CHANGING, directory_bits
from bookfs.fs.ops import FEATURES, guarded
from bookfs.fs.tail import DEFAULT_TIMEOUT, WAITING_EVERY

log = logging.getLogger(__name__)

MAX_OPEN = 64  # logs open at once (the least recently used idle one is closed)
IDLE_CLOSE = 30.0  # seconds without a request after which a log is closed
RETRY = 10.0  # seconds before the open of a ship that failed is tried again
SCAN_EVERY = 1.0  # seconds between looks at the fleet directory


class FleetOperations(pyfuse3.Operations):
    """The fleet's dispatcher: its own root, marker and error files, and every other
    request handed to the ship whose inode it names (module docstring)."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, directory: str, mountpoint: str, *, max_open: int = MAX_OPEN,
                 idle_close: float = IDLE_CLOSE, cache_bytes: int = DEFAULT_MAX_BYTES,
                 segment_span: int | None = None,
                 owner: tuple[int | None, int | None] = (None, None),
                 umask: int | None = None, follow_timeout: float = DEFAULT_TIMEOUT,
                 ships_ahead: int = MAX_SHIPS, debug: bool = False):
        super().__init__()
        from bookfs.formats.segments import DEFAULT_SPAN

        self.directory, self.mountpoint, self.debug = directory, mountpoint, debug
        self.max_open, self.idle_close = max(1, max_open), idle_close
        self.segment_span = segment_span or DEFAULT_SPAN
        self.owner, self.umask, self.follow_timeout = owner, umask, follow_timeout
        self.fleet = FleetDir(directory)
        self.inodes = F.InodeMap()
        self.cache = EventCache(cache_bytes)
        self.open_ships: OrderedDict[int, ShipOperations] = OrderedDict()  # LRU first
        self.errors: dict[int, tuple[str, float]] = {}  # sid -> (why, when)
        self._opening: dict[int, trio.Event] = {}
        self._by_sid: dict[int, Ship] = {}
        #: sid -> what a closed ship's next open compares with (``_close``): ~200 bytes
        self._closed: dict[int, tuple] = {}
        self._handles: dict[int, tuple] = {}
        self._next_fh = 1
        self.no_open = "read_inode" in FEATURES
        self.opened = self.closed = 0  # counts, for the marker file
        self.mounted_ns = time.time_ns()
        self.faces = ShipFaces(self)
        self.ahead = CardsAhead(ships_ahead)  # cards built ahead of a walk (``ahead.py``)
        self._order: list[Ship] = []  # the ships as ``ls MNT`` lists them (by name)
        self._pos: dict[int, int] = {}  # sid -> its place in ``_order``
        st = os.stat(directory)
        self._dir_owner = st.st_uid, st.st_gid  # what the root's classes count from
        self._uid = st.st_uid if owner[0] is None else owner[0]
        self._gid = st.st_gid if owner[1] is None else owner[1]
        self.rescan()

    # --- ships -------------------------------------------------------------------------

    def rescan(self, force: bool = False) -> list[Ship]:
        """Scan the fleet directory; the ships that are gone since (their logs closed)."""
        before = dict(self._by_sid)
        self.fleet.scan(force)
        self._by_sid = {s.sid: s for s in self.fleet.ships.values()}
        self._order = sorted(self._by_sid.values(), key=lambda s: s.name)
        self._pos = {s.sid: i for i, s in enumerate(self._order)}
        # every ship's index and card kept by this process's prune of the index cache (a
        # pier: its card file, and the indexes of its UIP Book epochs, if any)
        self.ahead.keep = 2 * len(self._by_sid) + X.INDEX_KEEP
        X.keep_at_least(self.ahead.keep)
        for sid, ship in self._by_sid.items():
            if sid not in before and ship.who is None and sid not in self.errors:
                self._check_kind(ship)
        gone = [s for sid, s in before.items()
                if sid not in self._by_sid or (self._by_sid[sid].path, self._by_sid[sid].ino)
                != (s.path, s.ino)]
        for s in gone:
            self.errors.pop(s.sid, None)
            self.faces.forget(s.sid)
            self._closed.pop(s.sid, None)
            ops = self.open_ships.get(s.sid)
            if ops is not None and not ops.in_use:
                self._close(s.sid)
        return gone

    def _check_kind(self, ship: Ship) -> None:
        """A new entry whose meta gave no ship: is it a log at all?  (A few ``stat``s,
        :func:`~bookfs.formats.pier.identify`; one that is not is an error file at once.)"""
        from bookfs.formats.pier import identify

        try:
            identify(ship.path)
        except Exception as e:
            self.errors[ship.sid] = (str(e) or type(e).__name__, time.monotonic())

    def _ship(self, sid: int) -> Ship:
        ship = self._by_sid.get(sid)
        if ship is None:
            raise pyfuse3.FUSEError(errno.ESTALE if sid in self.open_ships or sid
                                    else errno.ENOENT)
        return ship

    async def ship_ops(self, sid: int) -> ShipOperations:
        """The open log of ship ``sid``, opened now if it is not (EIO, and the ship shown
        as an error file, if it cannot be)."""
        ops = self.open_ships.get(sid)
        if ops is not None:
            self.open_ships.move_to_end(sid)
            return ops
        ship = self._ship(sid)
        if sid in self.errors:
            raise pyfuse3.FUSEError(errno.EIO)
        pending = self._opening.get(sid)
        if pending is not None:
            await pending.wait()
            return await self.ship_ops(sid)
        done = self._opening[sid] = trio.Event()
        try:
            self._ahead(sid, self.ahead.opened)
            self._make_room()
            self.faces.forget(sid)
            try:
                book = await trio.to_thread.run_sync(open_keeping_card, ship.path)
            except Exception as e:
                why = str(e) or type(e).__name__
                self.errors[sid] = (why, time.monotonic())
                log.warning("%s: cannot open %s: %s", ship.name, ship.path, why)
                trio.lowlevel.spawn_system_task(self._drop_entry, ship.name.encode())
                raise pyfuse3.FUSEError(errno.EIO) from None
            try:
                ops = ShipOperations(self, ship, book)
            except BaseException:
                book.close()
                raise
            closed = self._closed.pop(sid, None)
            if closed is not None:  # what the kernel may still cache of its last open
                ops.watch.resume(*closed)
            self.open_ships[sid] = ops
            self.opened += 1
            log.info("%s: opened %s (events %s)", ship.name, ship.path, book.gulf())
            return ops
        finally:
            del self._opening[sid]
            done.set()

    def _ahead(self, sid: int, what) -> None:
        pos = self._pos.get(sid)  # ``what``: ``self.ahead.opened`` or ``.reached``
        if pos is not None and self.ahead.max_ships:
            what(pos, self._order, self.faces.holds)

    def _make_room(self) -> None:
        """Close the least recently used idle logs while ``max_open`` are open."""
        for sid in list(self.open_ships):
            if len(self.open_ships) < self.max_open:
                return
            if not self.open_ships[sid].in_use:
                self._close(sid)

    def _close(self, sid: int) -> None:
        """Close ship ``sid``'s log, keeping what its next open needs to tell whether
        the kernel's cached pages and names of it are still its log's: the log's token
        (``identity()``), the events published and the inode slots in use (``watch.py``,
        :meth:`~bookfs.fs.watch.LogWatch.resume`)."""
        ops = self.open_ships.pop(sid)
        self.closed += 1
        if sid in self._by_sid:  # (a ship gone from the directory is not opened again)
            f = ops.watch
            with contextlib.suppress(Exception):
                self._closed[sid] = (ops.log.identity(), f.known, ops.generations.slot,
                                     ops.generations.slot_refs)
        try:
            ops.close_log()
        except Exception:
            log.exception("%s: closing its log failed", ops.ship.name)

    def close_all(self) -> None:
        self.ahead.stop()
        for sid in list(self.open_ships):
            self._close(sid)

    async def _drop_entry(self, name: bytes, root_too: bool = True) -> None:
        """Tell the kernel to look ``MNT/<name>`` up again (and to list ``MNT/`` again),
        in a worker thread as every notification (``watch.py``)."""
        def drop():
            with contextlib.suppress(OSError):
                pyfuse3.invalidate_entry(F.FLEET_ROOT, name)
            if root_too:
                with contextlib.suppress(OSError):
                    pyfuse3.invalidate_inode(F.FLEET_ROOT)
        try:
            await trio.to_thread.run_sync(drop)
        except Exception:
            log.exception("invalidating %r failed", name)

    async def loop(self) -> None:
        """Every second: look at the fleet directory, follow each open log (as a
        read-only mount's follower does; every 50 ms while a ``follow/`` lookup waits),
        close the logs idle for ``idle_close`` seconds."""
        last_scan = last_retry = time.monotonic()
        while True:
            waiting = any(ops.tail.waiting for ops in self.open_ships.values())
            await trio.sleep(WAITING_EVERY if waiting else SCAN_EVERY)
            now = time.monotonic()
            try:
                if now - last_retry >= RETRY:
                    # entries whose meta said nothing yet (a pier still being copied in):
                    # read again, so the ship gets its @p once its meta.bin is there
                    last_retry = now
                    unnamed = [s for s in self.fleet.ships.values() if s.who is None]
                    for ship in unnamed:
                        self.fleet.forget_entry(ship.entry)
                    if unnamed:
                        last_scan = 0.0
                if now - last_scan >= SCAN_EVERY:
                    last_scan = now
                    await self._rescan_and_tell()
            except Exception:
                log.exception("looking at the fleet directory failed; trying again")
            if self.ahead.running:
                self.ahead.idle(now, self.idle_close)
            for sid, ops in list(self.open_ships.items()):
                if not ops.in_use and now - ops.used > self.idle_close:
                    self._close(sid)
                    continue
                try:
                    ops.watch.look(inline_sync=False)
                except Exception as e:  # one ship's trouble never stops the others
                    log.warning("%s: following its log failed: %s", ops.ship.name, e)

    async def _rescan_and_tell(self) -> None:
        names = set(self.fleet.ships)
        gone = self.rescan()
        if gone or set(self.fleet.ships) != names:
            log.info("the fleet changed: %d ships", len(self.fleet.ships))
            for s in gone:
                await self._drop_entry(s.name.encode(), root_too=False)
            await self._drop_entry(b"", root_too=True)

    # --- attributes --------------------------------------------------------------------

    def _attrs(self, ino: int, mode: int, size: int, timeout: float, *, uid=None, gid=None,
               mtime_ns: int | None = None, nlink: int = 1) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino, a.st_mode, a.st_nlink, a.st_size = ino, mode, nlink, size
        a.st_uid = self._uid if uid is None else uid
        a.st_gid = self._gid if gid is None else gid
        a.st_blksize, a.st_blocks = 4096, (size + 511) // 512
        a.st_atime_ns = a.st_ctime_ns = a.st_mtime_ns = (self.mounted_ns if mtime_ns is None
                                                         else mtime_ns)
        a.attr_timeout = a.entry_timeout = timeout
        return a

    def _error_text(self, ship: Ship) -> bytes:
        why = self.errors.get(ship.sid, ("",))[0]
        return f"{ship.entry}: cannot be read: {why}\n".encode()

    def _marker_text(self) -> bytes:
        return render({"fleet": self.directory, "ships": len(self.fleet.ships),
                       "errors": len(self.errors), "open": len(self.open_ships),
                       "max_open": self.max_open, "idle_close": self.idle_close,
                       "opened": self.opened, "closed": self.closed,
                       "cache": f"{self.cache.bytes} of {self.cache.max_bytes} bytes",
                       "cards_read": self.faces.read, "cards_stale": self.faces.stale,
                       "cards_missing": self.faces.missing,
                       "ships_read_ahead": self.ahead.ships_sent,
                       "ships_built_ahead": self.ahead.ships_built,
                       "table_inodes": len(self.inodes)}).encode()

    def _root_entry(self, ship: Ship) -> pyfuse3.EntryAttributes:
        if ship.sid in self.errors:
            return self.faces.error_file(ship, len(self._error_text(ship)))
        return self.faces.root(ship)

    def _closed_entry(self, sid: int, local: int) -> pyfuse3.EntryAttributes | None:
        """A closed ship's fixed entry ``local`` from its card (None: open the log)."""
        if sid in self.open_ships or sid in self.errors:
            return None
        return self.faces.entry(self._ship(sid), local)

    async def _fleet_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        mode = directory_bits(self.directory, *self._dir_owner, umask=self.umask)
        if ino == F.FLEET_ROOT:
            return self._attrs(ino, stat.S_IFDIR | mode, 0, CHANGING, nlink=2)
        if ino == F.MARKER:
            # a new mtime at every look: the kernel, which rechecks the attributes before
            # reading on the no-open path, drops the pages it holds of an older summary
            return self._attrs(ino, stat.S_IFREG | mode & 0o444, len(self._marker_text()),
                               0.0, mtime_ns=time.time_ns())
        raise pyfuse3.FUSEError(errno.ENOENT)

    def _route(self, ino: int) -> tuple[int, int]:
        """``(sid, local)`` of a ship's inode (ENOENT for a number that names none)."""
        loc = self.inodes.local(ino)
        if loc is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return loc

    async def _call(self, sid: int, method: str, *args):
        ops = await self.ship_ops(sid)
        ops.busy += 1
        try:
            return await getattr(ops, method)(*args)
        finally:
            ops.busy -= 1
            ops.used = time.monotonic()

    # --- lookups and attributes --------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode == F.FLEET_ROOT:
            if name == FLEET_MARKER.encode():
                return await self._fleet_attrs(F.MARKER)
            ship = self.fleet.ships.get(name.decode("utf-8", "surrogateescape"))
            if ship is None:
                self.rescan()  # a pier added in the last second
                ship = self.fleet.ships.get(name.decode("utf-8", "surrogateescape"))
            if ship is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            failed = self.errors.get(ship.sid)
            if failed is not None and time.monotonic() - failed[1] > RETRY:
                del self.errors[ship.sid]
                with contextlib.suppress(pyfuse3.FUSEError):
                    await self.ship_ops(ship.sid)  # tried again: a file again if it fails
            return self._root_entry(ship)
        sid, local = self._route(parent_inode)
        if local == I.ROOT and name in SHIP_ROOT_NAMES:
            attrs = self._closed_entry(sid, SHIP_ROOT_NAMES[name])
            if attrs is not None:
                return attrs
        attrs = await self._call(sid, "lookup", local, name, ctx)
        if attrs.st_ino:  # 0: a negative entry (a name that can never exist), kept so
            attrs.st_ino = self.inodes.fleet(sid, attrs.st_ino, lookup=True)
        return attrs

    @guarded
    async def getattr(self, inode, ctx=None):
        if inode < (1 << F.SHIFT):
            return await self._fleet_attrs(inode)
        sid, local = self._route(inode)
        ship = self._ship(sid)
        if local == 0:
            return self._root_entry(ship) if sid in self.errors else _enoent()
        if local == I.ROOT:
            return self.faces.root(ship)
        if local in SHIP_ROOT_INODES:
            attrs = self._closed_entry(sid, local)
            if attrs is not None:
                return attrs
        attrs = await self._call(sid, "getattr", local, ctx)
        attrs.st_ino = inode
        return attrs

    @guarded
    async def forget(self, inode_list):
        per_ship: dict[int, list] = {}
        for ino, n in inode_list:
            loc = self.inodes.local(ino)
            if loc is not None and loc[0] in self.open_ships:
                per_ship.setdefault(loc[0], []).append((loc[1], n))
            self.inodes.forget(ino, n)
        for sid, items in per_ship.items():
            self.open_ships[sid].generations.forget(items)

    @guarded
    async def readlink(self, inode, ctx):
        sid, local = self._route(inode)
        return await self._call(sid, "readlink", local, ctx)

    @guarded
    async def setattr(self, inode, attr, fields, fh, ctx):
        raise pyfuse3.FUSEError(errno.EROFS)

    # --- directories -------------------------------------------------------------------

    def _fh(self, record: tuple) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = record
        return fh

    @guarded
    async def opendir(self, inode, ctx):
        if inode == F.FLEET_ROOT:
            self.rescan()
            self.ahead.root_listed(self._order, self.faces.card_now)  # (``ahead.py``)
            return pyfuse3.FileInfo(fh=self._fh(("root",)))
        sid, local = self._route(inode)
        self._ship(sid)
        if local == 0:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if local == I.ROOT:
            self._ahead(sid, self.ahead.reached)
        if local == I.ROOT and sid not in self.open_ships:
            return pyfuse3.FileInfo(fh=self._fh(("shiproot", sid)))
        got = await self._call(sid, "opendir", local, ctx)
        if isinstance(got, pyfuse3.FileInfo):
            got.fh = self._fh(("ship", sid, got.fh))
            return got
        return pyfuse3.FileInfo(fh=self._fh(("ship", sid, got)))

    @guarded
    async def readdir(self, fh, start_id, token):
        record = self._handles.get(fh)
        if record is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if record[0] == "root":
            ships = self._order  # (by name)
            for i in range(start_id, len(ships)):
                ship = ships[i]
                try:
                    attrs = self._root_entry(ship)
                except OSError:  # removed meanwhile
                    continue
                if not pyfuse3.readdir_reply(token, ship.name.encode("utf-8",
                                                                     "surrogateescape"),
                                             attrs, i + 1):
                    return
            return
        if record[0] == "shiproot":
            if start_id >= len(SHIP_ROOT):  # the end, asked for again: nothing to list
                return
            entries = self.faces.listing(self._ship(record[1]))
            for i in range(start_id, len(entries)):
                if not pyfuse3.readdir_reply(token, *entries[i], i + 1):
                    return
            return
        _, sid, local_fh = record
        await self._call(sid, "readdir", local_fh, start_id, token)

    @guarded
    async def releasedir(self, fh):
        self._handles.pop(fh, None)

    # --- reading -----------------------------------------------------------------------

    def _fleet_file(self, inode: int) -> bytes:
        if inode == F.MARKER:
            return self._marker_text()
        sid, local = self._route(inode)
        ship = self._ship(sid)
        if local == 0 and sid in self.errors:
            return self._error_text(ship)
        raise pyfuse3.FUSEError(errno.ENOENT)

    @guarded
    async def open(self, inode, flags, ctx):
        if self.no_open:
            raise pyfuse3.FUSEError(errno.ENOSYS)  # as a single read-only mount (ops.py)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        if inode == F.MARKER or self._route(inode)[1] == 0:
            data = self._fleet_file(inode)
            return pyfuse3.FileInfo(fh=self._fh(("bytes", data)), direct_io=True)
        sid, local = self._route(inode)
        got = await self._call(sid, "open", local, flags, ctx)
        got.fh = self._fh(("ship", sid, got.fh))
        return got

    @guarded
    async def read(self, fh, off, size):
        return await self._read_fh(fh, off, size)

    async def _read_fh(self, fh: int, off: int, size: int) -> bytes:
        record = self._handles.get(fh)
        if record is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if record[0] == "bytes":
            return record[1][off : off + size]
        _, sid, local_fh = record
        return await self._call(sid, "read", local_fh, off, size)

    @guarded
    async def read_inode(self, inode, fh, off, size):
        if fh:
            return await self._read_fh(fh, off, size)
        if inode == F.MARKER or self._route(inode)[1] == 0:
            return self._fleet_file(inode)[off : off + size]
        sid, local = self._route(inode)
        return await self._call(sid, "read_inode", local, 0, off, size)

    @guarded
    async def release(self, fh, ctx=None):
        record = self._handles.pop(fh, None)
        if record is not None and record[0] == "ship" and record[1] in self.open_ships:
            await self.open_ships[record[1]].release(record[2], ctx)

    @guarded
    async def flush(self, fh, ctx=None):
        raise pyfuse3.FUSEError(errno.ENOSYS)  # nothing commits on a read-only mount

    @guarded
    async def fsync(self, fh, datasync):
        return None

    @guarded
    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = sum((o.log.log_bytes + 4095) // 4096 for o in self.open_ships.values())
        s.f_bfree = s.f_bavail = s.f_ffree = s.f_favail = 0
        s.f_files = len(self.fleet.ships) + 16
        s.f_namemax = 255
        return s

    # --- refusals: the fleet is read-only ----------------------------------------------

    async def _erofs(self, *args):
        raise pyfuse3.FUSEError(errno.EROFS)

    create = write = unlink = rmdir = rename = mkdir = mknod = symlink = link = \
        guarded(_erofs)

    # --- no extended attributes --------------------------------------------------------

    async def _enosys(self, *args):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def _enotsup(self, *args):
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    getxattr = listxattr = removexattr = guarded(_enosys)
    setxattr = guarded(_enotsup)


SHIP_ROOT_INODES = frozenset(SHIP_ROOT_NAMES.values())


def _enoent():
    raise pyfuse3.FUSEError(errno.ENOENT)
