"""``events/<N>``: the log's events, one immutable file each.

Caching: ``events/<N>`` files are immutable: entry and attribute timeouts of a day
(``FOREVER``), and the kernel page cache is kept across opens (``keep_cache``).
``st_ino`` is derived from the event number and the log's generation slot
(``inodes.py``), so it is stable across remounts; ``st_size`` is exact.  A name other
than the two canonical ones (``42``, ``000000000042``) is not cached (entry timeout 0:
``LogOperations.lookup``).  A name that is not a number can never exist: a negative
entry cached for a day (Hadoop's ``.<name>.crc``, say).

Checking: reading an event checks its CRC on ``open`` (streamed, in a worker thread, for
large events), so corrupt bytes are never served.  A large event's check also seals it
(:mod:`bookfs.formats.seals`: a CRC per 128 KiB block, kept beside the index), and every
read of it is then served after the blocks it covers pass their CRCs: a seal kept from an
earlier open makes a cold read check block by block from its first byte, with no whole
pass over the deed first, and a block that rotted since is refused.  A block that fails
gets the whole deed checked again, which tells a stale seal from damage (EIO).  Small
events (up to ``SMALL_EVENT``) are held once, checked, in the daemon's bounded
:class:`~bookfs.fs.cache.EventCache` shared by every handle (a lookup of one not held
starts its disk read at once, while lookups are followed by reads:
:mod:`bookfs.fs.prefetch`); large ones are served with ``pread`` per request, so memory
never holds a whole large event and never grows with the number of open handles.  On the
no-open path (patched pyfuse3, read-only mount) the check moves to the first read of an
event: a failed check answers EIO, and the kernel caches no byte that failed one (of a
sealed event, blocks that passed may have been served before a damaged one was found).

Errors: an event not in the log is ENOENT (ESTALE when read by inode: it was there when
looked up); any write is EROFS (events are immutable; append through ``new/``); a failed
check is EIO; a file of an older generation of the log, or a handle opened before the
log was recovered or replaced, is ESTALE (:mod:`bookfs.fs.watch`).
"""

from __future__ import annotations

import errno
import functools
import logging
import stat

import pyfuse3
import trio

from bookfs.errors import BookError, refuse
from bookfs.fs import inodes as I
from bookfs.fs.cache import EventCache
from bookfs.fs.dates import EventDates
from bookfs.fs.prefetch import LookupHints
from bookfs.fs.nodes.base import FOREVER, Kind, negative
from bookfs.formats.seals import SEALED_FROM, Seal, SealBroken

log = logging.getLogger(__name__)

SMALL_EVENT = 128 << 10  # events up to this size are read whole and cached
SEALS_HELD = 1024  # large events' checks held, the newest, and at most SEAL_BYTES of
SEAL_BYTES = 4 << 20  # their seals' block CRCs (32 B per MiB of event)


class EventHandle:
    """An open event: its number and the log generation it was opened in (the bytes
    live in the shared cache or on disk, never in the handle)."""

    __slots__ = ("event", "generation", "small")

    def __init__(self, event: int, generation: int, small: bool):
        self.event, self.generation, self.small = event, generation, small


class EventFiles(Kind):
    """``events/<N>`` (and ``epochs/*/events/<N>``, the same inodes)."""

    def __init__(self, fs):
        super().__init__(fs)
        self.cache = EventCache()
        self.hints = LookupHints()
        #: large events whose check passed, and their seals (None: checked whole)
        self.checked_large: dict[int, Seal | None] = {}
        self.dates = EventDates(self.log)  # each event's mtime: its own date (fs/dates.py)
        #: a plain READDIR entry's attributes: only its inode number and type are sent
        self.plain_attrs = pyfuse3.EntryAttributes()
        self.plain_attrs.st_mode = stat.S_IFREG | 0o444
        self._walking: trio.Event | None = None  # set when the chain walk under way ends

    def drop(self) -> None:
        """Forget every checked event: the log changed under the mount."""
        self.cache.clear()
        self.checked_large.clear()
        self.dates.drop()

    def event_of(self, ino: int) -> int:
        return I.inode_event(ino, self.log.first)

    def event_attrs(self, event: int) -> pyfuse3.EntryAttributes:
        fs = self.fs
        return fs.entry_attrs(I.event_inode(event, fs.generations.slot_now()),
                              stat.S_IFREG | fs.modes.read,
                              self.log.payload_size(event), self.dates.mtime_ns(event),
                              FOREVER)

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        event = self.existing(self.event_of(ino))
        await self.confirmed(event)
        return self.event_attrs(event)

    async def lookup(self, name: bytes) -> pyfuse3.EntryAttributes:
        """``events/<name>``."""
        event = I.parse_number(name)
        if event is None:  # can never exist (Hadoop's .<name>.crc, say): cache that
            return negative()
        event = self.existing(event)
        await self.confirmed(event)
        attrs = self.event_attrs(event)
        if (attrs.st_size <= SMALL_EVENT and event not in self.cache
                and self.hints.looked_up(event)):
            self.log.prefetch(event)  # its READ will most likely follow: start the disk
        return attrs

    # --- checking ------------------------------------------------------------------------

    async def confirmed(self, event: int, ahead: bool = True) -> None:
        """Before ``event``'s size or bytes are answered from the log's index: a persisted
        index is a hint until the chain of deeds from the header proves it, which its
        first read by number walks (``Book.confirm_to``: up to the whole log, once an
        open; the last event of a 10-million-event log: 1.0 s from the page cache, 4.5 s
        from the disk).  That walk runs in a worker thread, so the event loop answers
        every other request meanwhile, and goes a step further (``ahead``; a listing,
        which has the next step walked in the background, :meth:`walk_soon`, does not
        wait for it).  One walk at a time: a request that finds one under way waits for
        it, then walks on from where it ended if it must."""
        while not self.log.chain_confirmed(event):
            if self._walking is not None:
                await self._walking.wait()
            else:
                await self._walk(event, self._start_walk(), ahead)

    def walk_soon(self, event: int) -> None:
        """Start the walk through ``event`` in the background, unless the chain is proved
        that far or a walk is under way: a listing proves its next step while it lists
        this one, so its disk reads overlap the listing (``fs/nodes/dirs.py``)."""
        if self._walking is None and not self.log.chain_confirmed(event):
            trio.lowlevel.spawn_system_task(self._walk_quietly, event, self._start_walk())

    @property
    def walking(self) -> bool:
        """A chain walk is under way (its thread reads the log)."""
        return self._walking is not None

    def _start_walk(self) -> trio.Event:
        self._walking = trio.Event()
        return self._walking

    async def _walk(self, event: int, done: trio.Event, ahead: bool = True) -> None:
        try:
            await trio.to_thread.run_sync(self.log.confirm_to, event, ahead)
        finally:
            if self._walking is done:
                self._walking = None
            done.set()

    async def _walk_quietly(self, event: int, done: trio.Event) -> None:
        try:
            await self._walk(event, done)
        except Exception as e:  # a system task that raised would end the mount; a request
            # that needs this walk walks again, and answers its error
            log.info("events/%d: a chain walk ahead of a listing failed: %s", event, e)

    async def check(self, event: int) -> bytes | Seal | None:
        """Check ``event`` before any of its bytes are served: a small one is read whole,
        checked and kept in the shared cache (returned); a large one is checked in a
        worker thread, once per log generation while among the last ``SEALS_HELD``
        (``EventLog.seal``: a kept seal's two small reads, or a streamed pass), and its
        seal returned (None: checked whole, read it with ``read_slice``).  A failed check
        raises, which the handlers answer EIO."""
        await self.confirmed(event)
        if self.log.payload_size(event) <= SMALL_EVENT:
            return self.checked(event)
        if event in self.checked_large:
            return self.checked_large[event]
        return await self.sealed(event)

    async def sealed(self, event: int, *, fresh: bool = False) -> Seal | None:
        """``EventLog.seal`` of large ``event`` in a worker thread, held for later reads
        (a failed check holds nothing: the next read checks again, and fails again)."""
        held = self.checked_large
        held.pop(event, None)
        seal = await trio.to_thread.run_sync(functools.partial(self.log.seal, event,
                                                               fresh=fresh))
        size = sum(len(s.sums) for s in (*held.values(), seal) if s is not None) * 4
        while held and (len(held) >= SEALS_HELD or size > SEAL_BYTES):
            gone = held.pop(next(iter(held)))
            size -= 0 if gone is None else 4 * len(gone.sums)
        held[event] = seal
        return seal

    def checked(self, event: int) -> bytes:
        """The payload of small ``event``, checked, from the shared cache or the disk."""
        data = self.cache.get(event)
        if data is None:
            self.hints.read(event)
            # the format's check (CRC); kept only if the log is still this generation
            # once it was read (a recovery rewrites the file in place: read_then_recheck)
            data = self.fs.watch.read_then_recheck(None, f"events/{event}",
                                                      self.log.read, event)
            self.cache.put(event, data)
        return data

    # --- reading -------------------------------------------------------------------------

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        fs = self.fs
        event = self.event_of(ino)
        if writing:
            raise refuse(errno.EROFS, f"events/{event} is immutable; append through new/")
        if event not in self.log:
            raise pyfuse3.FUSEError(errno.ENOENT)
        generation = fs.generations.generation
        small = isinstance(await self.check(event), bytes)
        handle = EventHandle(event, generation, small)
        return fs.file_info(fs.new_fh(handle), keep_cache=True)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        """A read with no open behind it.  An event is checked on its first read (CRC;
        streamed, in a worker thread, for a large one): a failed check answers EIO, so
        the kernel caches none of its bytes."""
        watch = self.fs.watch
        event = self.event_of(ino)
        self.fs.generations.current(ino, f"events/{event}")
        if event not in self.log:
            watch.look()
            if event not in self.log:
                raise refuse(errno.ESTALE, f"events/{event}: no longer in the log")
        self.fs.generations.current(ino, f"events/{event}")
        got = await self.check(event)
        self.fs.generations.current(ino, f"events/{event}")
        if isinstance(got, bytes):
            return got[off : off + size]
        return await self.read_large(ino, event, got, off, size)

    async def read_handle(self, h: EventHandle, off: int, size: int) -> bytes:
        """A read through a handle ``open`` made."""
        if h.generation != self.fs.generations.generation:
            raise refuse(errno.ESTALE, f"events/{h.event}: the log was recovered or "
                                       "replaced since this file was opened; reopen it")
        if h.small:
            return self.checked(h.event)[off : off + size]
        held = self.checked_large  # its check, made at the open (again if it was let go)
        seal = held[h.event] if h.event in held else await self.check(h.event)
        return await self.read_large(None, h.event, seal, off, size)

    def seal_soon(self, event: int) -> None:
        """``event`` was just appended through this mount: if it is large enough to be
        sealed, seal it now in the background, while its bytes are still in the page
        cache, so that even its first read is checked block by block.  Never raises: a
        seal that fails leaves the event to be checked at its first read."""
        try:
            if self.log.payload_size(event) < SEALED_FROM:
                return
        except BookError:
            return
        trio.lowlevel.spawn_system_task(self._seal_quietly, event)

    async def _seal_quietly(self, event: int) -> None:
        try:
            await self.sealed(event)
        except Exception as e:  # (a system task that raised would end the mount)
            log.warning("events/%d: not sealed after its append: %s", event, e)

    def reader(self, event: int, got: bytes | Seal | None):
        """``pread(off, n)`` of ``event``'s payload, for a worker thread, from what
        :meth:`check` gave: the bytes, the seal (each block checked; a block that fails
        gets the whole deed checked again, there in the thread) or None (checked whole)."""
        if isinstance(got, bytes):
            return lambda off, n: got[off : off + n]
        if got is None:
            return functools.partial(self.log.read_slice, event)

        def sealed(off: int, n: int) -> bytes:
            nonlocal got
            try:
                return self.log.read_sealed(event, got, off, n)
            except SealBroken:
                got = self.log.seal(event, fresh=True)  # damage raises CorruptDeed
                return self.reader(event, got)(off, n)
        return sealed

    async def read_large(self, ino: int | None, event: int, seal: Seal | None, off: int,
                         size: int) -> bytes:
        """Bytes of large ``event``, checked: by its seal, block by block, or (no seal)
        by the whole check made before.  A block that fails its seal's CRC gets the whole
        deed checked again (a worker thread): damage answers EIO; a seal older than the
        deed is replaced, and the read served by the new one."""
        read = functools.partial(self.fs.watch.read_then_recheck, ino, f"events/{event}")
        if seal is None:
            return read(self.log.read_slice, event, off, size)
        try:
            return read(self.log.read_sealed, event, seal, off, size)
        except SealBroken:
            seal = await self.sealed(event, fresh=True)
            if seal is None:
                return read(self.log.read_slice, event, off, size)
            return read(self.log.read_sealed, event, seal, off, size)
