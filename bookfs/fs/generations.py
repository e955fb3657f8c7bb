"""The log's generations as a mount knows them, and the generation slots of its inodes
(issue 19, item 1): one read stream never mixes two generations of the log.

Without opens there is no handle to carry a generation, so the inodes do: ``events/N``,
``pretty/N`` and ``segments/K`` carry the *slot* of the generation they were looked up in
(``inodes.py``).  A new generation (the log replaced, or recovered in place: the
follower sees it, ``watch.py``) takes another slot, so a new lookup answers a new node
ID, while a file opened before reads on by its old node ID and is answered ESTALE
(:meth:`Generations.current`).  A slot is taken again only when the kernel has forgotten
all its inodes: lookups and readdirplus entries are counted (``fs/fuse/inode.c``,
``fuse_iget()``; ``fs/fuse/readdir.c``, ``fuse_direntplus_link()``) and FORGETs
subtracted (:meth:`Generations.forget`).
"""

from __future__ import annotations

import errno
import logging

from bookfs.errors import refuse
from bookfs.fs import inodes as I

log = logging.getLogger(__name__)


class Generations:
    """The log's generation as the mount knows it, the slot its new lookups get, and how
    many lookups of each slot's inodes the kernel has not forgotten yet."""

    def __init__(self, generation: int = 0):
        self.generation = generation
        # the generation slot of events/, pretty/ and segments/ inodes (inodes.py), None
        # while no slot is free; and how many lookups of each slot's inodes the kernel
        # has not forgotten yet (a slot is taken again only at 0)
        self.slot: int | None = 0
        self.slot_refs = [0] * I.SLOTS

    def move_on(self, generation: int | None = None) -> int | None:
        """The log is another one now (``generation``, or, with None, the same number
        for a log that changed while a fleet's ship was closed): new lookups take
        another free slot (None while none is free).  Returns the old slot, whose names
        the caller drops from the kernel."""
        if generation is not None:
            self.generation = generation
        old, self.slot = self.slot, self._free_slot(self.slot)
        return old


    def slot_now(self) -> int:
        """The slot new lookups of events, renderings and segments get.  While none is
        free (the kernel still holds inodes of every other slot: files of older
        generations held open) those lookups answer EIO, until one is forgotten."""
        if self.slot is None:
            self.slot = self._free_slot(None)
            if self.slot is None:
                raise refuse(errno.EIO, "files of the log's older generations are still "
                                        "open (the log was replaced or recovered "
                                        f"{I.SLOTS} times while they were held); close "
                                        "them to read the new log")
            log.info("generation slot %d taken", self.slot)
        return self.slot

    def _free_slot(self, old: int | None) -> int | None:
        """A slot other than ``old`` whose inodes the kernel has all forgotten."""
        start = 0 if old is None else old + 1
        for k in range(I.SLOTS):
            s = (start + k) % I.SLOTS
            if s != old and not self.slot_refs[s]:
                return s
        return None

    def entry(self, attrs):
        """Count an entry handed to the kernel (a lookup or a readdirplus entry: the
        kernel's ``nlookup`` grows by one, ``fs/fuse/inode.c``, ``fuse_iget()``)."""
        slot = I.slot_of(attrs.st_ino)
        if slot is not None and slot < I.SLOTS:
            self.slot_refs[slot] += 1
        return attrs

    def stale(self, inode: int) -> bool:
        """Whether ``inode`` names a file of an older generation of the log."""
        slot = I.slot_of(inode)
        return slot is not None and slot != self.slot

    def current(self, inode: int, what: str) -> None:
        """ESTALE for a file of an older generation: it was looked up before the log
        was replaced or recovered, and its bytes are not the new log's."""
        if self.stale(inode):
            raise refuse(errno.ESTALE, f"{what}: the log was recovered or replaced since "
                                       "this file was looked up; open it again")

    def forget(self, inode_list) -> None:
        """FORGET: the kernel dropped ``nlookup`` references to each inode."""
        for inode, nlookup in inode_list:
            slot = I.slot_of(inode)
            if slot is not None and slot < I.SLOTS:
                self.slot_refs[slot] = max(0, self.slot_refs[slot] - nlookup)
