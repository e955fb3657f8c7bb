"""A fleet: a directory of piers (or Book directories, or LMDB epochs), one per ship,
named the way ``bookfs mount --fleet`` shows them.  Knows nothing of FUSE.

What this module does is cheap, so that a fleet of a thousand ships can be listed in
well under a second and no log is opened to list it:

* :meth:`FleetDir.scan` lists the directory (names only; one ``stat`` of the directory
  while nothing was added or removed: its mtime changes whenever an entry is);
* each new entry's ship is read once from its meta, without opening the log
  (:func:`who_of`: 16 bytes of ``meta.bin``, for a pier its newest epoch's; an LMDB
  store's META database is opened read-only);
* an entry is shown as its ship's @p; as its directory name when its meta is unreadable,
  when the name it would get is already taken (a ship in two directories: the first by
  directory name keeps the @p) or when the directory name is itself not a plain name.

Each ship keeps a small integer *ship id* while it is in the directory: the FUSE layer
builds inode numbers from it (``fs/fleet/inodes.py``).  A ship that is removed and comes
back (or a name that now shows another directory) gets a new id, so no inode of the old
log, which the kernel may still cache, is ever one of the new log's.  Ids are given in
name order at the first scan, so they are the same across remounts while the directory
holds the same names.  Memory: one :class:`Ship` (a few hundred bytes) per entry seen.

Hidden entries (a leading dot) and plain files are not ships and are skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bookfs.formats.layout import LMDB_DATA_NAME, LOG_NAME, META_FIELDS, META_NAME, PIER_LOG_DIR

#: The file (not listed) at the root of a fleet mount that tells tools it is one
#: (``bookfs info``, ``format("bookfs")``); it holds a summary of the fleet daemon's state.
FLEET_MARKER = ".bookfs-fleet"
#: The ``fsname=`` prefix of a fleet mount (mountinfo's source column: ``bookfs-fleet:DIR``).
FLEET_FSNAME_PREFIX = "bookfs-fleet:"


@dataclass
class Ship:
    """One entry of the fleet directory: ``entry`` (its directory name), ``path``,
    ``name`` (what the mount shows: the @p, else ``entry``), ``sid`` (the ship id),
    ``ino`` (the directory's inode: a directory renamed into its place is another
    ship, whatever its name; the old one, which the fleet still holds open while it is
    in use, keeps its number, so the two are never the same inode at once)."""

    entry: str
    path: str
    name: str
    sid: int
    who: int | None = None
    ino: int = 0


def who_of(path: str) -> int | None:
    """The ship number in the meta of the log at ``path`` (a pier, a Book directory or an
    LMDB epoch), read without opening the log; None when there is none to read."""
    try:
        log_dir = os.path.join(path, PIER_LOG_DIR)
        if os.path.isdir(log_dir):
            from bookfs.formats.epochs import list_epochs

            names, kinds = list_epochs(log_dir)
            path = os.path.join(log_dir, names[-1][1])
            if kinds[-1] == "lmdb":
                return _lmdb_who(path) or _lmdb_who(log_dir)
        if os.path.exists(os.path.join(path, LOG_NAME)):
            off, size = META_FIELDS["who"]
            fd = os.open(os.path.join(path, META_NAME), os.O_RDONLY | os.O_NOFOLLOW
                         | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                raw = os.pread(fd, size, off)
            finally:
                os.close(fd)
            return int.from_bytes(raw, "little") if len(raw) == size else None
        if os.path.exists(os.path.join(path, LMDB_DATA_NAME)):
            return _lmdb_who(path)
    except Exception:  # unreadable, damaged, not a log: the directory name is shown
        return None
    return None


def _lmdb_who(directory: str) -> int | None:
    from bookfs.formats.lmdb_log import read_meta_db

    try:
        meta = read_meta_db(directory)
    except Exception:
        return None
    return None if meta is None else int.from_bytes(meta["who"], "little")


class FleetDir:
    """The ships of the fleet directory ``directory``, as last scanned."""

    #: ship ids go up to this (exclusive): the inode layout's ship field (fs/fleet/inodes.py)
    MAX_SHIPS = (1 << 22) - 1

    def __init__(self, directory: str):
        self.directory = directory
        self.ships: dict[str, Ship] = {}  # shown name -> ship, as of the last scan
        self._known: dict[str, Ship] = {}  # entry -> ship, every entry ever seen
        self._ids: dict[str, int] = {}  # shown name -> ship id (kept while mounted)
        self._mtime: int | None = None
        self._last_sid = 0
        self.scans = 0  # how many scans changed something (tests, info)

    def _sid(self, name: str) -> int:
        sid = self._ids.get(name)
        if sid is None:
            if self._last_sid + 1 >= self.MAX_SHIPS:
                raise OverflowError(f"{self.directory}: more than {self.MAX_SHIPS} ships "
                                    "came and went under one fleet mount; remount it")
            self._last_sid += 1
            sid = self._ids[name] = self._last_sid
        return sid

    def scan(self, force: bool = False) -> bool:
        """Look at the directory again; True if the ships changed.  One ``stat`` while
        its mtime is the same as at the last scan (unless ``force``)."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError:
            mtime = -1
        if mtime == self._mtime and not force:
            return False
        self._mtime = mtime
        try:
            entries = sorted((e for e in os.scandir(self.directory)
                              if not e.name.startswith(".") and e.is_dir()),
                             key=lambda e: e.name)
        except OSError:
            entries = []
        ships: dict[str, Ship] = {}
        for e in entries:
            old = self._known.get(e.name)
            if old is not None and old.ino != e.inode():
                old = None  # another directory under the same name: another ship
            who = old.who if old is not None else who_of(e.path)
            name = e.name
            if who is not None:
                from bookfs.noun import patp

                name = patp(who)
            if name in ships or not _plain(name):
                name = e.name
            if name in ships:
                continue  # an entry named like another's @p: the @p wins
            ship = Ship(e.name, e.path, name, self._sid(name), who, e.inode())
            self._known[e.name] = ship
            ships[name] = ship
        changed = ships.keys() != self.ships.keys() or any(
            _place(ships[n]) != _place(self.ships[n]) for n in ships)
        for name, old_ship in self.ships.items():
            if name not in ships or _place(ships[name]) != _place(old_ship):
                # gone (or now another directory): a ship shown under this name later is
                # another log, so it gets another id, and none of its inodes can be one
                # the kernel still holds of this one
                self._ids.pop(name, None)
                if name in ships:
                    ships[name].sid = self._sid(name)
        self.ships = ships
        if changed:
            self.scans += 1
        return changed

    def forget_entry(self, entry: str) -> None:
        """Read ``entry``'s meta again at the next scan (it may have been replaced)."""
        self._known.pop(entry, None)
        self._mtime = None


def _place(ship: Ship) -> tuple[str, int]:
    """Where a ship is: its path and its directory's inode."""
    return ship.path, ship.ino


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name
