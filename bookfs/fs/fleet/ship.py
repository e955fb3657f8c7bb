"""One ship of a fleet mount (``fs/fleet/ops.py``): a single read-only mount's
:class:`~bookfs.fs.ops.LogOperations` over the ship's log, unchanged but for what it tells
the kernel (listings, cache invalidations), whose inode numbers it maps into the fleet's
(``fs/fleet/inodes.py``), and for its small-event cache, a view of the fleet's one shared
:class:`~bookfs.fs.cache.EventCache`; and :class:`ShipFaces`, what the fleet shows of a
ship's root and its fixed entries without its log open."""

from __future__ import annotations

import functools
import itertools
import os
import stat
import time
from typing import Any, Protocol

import pyfuse3

from bookfs.formats.fleet import Ship
from bookfs.formats.info import with_core
from bookfs.formats.shipcard import Card, looked, read_card, settled, source_file, witness_names
from bookfs.fs.fleet import inodes as F
from bookfs.fs import inodes as I
from bookfs.fs.cache import EventCache
from bookfs.fs.nodes.base import (CHANGING, FOREVER, REFRESH, Looks, make_attrs, modes_of,
                                  source_paths)
from bookfs.fs.nodes.dirs import fixed_attrs, readonly_info
from bookfs.fs.ops import LogOperations, fuse_path

#: a single mount's root as ``ls`` shows it (``nodes/dirs.py``, ``Directories.root_listed``)
SHIP_ROOT = ((b"events", I.EVENTS), (b"meta", I.META), (b"new", I.NEW), (b"info", I.INFO),
             (b"pretty", I.PRETTY), (b"follow", I.FOLLOW))
SHIP_ROOT_NAMES = dict(SHIP_ROOT)



class Fleet(Protocol):
    """What a ship reads of its fleet (``fs/fleet/ops.py``, ``FleetOperations``): the
    fleet's mount options, inodes, shared cache and attribute maker."""

    mountpoint: str
    segment_span: int
    owner: tuple[int | None, int | None]
    umask: int | None
    follow_timeout: float
    inodes: F.InodeMap
    cache: EventCache
    mounted_ns: int
    ahead: Any  # ``fs/fleet/ahead.py``'s CardsAhead: its ``rebuilt(path)``

    def _attrs(self, ino: int, mode: int, size: int, timeout: float, **kw: Any
               ) -> pyfuse3.EntryAttributes: ...


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

    def __contains__(self, event: int) -> bool:
        return (self.tag, event) in self.shared


class ShipOperations(LogOperations):
    """A single read-only mount's operations over one ship's log, telling the kernel
    about its inodes by their fleet numbers (listings and cache invalidations)."""

    def __init__(self, fleet: Fleet, ship: Ship, book):
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
        # an empty log's directories are as old as the fleet's mount, open or closed
        self.mounted_ns = fleet.mounted_ns

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
        """A request in flight, a file or directory held open (stock pyfuse3's handles
        name this log's objects) or a chain walk under way (a listing's, in the
        background: ``EventFiles.walk_soon``): the log is not closed then."""
        return bool(self.busy or self._handles or self.event_files.walking)

    def source_here(self) -> bool:
        """The ship's directory is still the one the fleet found (a directory renamed
        into its place is another ship, with another id: ``formats/fleet.py``)."""
        if not self.ship.ino:
            return True
        try:
            return os.stat(self.ship.path).st_ino == self.ship.ino
        except OSError:
            return False

    def close_log(self) -> None:
        self.tail.close("the fleet closed this ship's log")
        self.event_files.cache.clear()
        self.prober.close(wait=False)
        self.queue.saver.close()
        self.log.close()


class ShipFaces:
    """What the fleet shows of a ship without opening its log: its root (``MNT/<ship>``)
    and the fixed entries of its root (:data:`SHIP_ROOT`).

    * The root's attributes never need the log, open or not: a single mount's modes and
      owner (:func:`~bookfs.fs.nodes.base.modes_of` of the ship's source file,
      :func:`~bookfs.formats.shipcard.source_file`), size 0, that file's mtime, cached
      ``CHANGING``.  (A single mount's root shows its newest event's mtime; a fleet's
      ship root shows its log file's, so that ``ls -l MNT`` opens no log.)
    * The fixed entries, while the log is closed, come from the ship's card
      (``formats/shipcard.py``) when one holds: built by
      :func:`~bookfs.fs.nodes.dirs.fixed_attrs` from its figures, as the open log's
      ``Directories`` builds them from the log, so the kernel sees the same mode, size,
      mtime, nlink and inode before and after the log is opened.  Without a card that
      holds (none yet, stale, neither a UIP Book directory nor a pier) there is nothing
      to answer with:
      :meth:`entry` says None (the caller opens the log), and :meth:`listing` gives
      placeholders cached for 0 s, so a ``stat`` asks (and opens the log).

    The card read last is kept per ship with the witnesses it was checked by; each use
    looks at the witnesses again (four ``lstat``; a pier's: a listing of ``.urb/log`` and
    four plus five per epoch), so a log that changed is never answered for from a card.
    Counts of cards read, found stale and missing are in the fleet's marker file
    (``stale`` and ``missing`` once per state of the files).

    The modes (:func:`~bookfs.fs.nodes.base.modes_of`: what every user of a class could
    do on disk, along the whole path from ``/`` through the fleet's directory to each
    file the ship's log is read from) are kept per ship while the source file and its
    owner stay the same.  Once :data:`~bookfs.fs.nodes.base.REFRESH` old they are
    looked at again, unless the caller has just looked at the ship's witnesses and they
    *pin* the modes:

    * the witnesses are those seen when the modes were computed, had settled then
      (:func:`~bookfs.formats.shipcard.settled`), hold no symbolic link, and name every
      file the modes were computed from;
    * every directory on the paths, as :class:`~bookfs.fs.nodes.base.Looks` sees it now
      (looked at again once :data:`~bookfs.fs.nodes.base.REFRESH` old, once for all
      ships), is as it was.

    A ``chmod``, ``chown`` or ACL change gives the file a new ctime (``fs/open.c``,
    ``chmod_common`` and ``chown_common``: ``ATTR_CTIME``; ``fs/ext4/xattr.c``,
    ``ext4_xattr_set_handle``), and a file added to or removed from a ship's directory
    gives that directory a new mtime, so a witness changes and the modes are computed
    again.  Either way a change anywhere on the path reaches the fleet's users within
    :data:`~bookfs.fs.nodes.base.REFRESH` of a request, as on a single mount
    (``tests/test_fleet_modes.py`` holds the class to a fresh computation).  What
    pinning saves is the whole look, about 90 µs a ship here, that a ``find`` over a
    fleet otherwise paid twice a ship: at the fleet's listing, and again at the ship's
    a second later (``docs/benchmarks.md``)."""

    def __init__(self, fleet):
        self.fleet = fleet
        self._cards: dict[int, tuple[tuple | None, Card | str]] = {}  # sid -> last read
        self._info_sizes: dict[int, tuple[Card, int]] = {}  # sid -> (card, its info's size)
        # sid -> (when, source key, (uid, gid, modes), pin): the last look (``_pinned``)
        self._modes_seen: dict[int, tuple[float, tuple, tuple, Any]] = {}
        self.looks = Looks()  # the directories every ship shares, looked at once a REFRESH
        self.read = self.stale = self.missing = 0
        self.fuse = fuse_path(True)

    def forget(self, sid: int) -> None:
        """The ship's log was opened (it may write a card) or the ship is gone."""
        self._cards.pop(sid, None)
        self._info_sizes.pop(sid, None)
        self._modes_seen.pop(sid, None)

    def modes(self, ship: Ship, seen: tuple | None = None, *, look: bool = False):
        """``(uid, gid, modes, stat)``: :func:`~bookfs.fs.nodes.base.modes_of` the
        ship's source file (its ``stat`` taken now), kept as the class docstring says.
        ``seen``: :func:`~bookfs.formats.shipcard.looked` of the ship, taken just before
        by the caller; ``look``: without it, taken here when the modes are over
        :data:`~bookfs.fs.nodes.base.REFRESH` old.  OSError if its directory is gone."""
        path = source_file(ship.path)
        st = os.stat(path)
        key, now = (path, st.st_uid, st.st_gid), time.monotonic()
        memo = self._modes_seen.get(ship.sid)
        if memo is not None and memo[1] == key and now - memo[0] < REFRESH:
            return (*memo[2], st)
        if seen is None and look:
            seen = looked(ship.path)
        if memo is not None and memo[1] == key and self._pinned(ship, memo[3], seen):
            self._modes_seen[ship.sid] = (now, *memo[1:])  # as good as looked at now
            return (*memo[2], st)
        fleet = self.fleet
        paths = None if fleet.umask is not None else source_paths(ship.path, self.looks)
        uid, gid, modes, st = modes_of(path, ship.path, True, owner=fleet.owner,
                                       umask=fleet.umask, looks=self.looks, paths=paths,
                                       st=st)
        pin = () if paths is None else None if seen is None or seen[0] is None else (
            seen, paths, tuple(self.looks.node(d) for d in paths[2]))
        self._modes_seen[ship.sid] = (now, key, (uid, gid, modes), pin)
        return uid, gid, modes, st

    def _pinned(self, ship: Ship, pin, seen: tuple | None) -> bool:
        """Whether the witnesses ``seen`` just now pin the modes kept with ``pin``:
        ``()`` (modes from the umask, which nothing on disk changes), or ``(what
        looked said then, what source_paths gave then, its directories' nodes then)``
        (class docstring)."""
        if pin == ():
            return True
        if pin is None or seen is None or seen[0] != pin[0][0]:
            return False
        (witnessed, taken), (standing, files, dirs), nodes = pin
        if not settled(witnessed, taken) or any(
                w is not None and stat.S_ISLNK(w[2]) for w in witnessed):
            return False
        names = witness_names(ship.path)
        if names is None or len(names) != len(witnessed):
            return False
        top = self.looks.realpath(ship.path)
        held = {f"{top}/{name}" if name else top
                for name, w in zip(names, witnessed) if w is not None}
        return (standing in held and held.issuperset(files)
                and all(self.looks.node(d) == n for d, n in zip(dirs, nodes)))

    def error_file(self, ship: Ship, size: int) -> pyfuse3.EntryAttributes:
        """The attributes of the file ``MNT/<name>`` that says why the ship cannot be
        opened (``fs/fleet/ops.py``; ``size`` bytes): readable by whoever could read its log
        (:meth:`modes`), by root alone if its directory cannot be looked at."""
        try:
            uid, gid, modes, _ = self.modes(ship)
            uid_gid, mode = {"uid": uid, "gid": gid}, modes.read
        except OSError:
            uid_gid, mode = {}, 0
        return self.fleet._attrs(F.error_inode(ship.sid), stat.S_IFREG | mode, size,
                                 CHANGING, **uid_gid)

    def root(self, ship: Ship) -> pyfuse3.EntryAttributes:
        """``MNT/<ship>``'s attributes (OSError if its directory is gone)."""
        uid, gid, modes, st = self.modes(ship, look=True)
        return make_attrs(uid, gid, F.ship_root(ship.sid), stat.S_IFDIR | modes.dir, 0,
                          st.st_mtime_ns, CHANGING, nlink=2)

    def card(self, ship: Ship, seen: tuple | None) -> Card | None:
        """The ship's card if one holds for its files as they are now (their witnesses,
        just looked at: ``seen``)."""
        memo = self._cards.get(ship.sid)
        if memo is not None and memo[0] is not None and seen == memo[0] and not (
                isinstance(memo[1], str) and self.fleet.ahead.rebuilt(ship.path)):
            got = memo[1]
        else:
            seen, got = read_card(ship.path, seen)
            self._cards[ship.sid] = (seen, got)
            if isinstance(got, Card):
                self.read += 1
            elif got == "stale":
                self.stale += 1
            else:
                self.missing += 1
        return got if isinstance(got, Card) else None

    def card_now(self, ship: Ship) -> Card | None:
        """:meth:`card`, the ship's witnesses looked at now."""
        return self.card(ship, looked(ship.path)[0])

    def holds(self, ship: Ship) -> bool:
        """The card read last of ``ship`` held (nothing is looked at)."""
        memo = self._cards.get(ship.sid)
        return memo is not None and isinstance(memo[1], Card)

    def _faces(self, ship: Ship):
        seen = looked(ship.path)
        uid, gid, modes, st = self.modes(ship, seen)
        return functools.partial(make_attrs, uid, gid), modes, st, self.card(ship, seen[0])

    def _from_card(self, make, modes, ship: Ship, local: int, card: Card
                   ) -> pyfuse3.EntryAttributes:
        mtime = self.fleet.mounted_ns if card.mtime_ns is None else card.mtime_ns
        size = self._info_size(ship, card) if local == I.INFO else 0
        a = fixed_attrs(make, modes, local, card.count, mtime, size)
        a.st_ino = self.fleet.inodes.fleet(ship.sid, local)
        return a

    def _info_size(self, ship: Ship, card: Card) -> int:
        """The size of the ``info`` file that ``card``'s summary renders: rendered once
        per card read (the card read last is kept per ship, :meth:`card`)."""
        memo = self._info_sizes.get(ship.sid)
        if memo is None or memo[0] is not card:
            memo = self._info_sizes[ship.sid] = (
                card, len(readonly_info(with_core(card.summary), self.fuse)))
        return memo[1]

    def entry(self, ship: Ship, local: int) -> pyfuse3.EntryAttributes | None:
        """The attributes of the fixed entry ``local`` of a closed ship, from its card;
        None without a card that holds."""
        make, modes, _, card = self._faces(ship)
        return None if card is None else self._from_card(make, modes, ship, local, card)

    def listing(self, ship: Ship) -> list[tuple[bytes, pyfuse3.EntryAttributes]]:
        """The closed ship's root as ``ls`` lists it (readdirplus): each entry's
        attributes from the card, else placeholders that the kernel asks for again."""
        make, modes, st, card = self._faces(ship)
        out = []
        for name, local in SHIP_ROOT:
            if card is not None:
                a = self._from_card(make, modes, ship, local, card)
            else:
                kind = (stat.S_IFREG | modes.read if local == I.INFO
                        else stat.S_IFDIR | modes.dir)
                a = make(self.fleet.inodes.fleet(ship.sid, local), kind, 0, st.st_mtime_ns,
                         0.0, nlink=1 if local == I.INFO else 2, entry_timeout=FOREVER)
            out.append((name, a))
        return out
