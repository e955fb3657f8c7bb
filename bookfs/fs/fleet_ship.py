"""One ship of a fleet mount (``fs/fleet.py``): a single read-only mount's
:class:`~bookfs.fs.ops.BookOperations` over the ship's log, unchanged but for what it tells
the kernel (listings, cache invalidations), whose inode numbers it maps into the fleet's
(``fs/fleet_inodes.py``), and for its small-event cache, a view of the fleet's one shared
:class:`~bookfs.fs.cache.EventCache`."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pyfuse3

from bookfs.formats.fleet import Ship
from bookfs.fs.cache import EventCache
from bookfs.fs.ops import BookOperations

if TYPE_CHECKING:
    from bookfs.fs.fleet import FleetOperations


class ShipCache:
    """One ship's view of the fleet's shared :class:`EventCache` (keys ``(sid, event)``)."""

    def __init__(self, shared: EventCache, sid: int):
        self.shared, self.sid = shared, sid

    def get(self, event: int):
        return self.shared.get((self.sid, event))

    def put(self, event: int, data: bytes) -> None:
        self.shared.put((self.sid, event), data)

    def clear(self) -> None:
        items = self.shared._items
        for key in [k for k in items if k[0] == self.sid]:
            self.shared.bytes -= len(items.pop(key))

    def __len__(self) -> int:
        return sum(1 for k in self.shared._items if k[0] == self.sid)


class ShipOperations(BookOperations):
    """A single read-only mount's operations over one ship's log, telling the kernel
    about its inodes by their fleet numbers (listings and cache invalidations)."""

    def __init__(self, fleet: FleetOperations, ship: Ship, book):
        super().__init__(book, mountpoint=os.path.join(fleet.mountpoint, ship.name),
                         segment_span=fleet.segment_span, owner=fleet.owner,
                         umask=fleet.umask, follow_timeout=fleet.follow_timeout)
        self.ship, self.sid, self.map = ship, ship.sid, fleet.inodes
        self.event_files.cache = ShipCache(fleet.cache, ship.sid)
        self.readdir_reply = self._reply
        self.invalidate_inode = self._invalidate_inode
        self.invalidate_entry = self._invalidate_entry
        self.busy = 0  # requests in flight
        self.used = time.monotonic()

    def _reply(self, token, name, attrs, next_id) -> bool:
        local = attrs.st_ino
        ino = attrs.st_ino = self.map.fleet(self.sid, local, lookup=True)
        try:
            ok = pyfuse3.readdir_reply(token, name, attrs, next_id)
        finally:
            attrs.st_ino = local
        if not ok:
            self.map.forget(ino, 1)
        return ok

    def _invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        fleet_ino = self.map.fleet(self.sid, ino)
        if fleet_ino is not None:
            pyfuse3.invalidate_inode(fleet_ino, attr_only)

    def _invalidate_entry(self, parent: int, name: bytes) -> None:
        fleet_ino = self.map.fleet(self.sid, parent)
        if fleet_ino is not None:
            pyfuse3.invalidate_entry(fleet_ino, name)

    @property
    def in_use(self) -> bool:
        """A request in flight or a file or directory held open (stock pyfuse3's handles
        name this log's objects): the log is not closed then."""
        return bool(self.busy or self._handles)

    def close_log(self) -> None:
        self.tail.close("the fleet closed this ship's log")
        self.event_files.cache.clear()
        self.prober.close(wait=False)
        self.queue.saver.close()
        self.book.close()
