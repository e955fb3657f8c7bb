"""Inode numbers (FUSE node IDs, also reported as ``st_ino``).

The u64 inode space is split by its top bit:

* **events** take the upper half: ``events/<N>`` is ``2^63 | (s * E + N mod E)`` with
  ``E = floor(2^63 / 3)`` and ``s`` the mount's generation *slot* (0, 1 or 2; below).  In
  slot 0 that is ``2^63 + N`` for every ``N < E`` (more than 2^61), so the inode is stable
  across remounts, and it is the same under ``events/`` and ``epochs/0iB/events/``.  Two
  event numbers of one slot share an inode only if they differ by a multiple of ``E``, and
  no log can hold both: every deed takes at least 8 bytes, so a log spans fewer than 2^61
  events.  :func:`inode_event` recovers ``N`` from the inode and the log's first event.
* **everything else** lives below 2^63, in ranges that cannot meet::

    1 /            2 events/      3 meta/       4 new/        5 info      6 segments/
    7 epochs/ (piers)            8 pretty/     9 follow/     10 follow/next
    16..           meta/<key>
    2^36 + 4k      epochs/<k-th>/   2^36 + 4k + 1  its events/   2^36 + 4k + 2  its info
    2^40 + s*2^45 + k   segments/<k> in slot s (k < 2^44: a segment index is a byte offset
                   divided by the span, 16 MiB by default)
    2^40 + s*2^45 + 2^44 + k   segments/<first>.sizes, the sizes of segment k's events
    2^48 + h       new/<N> while handle h is open (h < 3*2^59 - 2^48; handles start at
                   a random point below 2^40 per mount, ops.py)
    3*2^59 + s*P + (N mod P)   pretty/<N> in slot s, P = floor((2^63 - 3*2^59) / 3) > 2^61:
                   as for events, two numbers share an inode only if they differ by a
                   multiple of P, and no log spans 2^61 events

**Generation slots** (issue 19, item 1).  The files whose bytes belong to one generation
of the log (``events/N``, ``pretty/N``, ``segments/K``: :func:`slot_of` is not None)
carry the slot of the generation they were looked up in.  When a follower sees the log
replaced or recovered, the mount moves to another slot, so a new lookup of the same name
gets a new node ID.  The kernel keeps a dentry whose lookup answers another node ID
invalid and looks the name up again (``fs/fuse/dir.c``, ``fuse_dentry_revalidate()``:
``outarg.nodeid != get_node_id(inode)`` goes to ``invalid``), and a file opened before
keeps reading by its old node ID, which the mount answers ESTALE: one read stream never
mixes two logs.  A slot is used again only once the kernel has forgotten every inode of
it (``ops.py`` counts lookups and FORGETs).

``tests/test_inodes.py`` proves the partition with a property test over u64 event numbers.
"""

from __future__ import annotations

from typing import Final

import pyfuse3

from bookfs.formats.layout import META_KEYS
from bookfs.types import EventNum

InodeT = pyfuse3.InodeT

ROOT: Final = InodeT(pyfuse3.ROOT_INODE)
EVENTS: Final = InodeT(2)
META: Final = InodeT(3)
NEW: Final = InodeT(4)
INFO: Final = InodeT(5)
SEGMENTS: Final = InodeT(6)
EPOCHS: Final = InodeT(7)
PRETTY: Final = InodeT(8)
FOLLOW: Final = InodeT(9)
FOLLOW_NEXT: Final = InodeT(10)

META_BASE: Final = 16
META_INODES: Final = {key: InodeT(META_BASE + i) for i, key in enumerate(META_KEYS)}
META_BY_INODE: Final = {ino: key for key, ino in META_INODES.items()}

EPOCH_BASE: Final = 1 << 36
EPOCH_DIR, EPOCH_EVENTS, EPOCH_INFO = 0, 1, 2  # kinds of inode inside an epoch
SEGMENT_BASE: Final = 1 << 40
STAGING_BASE: Final = 1 << 48
PRETTY_BASE: Final = 3 << 59
EVENT_BIT: Final = 1 << 63
_LOW: Final = EVENT_BIT - 1
U64_MAX: Final = (1 << 64) - 1

#: generation slots (module docstring): each generation-bound kind has this many
SLOTS: Final = 3
EVENT_SPAN: Final = EVENT_BIT // SLOTS  # event numbers per slot (> 2^61)
PRETTY_SPAN: Final = (EVENT_BIT - PRETTY_BASE) // SLOTS  # (> 2^61)
SEGMENT_SPAN: Final = 1 << 45  # segment indexes per slot
#: set in a segment inode's index: the segment's ``.sizes`` file (``nodes/segments.py``)
SIZES_BIT: Final = 1 << 44

#: event-file names are zero-padded to this many digits so they sort in event order
NAME_DIGITS: Final = 12


def event_inode(event: int, slot: int = 0) -> InodeT:
    """The inode of ``events/<event>`` (any u64 event number) in generation ``slot``."""
    return InodeT(EVENT_BIT | (slot * EVENT_SPAN + event % EVENT_SPAN))


def is_event(inode: int) -> bool:
    return inode >= EVENT_BIT


def inode_event(inode: int, first: int) -> EventNum:
    """The event number of an event inode (of any slot), for a log whose first event is
    ``first`` (or ``0`` for an empty log): the one number within ``EVENT_SPAN`` after
    ``first`` that maps there."""
    return EventNum(first + (((inode & _LOW) % EVENT_SPAN - first) % EVENT_SPAN))


def epoch_inode(k: int, kind: int) -> InodeT:
    return InodeT(EPOCH_BASE + 4 * k + kind)


def is_epoch(inode: int) -> bool:
    return EPOCH_BASE <= inode < SEGMENT_BASE


def inode_epoch(inode: int) -> tuple[int, int]:
    """``(k, kind)`` of an epoch inode."""
    return divmod(inode - EPOCH_BASE, 4)


def segment_inode(k: int, slot: int = 0, sizes: bool = False) -> InodeT:
    """The inode of segment ``k`` in ``slot``, or of its ``.sizes`` file."""
    return InodeT(SEGMENT_BASE + slot * SEGMENT_SPAN + (SIZES_BIT if sizes else 0) + k)


def inode_segment(inode: int) -> int:
    """The segment index of a segment inode, or of its ``.sizes`` file (of any slot)."""
    return (inode - SEGMENT_BASE) % SEGMENT_SPAN % SIZES_BIT


def is_sizes(inode: int) -> bool:
    """Whether a segment inode is its segment's ``.sizes`` file."""
    return (inode - SEGMENT_BASE) % SEGMENT_SPAN >= SIZES_BIT


def is_segment(inode: int) -> bool:
    return SEGMENT_BASE <= inode < STAGING_BASE


def staging_inode(handle: int) -> InodeT:
    return InodeT(STAGING_BASE + handle)


def is_staging(inode: int) -> bool:
    return STAGING_BASE <= inode < PRETTY_BASE


def pretty_inode(event: int, slot: int = 0) -> InodeT:
    """The inode of ``pretty/<event>`` (any u64 event number) in generation ``slot``."""
    return InodeT(PRETTY_BASE + slot * PRETTY_SPAN + event % PRETTY_SPAN)


def is_pretty(inode: int) -> bool:
    return PRETTY_BASE <= inode < EVENT_BIT


def inode_pretty(inode: int, first: int) -> EventNum:
    """The event number of a ``pretty/`` inode, for a log whose first event is ``first``
    (as :func:`inode_event`)."""
    return EventNum(first + (((inode - PRETTY_BASE) % PRETTY_SPAN - first) % PRETTY_SPAN))


def slot_of(inode: int) -> int | None:
    """The generation slot of an inode whose file belongs to one generation of the log
    (an event, a rendering, a segment), or None for any other inode.  A number no slot
    hands out (the few above the last slot) gives ``SLOTS``, which is never current."""
    if inode >= EVENT_BIT:
        return min((inode & _LOW) // EVENT_SPAN, SLOTS)
    if inode >= PRETTY_BASE:
        return min((inode - PRETTY_BASE) // PRETTY_SPAN, SLOTS)
    if SEGMENT_BASE <= inode < STAGING_BASE:
        return min((inode - SEGMENT_BASE) // SEGMENT_SPAN, SLOTS)
    return None


def event_name(event: int) -> bytes:
    return b"%0*d" % (NAME_DIGITS, event)


def parse_number(name: bytes) -> int | None:
    """The event number a name denotes (``000000000042`` or ``42``), or None for a name
    that is not a decimal u64."""
    if not name or len(name) > 20 or not name.isdigit():
        return None
    n = int(name)
    return n if n <= U64_MAX else None
