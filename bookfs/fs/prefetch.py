"""Whether a LOOKUP of a small event should start reading the event's bytes at once.

A cold read of a small event on a read-only mount is two requests: a LOOKUP, then a READ
(patched pyfuse3's no-open path).  The READ reads the deed from the log, from the disk
when the page cache does not hold it.  A hint at the LOOKUP (``EventLog.prefetch``:
``POSIX_FADV_WILLNEED``, which returns before the disk does) lets that disk read run
while the reply travels back and the reader's ``read`` travels in.

The kernel's LOOKUP does not say why it looks a name up (``stat`` or ``open``): the
request carries the name alone (``fs/fuse/dir.c``, ``fuse_lookup_init()``).  A hint for a
``stat`` is a disk read for nothing, and a walk that only stats a log of 10 million events
would read the whole log.  So :class:`LookupHints` learns from what follows a lookup: it
keeps the last :data:`WINDOW` small events looked up and not yet read, each READ of one
of them raises a score and each that leaves the window unread lowers it, and a lookup is
hinted while the score is positive.  A walk that only stats stops being hinted after
about ``WINDOW + LIMIT`` lookups; one that reads what it looks up is always hinted.

Memory: at most :data:`WINDOW` event numbers.  Touched only from the event loop.
"""

from __future__ import annotations

from collections import OrderedDict

WINDOW = 32  #: looked-up events remembered until they are read (or leave the window)
LIMIT = 4  #: the score stays within -LIMIT..LIMIT; it starts at LIMIT (hinted)


class LookupHints:
    """Which lookups of small events are worth a read-ahead hint (see the module)."""

    def __init__(self, window: int = WINDOW, limit: int = LIMIT):
        self.window, self.limit = window, limit
        self.score = limit
        self._unread: OrderedDict[int, None] = OrderedDict()

    def looked_up(self, event: int) -> bool:
        """``event`` (small, not held by the daemon) was looked up: whether to hint it."""
        if event in self._unread:
            self._unread.move_to_end(event)
        else:
            self._unread[event] = None
            if len(self._unread) > self.window:
                self._unread.popitem(last=False)  # looked up, never read: a stat
                self.score = max(self.score - 1, -self.limit)
        return self.score > 0

    def read(self, event: int) -> None:
        """``event``'s bytes were asked for (its first read since the daemon held it)."""
        if event in self._unread:
            del self._unread[event]
            self.score = min(self.score + 1, self.limit)
