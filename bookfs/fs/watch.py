"""Watching the log: a read-only mount picks up what the writer commits, and one read
stream never mixes two generations of the log.

Read-only mounts follow the writer: :meth:`LogWatch.loop` checks the log every second
(every 50 ms while a lookup under ``follow/`` waits for an event, ``tail.py``, which
every change seen here wakes), and handlers look again (:meth:`LogWatch.look`) when
asked for an event, a segment or a directory the mount has not seen yet.  When the log
grew, the kernel is told to drop the attributes that changed (``CHANGING``: the root,
``events/``, the directories of the epochs that grew and the info files:
:meth:`LogWatch.changing_inodes`; a writer's append is not slowed by that notification:
its directories may show the old size and mtime for up to 1 s).
When it shrank or was replaced (the log's ``generation`` changed) every cache is
dropped, the kernel's too, and handles opened before answer ESTALE.

One read stream, one generation (issue 19, item 1): the slots that tell a file of the
log's old generation from the new one's are ``generations.py``'s; what is here moves them
on when the log changes, and drops every name of the old generation from the kernel's
dentry cache, so a new lookup answers a new node ID (the kernel then drops its dentry:
``fs/fuse/dir.c``, ``fuse_dentry_revalidate()``).  Bytes read straight from the log file
(a large event, a segment, a small event not cached yet) are served only if the log is
still the same generation after the ``pread`` (:meth:`LogWatch.read_then_recheck`): a
writer's recovery cuts and rewrites the file in place before the follower notices.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os

import trio

from bookfs.errors import refuse
from bookfs.fs import inodes as I
from bookfs.fs.state import MountState
from bookfs.fs.tail import WAITING_EVERY

log = logging.getLogger(__name__)

LOOK_EVERY = 1.0  # seconds between a read-only mount's checks of the log
#: seconds a read-only mount's follower lets pass after one look before it looks again for
#: inotify's next report, unless a lookup waits under ``follow/``: a writer committing
#: thousands of times a second is followed at most this often, not once per commit
#: (issue 34, item 4: the read-write mount's companion followed each of its commits)
LOOK_BURST = 0.02
#: the same for a read-write mount's companion (``-o companion``): the read-write daemon
#: drops the companion connection's attributes at every commit itself
#: (``ops._committed``), so its looks serve only what no request asks for, and each one
#: woke a process on the CPUs the writers and the read-write daemon share (issue 34,
#: item 4: one writer appended 4 % more a second, with 6 % less CPU an append, once the
#: companion looked every 0.25 s: docs/benchmarks.md)
COMPANION_LOOK_BURST = 0.25


def _drain(fd: int) -> None:
    """Empty the (non-blocking) inotify descriptor ``fd`` without decoding what it read:
    a wake needs only to know that something changed.  (``inotify_simple``'s ``read``
    makes a Python object of each event and decodes its name; a companion's 0.25 s of
    commits queue hundreds of them, two a commit: the log and the commit mark.)"""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except BlockingIOError:
            return


class LogWatch:
    """A read-only mount following its log's writer: it looks at the log again, moves the
    mount's :class:`~bookfs.fs.generations.Generations` on when the log was replaced or
    recovered, and drops the kernel's caches that the change made wrong."""

    def __init__(self, fs: MountState):
        self.fs = fs
        self.log = fs.log
        self.generations = fs.generations  # the log's generation and the inodes' slots
        self.known = fs.log.gulf()  # the range the kernel may have cached
        self._syncing = False  # a worker is making the log's new bytes durable
        self.watching = False  # inotify wakes the loop (watch()); else it polls
        self.looked = trio.Event()  # set by the loop after each look (watch() waits for it)
        #: the least time between two looks of the loop while no lookup waits under
        #: ``follow/``: ``COMPANION_LOOK_BURST`` for a companion (``mount.py``)
        self.look_burst = LOOK_BURST

    # --- following the writer ------------------------------------------------------------

    def look(self, *, inline_sync: bool = True) -> None:
        """On a read-only mount, pick up events another process committed; if the log
        shrank or was replaced under us, drop every cache (ours and the kernel's).

        What is committed (``formats/mark.py``, docs/reliability.md): what a live bookfs
        writer's mark says; with none (vere writes the log, or nobody), what the format
        commits once this reader has made it durable with its own ``fdatasync``.  A
        handler that must answer now (a lookup of an event not seen yet) syncs here
        (``inline_sync``: about 40 us when the writer has synced already); the periodic
        look does it in a worker thread (:meth:`_sync_then_look`) and looks again."""
        fs = self.fs
        if not fs.readonly:
            return
        if not fs.source_here():  # a fleet's ship whose directory was replaced
            raise refuse(errno.ESTALE, f"{fs.mountpoint}: the ship's directory was "
                                       "replaced by another; look its name up again")
        book = self.log
        if hasattr(book, "inline_sync"):
            book.inline_sync = inline_sync
        grew_from = len(fs.epochs) - 1  # the newest epoch, and any a roll adds
        book.refresh()
        if getattr(book, "wants_sync", False) and not self._syncing:
            self.log.wants_sync = False
            self._syncing = True
            trio.lowlevel.spawn_system_task(self._sync_then_look)
        gen = getattr(self.log, "generation", 0)
        gens = self.generations
        old = self.known
        self.known = self.log.gulf()
        if self.known != old or gen != gens.generation:
            fs.tail.published()  # lookups under follow/ look again (tail.py)
        if gen == gens.generation and self.known != old and fs.mountpoint:
            trio.lowlevel.spawn_system_task(self._drop_attrs, grew_from)  # it grew
        if gen != gens.generation:
            old_slot = gens.move_on(gen)
            if gens.slot is None:
                log.error("the log changed again while files of %d older generations are "
                          "still open: events, renderings and segments answer EIO until "
                          "they are closed", I.SLOTS - 1)
            fs.event_files.drop()
            fs.segment_files.checked.clear()
            fs.pretty_files.drop()
            log.warning("the log changed under the mount (it shrank or was replaced): "
                        "events %s..%s are reread from disk", old[0], old[1])
            segments, fs.segment_files.names = fs.segment_files.names, {}
            trio.lowlevel.spawn_system_task(self._invalidate_kernel, old, self.known,
                                            segments, old_slot)

    def resume(self, token: tuple, known: tuple[int, int], slot: int | None,
               slot_refs: list[int]) -> None:
        """A fleet's ship opened again (``fs/fleet/ops.py``): take over what the kernel may
        still hold of its last open (the slot in use and the lookups of each slot not
        forgotten yet); when its log is not the one ``token`` named then (replaced or
        rewritten while closed: the engine's ``continues()``; an engine that cannot
        say is taken as changed), move to another slot and drop the kernel's names and
        pages of every event it had, as a new generation does, so nothing cached of
        the old log is served."""
        gens = self.generations
        gens.slot_refs = list(slot_refs)
        gens.slot = slot
        try:
            if self.log.continues(token):
                return
        except Exception:  # cannot tell: take it as another log
            pass
        old_slot = gens.move_on()
        log.warning("%s: the log changed while it was closed (replaced or rewritten): "
                    "events %s..%s are read from disk again", self.fs.mountpoint, *known)
        trio.lowlevel.spawn_system_task(self._invalidate_kernel, known, self.known, {},
                                        old_slot)

    async def _sync_then_look(self) -> None:
        """The log grew and no live commit mark speaks for it (no bookfs writer: vere,
        or none): make the new bytes durable (``fdatasync`` of this reader's own
        descriptor, in a worker thread: a disk may be slow, and the loop serves on
        meanwhile), then look again, which publishes what the sync covered."""
        try:
            await trio.to_thread.run_sync(self.log.make_durable)
        except Exception:  # never let a system task kill the mount
            log.exception("making the log's new bytes durable failed; trying again later")
        finally:
            self._syncing = False
        try:
            self.look(inline_sync=False)
        except Exception:
            log.exception("following the log failed; trying again")

    def read_then_recheck(self, inode: int | None, what: str, read, *args) -> bytes:
        """``read(*args)``: bytes straight from the log file, served only if the log is
        still the generation of ``inode`` (or of the handle's ``generation``, when
        ``inode`` is None) *after* they were read.  A writer's recovery rewrites the file
        in place (cut, then appended again), which the follower notices only at its
        next check: without this look after the ``pread``, a stream could get the old
        event's first bytes and the new one's rest.  A rename leaves the old file open
        until that check, so the bytes read before it are the old generation's."""
        gens = self.generations
        generation = gens.generation
        data = read(*args)
        self.look()  # one fstat, one stat and two small preads while nothing changed
        if gens.generation != generation or (inode is not None and gens.stale(inode)):
            raise refuse(errno.ESTALE, f"{what}: the log was recovered or replaced while "
                                       "it was read; open it again")
        return data

    async def loop(self) -> None:
        """Run by the daemon of a read-only mount: look at the log whenever the kernel
        says one of its files changed (:meth:`watch`: a writer's commit mark, the log, a
        rename over it, a roll), at once when a wait under ``follow/`` begins
        (``tail.py``), and every ``LOOK_EVERY`` seconds besides, so a change inotify
        does not report (a network filesystem) is noticed too; without inotify, every
        ``WAITING_EVERY`` seconds while a lookup waits.

        Bursts are taken together: a change reported within ``look_burst`` of the last
        look is looked at when that time is up (every change reported meanwhile with it),
        unless a lookup waits under ``follow/``.  Nothing a reader asks for waits for
        this loop: a lookup of an event not seen yet, and a ``stat`` of a directory, look
        at the log themselves (:meth:`look`); what the loop adds is the kernel's
        attributes dropped (``_drop_attrs``) and ``follow/`` woken, so a directory's
        cached size may lag a commit by ``look_burst`` more at most (a companion's never
        does: the read-write daemon drops them at each commit)."""
        tail = self.fs.tail
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.watch)
            last_look = -self.look_burst
            while True:
                if tail.waiting and not self.watching:
                    await trio.sleep(WAITING_EVERY)
                else:
                    tail.arrived = trio.Event()
                    with trio.move_on_after(LOOK_EVERY):
                        await tail.arrived.wait()
                    with trio.move_on_at(last_look + self.look_burst):  # a burst: wait out
                        while not tail.waiting:  # its interval, unless a wait begins
                            tail.arrived = trio.Event()
                            await tail.arrived.wait()
                last_look = trio.current_time()
                try:
                    self.look(inline_sync=False)
                except Exception:
                    log.exception("following the log failed; trying again")
                finally:
                    self.looked.set()

    async def watch(self) -> None:
        """Wake the loop whenever the kernel reports a change to a file the log names
        (``watch_paths()`` of the engine: the log file, its directory, the commit mark
        and its directory; a pier's ``.urb/log``): one ``inotify`` descriptor, read
        when the kernel says it is readable, so a commit reaches waiting readers in
        well under a millisecond more than the writer's own publish.  After a wake it
        waits for the loop's look before it reads again, so a burst of commits costs one
        read and one look per ``look_burst`` (the kernel queues, and merges, what it
        reports meanwhile).  The watches are placed again by path after every wake, so a
        file renamed over the log, or a new epoch, is watched from then on (a watch
        follows an inode).  Without inotify (the limit of watches reached, say) the loop
        polls instead."""
        try:
            from inotify_simple import INotify, flags
        except ImportError:  # pragma: no cover - a dependency
            return
        paths = getattr(self.log, "watch_paths", None)
        if paths is None:
            return
        file_mask = (flags.MODIFY | flags.ATTRIB | flags.CLOSE_WRITE | flags.MOVE_SELF
                     | flags.DELETE_SELF)
        dir_mask = flags.CREATE | flags.MOVED_TO | flags.MOVED_FROM | flags.DELETE
        try:
            ino = INotify(nonblocking=True)
        except OSError as e:
            log.info("no inotify (%s): following the log by polling", e)
            return
        try:
            while True:
                placed = 0
                for path, is_dir in paths():
                    try:
                        ino.add_watch(path, dir_mask if is_dir else file_mask)
                        placed += 1
                    except OSError:  # not there (yet): its directory's watch says when
                        pass
                self.watching = placed > 0
                await trio.lowlevel.wait_readable(ino.fileno())
                _drain(ino.fileno())  # one wake for every change so far
                looked = self.looked = trio.Event()
                self.fs.tail.arrived.set()
                await looked.wait()
        finally:
            self.watching = False
            ino.close()

    # --- the kernel's caches -------------------------------------------------------------

    def changing_inodes(self, since: int = 0, mtimes: bool = True) -> list[int]:
        """Inodes whose attributes a change of the log's events changes and the kernel
        caches (the directories for ``CHANGING``, the info files for ``GROWING``):
        ``events/`` and ``info``, and ``events/`` and ``info`` of each epoch from number
        ``since`` on, the epochs whose events may have changed (an older epoch no longer
        changes: only the newest grows, ``Pier.refresh``; a commit appends to the newest,
        ``Pier.save``); with ``mtimes``, also the directories whose mtime alone changed
        (every directory's is the newest event's): the root and those epochs'
        directories.  Where they are left out, their mtime may lag by up to
        ``CHANGING``.  So the notices of a commit (``ops.py``, ``_committed``: four)
        and of a follower's look that saw growth do not grow with the epochs a pier has;
        a log replaced under the mount drops every one (``since`` 0)."""
        inos = [I.ROOT, I.EVENTS, I.INFO] if mtimes else [I.EVENTS, I.INFO]
        kinds = ((I.EPOCH_DIR,) if mtimes else ()) + (I.EPOCH_EVENTS, I.EPOCH_INFO)
        for k in range(max(since, 0), len(self.fs.epochs)):
            inos += [I.epoch_inode(k, kind) for kind in kinds]
        return inos

    def drop_attrs_now(self, inodes: list[int]) -> None:
        """Make the kernel forget the attributes of ``inodes`` (attributes only: no page
        is dropped, so nothing waits for a read in flight; safe from a handler)."""
        for ino in inodes:
            with contextlib.suppress(OSError):  # ENOENT: the kernel holds nothing of it
                self.fs.invalidate_inode(ino, attr_only=True)

    async def _drop_attrs(self, since: int = 0) -> None:
        """Make the kernel forget the attributes the log's growth changed, in the epochs
        from number ``since`` on (:meth:`changing_inodes`; a worker thread, as every
        notification: see ``_invalidate_kernel``)."""
        try:
            await trio.to_thread.run_sync(self.drop_attrs_now,
                                          self.changing_inodes(since))
        except Exception:  # never let a system task kill the mount
            log.exception("invalidating the kernel's cached attributes failed")

    async def _invalidate_kernel(self, old: tuple[int, int], new: tuple[int, int],
                                 segments: dict[tuple[int, bool], bytes],
                                 slot: int | None) -> None:
        """Make the kernel forget what it cached of events ``old`` and of ``segments``
        (index -> name), looked up in generation ``slot`` (a worker thread: dropping
        pages waits for reads in flight, which this loop must keep serving)."""
        try:
            await trio.to_thread.run_sync(self._invalidate_sync, old, new, segments, slot)
        except Exception:  # never let a system task kill the mount
            log.exception("invalidating the kernel's caches failed")

    def _invalidate_sync(self, old: tuple[int, int], new: tuple[int, int],
                         segments: dict[tuple[int, bool], bytes], slot: int | None
                         ) -> None:
        """Every name of the old generation is dropped from the kernel's dentry cache,
        gone or not: its next lookup answers the new slot's inode, and the dentry's
        inode, no longer held, is evicted and forgotten (``slot_refs``).  Names other
        than the two canonical ones are never cached (``LogOperations.lookup``)."""
        slot = 0 if slot is None else slot
        for (k, sizes), name in segments.items():  # a segment's bytes may have changed
            with contextlib.suppress(OSError):
                self.fs.invalidate_inode(I.segment_inode(k, slot, sizes))
            with contextlib.suppress(OSError):
                self.fs.invalidate_entry(I.SEGMENTS, name)
        first, last = old
        if not last:
            return
        self.drop_attrs_now(self.changing_inodes())
        parents = [I.EVENTS, I.PRETTY] + [I.epoch_inode(k, I.EPOCH_EVENTS)
                                          for k in range(len(self.fs.epochs))]
        for event in range(first, last + 1):  # names first: new opens find the new log
            for name in (I.event_name(event), str(event).encode()):
                for parent in parents:
                    with contextlib.suppress(OSError):  # ENOENT: nothing cached
                        self.fs.invalidate_entry(parent, name)
        for event in range(first, last + 1):  # then the old inodes' pages and attributes
            with contextlib.suppress(OSError):
                self.fs.invalidate_inode(I.event_inode(event, slot))
            if self.fs.no_open:  # renderings were cached by inode too
                with contextlib.suppress(OSError):
                    self.fs.invalidate_inode(I.pretty_inode(event, slot))
