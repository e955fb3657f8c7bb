"""``pretty/<N>``: each event rendered readable (``bookfs show``'s text, abbreviated).

Contract: ``pretty/<N>`` has the size of its rendering, made when the name is looked up
(so ``rsync``, ``cp`` and ``stat`` see the real size: a size of 0 made ``rsync`` copy
nothing, issue 23.4); it is served with ``direct_io`` on a mount that opens files, and
through the kernel's page cache up to that size on the no-open path (patched pyfuse3,
read-only mount).  ``pretty/`` lists as empty, so a whole-mount walk never looks a
rendering up, let alone makes one.  Entries and
attributes are cached for a day (``FOREVER``): a rendering of an event never changes in
one generation of the log, and its inode carries the generation slot (``inodes.py``),
as ``events/<N>``'s does.  ``pretty/`` lists as empty (``dirs.py``): an event is reached
by name.

One rendering per event and log generation, shared by every name and every open, kept
for the last ``PRETTY_KEPT`` events (bounded memory).  The payload is checked as for
``events/`` before it is rendered.  Errors: an event not in the log is ENOENT (ESTALE
when read by inode); any write is EROFS; a rendering of a log that was recovered or
replaced meanwhile is ESTALE.
"""

from __future__ import annotations

import collections
import errno
import stat

import pyfuse3
import trio

from bookfs.errors import refuse
from bookfs.fs import inodes as I
from bookfs.fs.nodes.base import FOREVER, BytesHandle, Kind, negative

PRETTY_KEPT = 64  # renderings of pretty/N kept for reads by inode (each at most ~64 KiB)


class PrettyFiles(Kind):
    """``pretty/<N>``."""

    def __init__(self, fs):
        super().__init__(fs)
        # (event, generation) -> its rendering; renderings under way (text())
        self.kept: collections.OrderedDict[tuple[int, int], bytes] = collections.OrderedDict()
        self.rendering: dict[tuple[int, int], trio.Event] = {}

    def drop(self) -> None:
        """Forget every rendering: the log changed under the mount."""
        self.kept.clear()

    def event_of(self, ino: int) -> int:
        return I.inode_pretty(ino, self.log.first)

    async def event_attrs(self, event: int) -> pyfuse3.EntryAttributes:
        """``pretty/<event>``, with the size of its rendering (made here, kept for the
        reads that follow)."""
        fs = self.fs
        slot = fs.generations.slot_now()  # before the rendering: its size is this generation's
        size = len(await self.text(event))
        return fs.entry_attrs(I.pretty_inode(event, slot), stat.S_IFREG | fs.modes.read, size,
                              self.log.mtime_ns(event), FOREVER)

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        event = self.existing(self.event_of(ino))
        return await self.event_attrs(event)

    async def lookup(self, name: bytes) -> pyfuse3.EntryAttributes:
        """``pretty/<name>``."""
        event = I.parse_number(name)
        if event is None:
            return negative()
        event = self.existing(event)
        return await self.event_attrs(event)

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        fs = self.fs
        event = self.event_of(ino)
        if writing:
            raise refuse(errno.EROFS, f"pretty/{event} is a read-only rendering")
        if event not in self.log:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return fs.file_info(fs.new_fh(BytesHandle(await self.text(event))),
                            direct_io=True, keep_cache=False)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        event = self.event_of(ino)
        self.fs.generations.current(ino, f"pretty/{event}")
        if event not in self.log:
            raise refuse(errno.ESTALE, f"pretty/{event}: no longer in the log")
        text = await self.text(event)
        self.fs.generations.current(ino, f"pretty/{event}")
        return text[off : off + size]

    # --- rendering -----------------------------------------------------------------------

    async def text(self, event: int) -> bytes:
        """The rendering of ``event``, made once per event and log generation: every name
        of it (``pretty/1``, ``pretty/01``) and every open or lookup while it is being
        rendered share one rendering (the others wait for it), kept for the last
        ``PRETTY_KEPT`` events (each at most ~64 KiB: bounded memory)."""
        key = (event, self.fs.generations.generation)
        while True:
            text = self.kept.get(key)
            if text is not None:
                self.kept.move_to_end(key)
                return text
            rendering = self.rendering.get(key)
            if rendering is None:
                break
            await rendering.wait()  # then it is kept, or it failed and is made again here
        done = self.rendering[key] = trio.Event()
        try:
            text = await self._render(event)
            if key[1] != self.fs.generations.generation:  # rendered from a log that is gone
                raise refuse(errno.ESTALE, f"pretty/{event}: the log was recovered or "
                                           "replaced while it was rendered")
            self.kept[key] = text
            while len(self.kept) > PRETTY_KEPT:
                self.kept.popitem(last=False)
        finally:
            del self.rendering[key]
            done.set()
        return text

    async def _render(self, event: int) -> bytes:
        """The rendering of ``event`` (``bookfs show``'s text, abbreviated: bounded size).
        The payload is checked first, as for ``events/``; a large one is then read in
        place by the renderer, a few blocks at a time, in a worker thread."""
        from bookfs.errors import MetaAbsent
        from bookfs.noun.event import event_text

        pread = self.fs.event_files.reader(event, await self.fs.event_files.check(event))
        size = self.log.payload_size(event)
        from bookfs.formats.nouncheck import bob_dir_for

        try:
            who = int.from_bytes(self.log.read_meta("who"), "little")
            life = int.from_bytes(self.log.read_meta("life"), "little")
        except MetaAbsent:
            who = life = None
        bob_dir = bob_dir_for(self.log.directory)
        text = await trio.to_thread.run_sync(
            lambda: "".join(event_text(event, size, pread, who=who, life=life,
                                       bob_dir=bob_dir)))
        return text.encode()
