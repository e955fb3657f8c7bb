"""Inode numbers.  Fixed small numbers for the directories and files of the layout; an
event's inode is derived from its number (stable across remounts); files being written
into ``new/`` get inodes from a separate range.

    1 /            2 events/      3 meta/       4 new/        5 info      6 segments/
    7 epochs/ (piers)
    16.. meta/<key>                 2^32 + N      events/<N> (also epochs/0iB/events/<N>)
    2^36 + 4k      epochs/<k-th>/   2^36 + 4k + 1  its events/   2^36 + 4k + 2  its info
    2^40 + k   segments/<k>         2^48 + h      new/<N> while handle h is open
"""

from __future__ import annotations

from typing import Final

import pyfuse3

from ..layout import META_KEYS

InodeT = pyfuse3.InodeT

ROOT: Final = InodeT(pyfuse3.ROOT_INODE)
EVENTS: Final = InodeT(2)
META: Final = InodeT(3)
NEW: Final = InodeT(4)
INFO: Final = InodeT(5)
SEGMENTS: Final = InodeT(6)
EPOCHS: Final = InodeT(7)

META_BASE: Final = 16
META_INODES: Final = {key: InodeT(META_BASE + i) for i, key in enumerate(META_KEYS)}
META_BY_INODE: Final = {ino: key for key, ino in META_INODES.items()}

EVENT_BASE: Final = 1 << 32
EPOCH_BASE: Final = 1 << 36
EPOCH_DIR, EPOCH_EVENTS, EPOCH_INFO = 0, 1, 2  # kinds of inode inside an epoch
SEGMENT_BASE: Final = 1 << 40
STAGING_BASE: Final = 1 << 48

#: event-file names are zero-padded to this many digits so they sort in event order
NAME_DIGITS: Final = 12


def event_inode(event: int) -> InodeT:
    return InodeT(EVENT_BASE + event)


def is_event(inode: int) -> bool:
    return EVENT_BASE <= inode < EPOCH_BASE


def epoch_inode(k: int, kind: int) -> InodeT:
    return InodeT(EPOCH_BASE + 4 * k + kind)


def is_epoch(inode: int) -> bool:
    return EPOCH_BASE <= inode < SEGMENT_BASE


def inode_epoch(inode: int) -> tuple[int, int]:
    """``(k, kind)`` of an epoch inode."""
    return divmod(inode - EPOCH_BASE, 4)


def inode_event(inode: int) -> int:
    return inode - EVENT_BASE


def segment_inode(k: int) -> InodeT:
    return InodeT(SEGMENT_BASE + k)


def is_segment(inode: int) -> bool:
    return SEGMENT_BASE <= inode < STAGING_BASE


def staging_inode(handle: int) -> InodeT:
    return InodeT(STAGING_BASE + handle)


def is_staging(inode: int) -> bool:
    return inode >= STAGING_BASE


def event_name(event: int) -> bytes:
    return b"%0*d" % (NAME_DIGITS, event)


def parse_number(name: bytes) -> int | None:
    """The event number a name denotes (``000000000042`` or ``42``), or None."""
    if not name or len(name) > 20 or not name.isdigit():
        return None
    return int(name)
