"""Inode numbers of a fleet mount: each ship's own inode numbers (``inodes.py``, which
use the whole u64 space) mapped into one u64 space, with the ship's id
(``formats/fleet.py``, at most 2^22 - 1) in the bits a single log leaves unused.

======================================  ===============================================
fleet inode                             what
======================================  ===============================================
``1``                                   the fleet's root (``MNT/``)
``2``                                   ``MNT/.bookfs-fleet`` (not listed)
``sid * 2^40``                          ``MNT/<name>`` when the ship cannot be opened:
                                        the error file
``sid * 2^40 + l`` (``0 < l < 2^40``)   the ship's inode ``l``: its root (``l = 1``), its
                                        directories, ``info``, ``meta/*``, ``epochs/``
``2^63 + sid * 2^40 + N``               ``events/N`` of the ship, generation slot 0,
                                        ``N < 2^40``
``[2^62, 2^63)``                        anything else (other slots, ``pretty/N``,
                                        ``segments/K``, events past 2^40): numbered in
                                        the order first looked up, kept while the kernel
                                        holds the inode (lookups counted, FORGETs
                                        subtracted)
======================================  ===============================================

So the inodes a fleet mostly hands out (directories, meta, events) are computed, need no
table and are the same whenever the ship is opened again after an idle close, for as
long as the fleet is mounted: the kernel's cached inodes stay valid across a ship's
close and reopen.  ``st_ino`` across *remounts* of a fleet is stable for a ship whose id
is the same, i.e. while the fleet directory's names sort the same (ids are given in
name order at the first scan); only the table's numbers depend on the order of lookups.
Memory: nothing per computed inode; about 300 bytes per table inode the kernel holds.
"""

from __future__ import annotations

from typing import Final

from bookfs.fs import inodes as I

FLEET_ROOT: Final = 1
MARKER: Final = 2
SHIFT: Final = 40
_LOW: Final = (1 << SHIFT) - 1
TABLE_BASE: Final = 1 << 62
EVENT_BIT: Final = I.EVENT_BIT


def error_inode(sid: int) -> int:
    return sid << SHIFT


def ship_root(sid: int) -> int:
    return (sid << SHIFT) | I.ROOT


class InodeMap:
    """Fleet inode <-> ``(sid, local inode)`` (module docstring)."""

    def __init__(self):
        self._to_fleet: dict[tuple[int, int], int] = {}
        self._to_local: dict[int, tuple[int, int]] = {}
        self._refs: dict[int, int] = {}
        self._next = TABLE_BASE

    def fleet(self, sid: int, local: int, *, lookup: bool = False) -> int | None:
        """The fleet inode of ship ``sid``'s ``local`` inode.  A table inode is made
        (``lookup``: the kernel is handed it, so it is counted) or, without ``lookup``,
        None when it has none (nothing of it is cached)."""
        if 0 < local <= _LOW:
            return (sid << SHIFT) | local
        if local >= EVENT_BIT and (local - EVENT_BIT) <= _LOW:
            return EVENT_BIT | (sid << SHIFT) | (local - EVENT_BIT)
        key = (sid, local)
        ino = self._to_fleet.get(key)
        if ino is None:
            if not lookup:
                return None
            ino = self._next
            self._next += 1
            self._to_fleet[key] = ino
            self._to_local[ino] = key
        if lookup:
            self._refs[ino] = self._refs.get(ino, 0) + 1
        return ino

    def local(self, ino: int) -> tuple[int, int] | None:
        """``(sid, local inode)`` of a ship's fleet inode; ``(sid, 0)`` for its error
        file; None for the fleet's own inodes or a number never handed out."""
        if ino >= EVENT_BIT:
            rest = ino - EVENT_BIT
            return rest >> SHIFT, EVENT_BIT | (rest & _LOW)
        if ino >= TABLE_BASE:
            return self._to_local.get(ino)
        sid = ino >> SHIFT
        if not sid:
            return None
        return sid, ino & _LOW

    def forget(self, ino: int, nlookup: int) -> None:
        """FORGET of a table inode: dropped once the kernel holds it no more."""
        n = self._refs.get(ino)
        if n is None:
            return
        if n > nlookup:
            self._refs[ino] = n - nlookup
            return
        del self._refs[ino]
        key = self._to_local.pop(ino, None)
        if key is not None:
            self._to_fleet.pop(key, None)

    def __len__(self) -> int:
        return len(self._to_local)
