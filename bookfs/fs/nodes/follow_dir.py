"""``follow/``: names that wait for an event to be committed (a live tail, issue 23.5).

* ``follow/<N>``: the lookup waits until event N is committed (:mod:`bookfs.fs.tail`),
  then answers **the inode of** ``events/<N>``: the same size, bytes, kernel cache and
  checks.  N already committed answers at once.  After ``follow_timeout`` seconds (mount
  option, default 10) the lookup answers **ETIMEDOUT**, which a shell loop tells apart
  from ENOENT (``cat: follow/7: Connection timed out``) and simply repeats.  A number
  below the log's first event (or at most its epoch base, for an empty log) can never
  come: ENOENT at once.  A name that is not a number and not ``next`` can never exist: a
  negative entry the kernel may cache.  The entries have entry timeout 0, so the kernel
  asks again on every path walk (``fs/fuse/dir.c``: an entry valid for 0 s gets the
  time 0 from ``fuse_time_to_jiffies()``, so ``fuse_dentry_revalidate()`` always sends
  a new LOOKUP); the attributes are the event's, cached as ``events/<N>``'s.
* ``follow/next``: a symlink.  Reading it (``readlink``, or any open through it) waits for
  the first event after the newest committed at the time of the READLINK and answers its
  name (``000000000008``), which resolves to ``follow/000000000008``, committed by then.
  It is a symlink because the kernel caches a name's node: were ``next`` itself the
  event's inode, its next revalidation would answer another node ID, which the kernel
  takes as "invalid" and looks the name up once more (``fuse_dentry_revalidate()``:
  ``outarg.nodeid != get_node_id(inode)`` goes to ``invalid``, then the VFS's
  ``lookup_slow()``), waiting for the event after that.  ``next``'s own node never
  changes (entry cached ``FOREVER``), and its target is asked for on every use: bookfs
  never asks the kernel to cache symlinks (``fs/fuse/dir.c``, ``fuse_get_link()`` reads
  through the page cache only with ``fc->cache_symlinks``, ``FUSE_CAP_CACHE_SYMLINKS``).

The wait is done in the lookup (and READLINK), never in a read: the kernel serves
buffered reads only up to the size it learned at lookup, and a read-only mount gets no
OPEN at all (``ops.py``).  ``follow/`` lists as empty (``dirs.py``), so ``find``, ``du``,
``tar`` and ``rsync`` over the mount never wait and never count an event twice; and
existence checks elsewhere never wait (``events/<N>`` for a missing N is ENOENT at once).
"""

from __future__ import annotations

import errno
import stat

import pyfuse3

from bookfs.fs import inodes as I
from bookfs.fs.nodes.base import FOREVER, Kind, negative

NEXT = b"next"


class FollowFiles(Kind):
    """``follow/<N>`` (looked up only: the inodes are ``events/<N>``'s) and
    ``follow/next`` (inode ``FOLLOW_NEXT``)."""

    def _next_attrs(self) -> pyfuse3.EntryAttributes:
        fs = self.fs
        # attributes not cached (GROWING, 0): the target's length is not known ahead
        return fs.entry_attrs(I.FOLLOW_NEXT, stat.S_IFLNK | 0o777, I.NAME_DIGITS,
                              fs.mounted_ns, 0.0, entry_timeout=FOREVER)

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        if ino == I.FOLLOW_NEXT:
            return self._next_attrs()
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def lookup(self, name: bytes, interrupted=None) -> pyfuse3.EntryAttributes:
        """``follow/<name>``: waits (module docstring); EINTR once ``interrupted`` (the
        request's event, set when the caller gets a signal) is set."""
        if name == NEXT:
            return self._next_attrs()
        event = I.parse_number(name)
        if event is None:
            return negative()
        fs = self.fs
        if event not in self.log:
            fs.watch.look()
            if event not in self.log and event < fs.tail.head():
                raise pyfuse3.FUSEError(errno.ENOENT)  # below the first event: never
            await fs.tail.wait_for(event, f"follow/{event}", interrupted)
        attrs = fs.event_files.event_attrs(event)
        attrs.entry_timeout = 0
        return attrs

    async def readlink(self, ino: int, interrupted=None) -> bytes:
        """``follow/next``'s target: the name of the first event committed after the
        newest one now (waits for it; ETIMEDOUT after ``follow_timeout``)."""
        if ino != I.FOLLOW_NEXT:
            raise pyfuse3.FUSEError(errno.EINVAL)  # not a symlink
        fs = self.fs
        fs.watch.look()
        event = fs.tail.head()
        await fs.tail.wait_for(event, "follow/next", interrupted)
        return I.event_name(event)
