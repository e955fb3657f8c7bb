"""One ship of a fleet mount (``fs/fleet.py``): a single read-only mount's
:class:`~bookfs.fs.ops.BookOperations` over the ship's log, unchanged but for what it tells
the kernel (listings, cache invalidations), whose inode numbers it maps into the fleet's
(``fs/fleet_inodes.py``), and for its small-event cache, a view of the fleet's one shared
:class:`~bookfs.fs.cache.EventCache`."""

from __future__ import annotations

import itertools
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
    """One open log's view of the fleet's shared :class:`EventCache`: keys are ``(tag,
    event)``, with a tag no other open (or generation) of any ship has.  Dropping this
    view's entries (:meth:`clear`: the log changed under it; or the log is closed) only
    takes a new tag, in constant time: the old entries are never asked for again and
    leave the cache as the least recently used."""

    _tags = itertools.count(1)

    def __init__(self, shared: EventCache):
        self.shared = shared
        self.tag = next(self._tags)

    def get(self, event: int):
        return self.shared.get((self.tag, event))

    def put(self, event: int, data: bytes) -> None:
        self.shared.put((self.tag, event), data)

    def clear(self) -> None:
        self.tag = next(self._tags)

    def __len__(self) -> int:
        return sum(1 for k in self.shared._items if k[0] == self.tag)


class ShipOperations(BookOperations):
    """A single read-only mount's operations over one ship's log, telling the kernel
    about its inodes by their fleet numbers (listings and cache invalidations)."""

    def __init__(self, fleet: FleetOperations, ship: Ship, book):
        super().__init__(book, mountpoint=os.path.join(fleet.mountpoint, ship.name),
                         segment_span=fleet.segment_span, owner=fleet.owner,
                         umask=fleet.umask, follow_timeout=fleet.follow_timeout)
        self.ship, self.sid, self.map = ship, ship.sid, fleet.inodes
        self.event_files.cache = ShipCache(fleet.cache)
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
