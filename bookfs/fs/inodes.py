"""Inode numbers (FUSE node IDs, also reported as ``st_ino``).

The u64 inode space is split by its top bit:

* **events** take the upper half: ``events/<N>`` is ``2^63 | N`` (``2^63 + N`` for every
  ``N < 2^63``).  The inode depends on the event number alone, so it is stable across
  remounts, and it is the same under ``events/`` and ``epochs/0iB/events/``.  Two event
  numbers share an inode only if they differ by exactly 2^63, and no log can hold both:
  every deed takes at least 8 bytes, so a log spans fewer than 2^61 events.
  :func:`inode_event` recovers ``N`` from the inode and the log's first event.
* **everything else** lives below 2^63, in ranges that cannot meet::

    1 /            2 events/      3 meta/       4 new/        5 info      6 segments/
    7 epochs/ (piers)            8 pretty/
    16..           meta/<key>
    2^36 + 4k      epochs/<k-th>/   2^36 + 4k + 1  its events/   2^36 + 4k + 2  its info
    2^40 + k       segments/<k>     (k < 2^47: more segments than any log can have)
    2^48 + h       new/<N> while handle h is open (h < 2^62 - 2^48; handles start at
                   a random point below 2^40 per mount, ops.py)
    2^62 + (N mod 2^62)   pretty/<N>: as for events, two numbers share an inode only if
                   they differ by a multiple of 2^62, and no log spans 2^61 events

``tests/test_inodes.py`` proves the partition with a property test over u64 event numbers.
"""

from __future__ import annotations

from typing import Final

import pyfuse3

from ..layout import META_KEYS
from ..types import EventNum

InodeT = pyfuse3.InodeT

ROOT: Final = InodeT(pyfuse3.ROOT_INODE)
EVENTS: Final = InodeT(2)
META: Final = InodeT(3)
NEW: Final = InodeT(4)
INFO: Final = InodeT(5)
SEGMENTS: Final = InodeT(6)
EPOCHS: Final = InodeT(7)
PRETTY: Final = InodeT(8)

META_BASE: Final = 16
META_INODES: Final = {key: InodeT(META_BASE + i) for i, key in enumerate(META_KEYS)}
META_BY_INODE: Final = {ino: key for key, ino in META_INODES.items()}

EPOCH_BASE: Final = 1 << 36
EPOCH_DIR, EPOCH_EVENTS, EPOCH_INFO = 0, 1, 2  # kinds of inode inside an epoch
SEGMENT_BASE: Final = 1 << 40
STAGING_BASE: Final = 1 << 48
PRETTY_BASE: Final = 1 << 62
_PRETTY_LOW: Final = PRETTY_BASE - 1
EVENT_BIT: Final = 1 << 63
_LOW: Final = EVENT_BIT - 1
U64_MAX: Final = (1 << 64) - 1

#: event-file names are zero-padded to this many digits so they sort in event order
NAME_DIGITS: Final = 12


def event_inode(event: int) -> InodeT:
    """The inode of ``events/<event>`` (any u64 event number)."""
    return InodeT(EVENT_BIT | event)


def is_event(inode: int) -> bool:
    return inode >= EVENT_BIT


def inode_event(inode: int, first: int) -> EventNum:
    """The event number of an event inode, for a log whose first event is ``first`` (or
    ``0`` for an empty log): the one number within 2^63 after ``first`` that maps there."""
    return EventNum(first + (((inode & _LOW) - first) & _LOW))


def epoch_inode(k: int, kind: int) -> InodeT:
    return InodeT(EPOCH_BASE + 4 * k + kind)


def is_epoch(inode: int) -> bool:
    return EPOCH_BASE <= inode < SEGMENT_BASE


def inode_epoch(inode: int) -> tuple[int, int]:
    """``(k, kind)`` of an epoch inode."""
    return divmod(inode - EPOCH_BASE, 4)


def segment_inode(k: int) -> InodeT:
    return InodeT(SEGMENT_BASE + k)


def is_segment(inode: int) -> bool:
    return SEGMENT_BASE <= inode < STAGING_BASE


def staging_inode(handle: int) -> InodeT:
    return InodeT(STAGING_BASE + handle)


def is_staging(inode: int) -> bool:
    return STAGING_BASE <= inode < PRETTY_BASE


def pretty_inode(event: int) -> InodeT:
    """The inode of ``pretty/<event>`` (any u64 event number)."""
    return InodeT(PRETTY_BASE | (event & _PRETTY_LOW))


def is_pretty(inode: int) -> bool:
    return PRETTY_BASE <= inode < EVENT_BIT


def inode_pretty(inode: int, first: int) -> EventNum:
    """The event number of a ``pretty/`` inode, for a log whose first event is ``first``
    (as :func:`inode_event`)."""
    return EventNum(first + (((inode & _PRETTY_LOW) - first) & _PRETTY_LOW))


def event_name(event: int) -> bytes:
    return b"%0*d" % (NAME_DIGITS, event)


def parse_number(name: bytes) -> int | None:
    """The event number a name denotes (``000000000042`` or ``42``), or None for a name
    that is not a decimal u64."""
    if not name or len(name) > 20 or not name.isdigit():
        return None
    n = int(name)
    return n if n <= U64_MAX else None
