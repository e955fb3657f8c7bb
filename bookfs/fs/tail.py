"""The live tail: lookups that wait for an event to be committed (``follow/``, issue 23.5).

Contract.  :meth:`Tail.wait_for` returns once the event is committed as this mount sees
it, and raises ``FUSEError(ETIMEDOUT)`` after :attr:`Tail.timeout` seconds (the mount
option ``follow_timeout``), or ``FUSEError(ESHUTDOWN)`` when the mount is going away.
An event already committed answers at once, without any await.

What wakes a waiter.  A FUSE handler never waits on another process's state: the wait is
an ``await`` on a ``trio.Event`` that the code publishing newly committed events sets
(:meth:`Tail.published`): on a read-write mount the commit queue after each save
(``CommitQueue``'s ``on_commit``), on a read-only mount the follower whenever it sees
the log change (:meth:`bookfs.fs.watch.LogWatch.look`).  A read-only follower checks
the log every second; while a lookup waits it checks every ``WAITING_EVERY`` seconds
(one ``fstat`` each), and at once when a wait begins (:attr:`Tail.arrived`).

Many waiters.  A waiting lookup holds one of pyfuse3's worker tasks (a few KiB, no
thread).  ``mount.max_tasks()`` bounds the workers by what the kernel can have in flight,
so however many lookups wait, requests that let them finish (appends, reads) are
still served.

What the kernel does with a waiting caller.  A lookup sent to the daemon is not ended by
the caller's signals alone: the kernel queues a ``FUSE_INTERRUPT`` for the first one, then
waits (killable) and, once the request is in userspace, "waits it out" even for a fatal
signal (``fs/fuse/dev.c``, ``request_wait_answer()``: "Either request is already in
userspace, or it was forced.  Wait it out.").  libfuse's ``find_interrupted()``
(``lib/fuse_lowlevel.c``) calls the request's interrupt function when that
``FUSE_INTERRUPT`` arrives; the patched pyfuse3 (``interrupts``: ``mount_scripts/
pyfuse3-3.5.0-bookfs.patch``) registers one (``fuse_req_interrupt_func()``) for lookups and
readlinks that sets ``ctx.interrupted``, and the wait answers EINTR at once, so Ctrl-C on
``cat follow/7`` ends it at once.  On stock pyfuse3 nothing registers it, and a waiter
killed by Ctrl-C returns when its lookup is answered: when the event commits, at the
latest after ``follow_timeout``.  Either way nothing is left behind: the answer goes to a
request the kernel still holds.

Unmounting.  A process waiting in a lookup holds the mount busy, as any process inside
it does: ``umount`` answers EBUSY (``fs/namespace.c``, ``do_umount()``: EBUSY while
``propagate_mount_busy()`` finds references beyond the mount's own; the waiter's path
walk holds one), while ``MNT_DETACH`` detaches the mount at once (``umount_tree()``)
and the filesystem lives until its last reference goes.  SIGINT/SIGTERM to the daemon answer every waiter
ESHUTDOWN at once (:meth:`Tail.close`, called by ``mount._serve``), and so does a lazy
unmount (``bookfs umount -l``): :meth:`Tail.watch` sees, once a second while lookups
wait, that no mount shows this filesystem any more, so the daemon ends within a second.
"""

from __future__ import annotations

import errno
import logging

import pyfuse3
import trio

from bookfs.errors import refuse
from bookfs.fs.daemon.options import DEFAULT_FOLLOW_TIMEOUT as DEFAULT_TIMEOUT
from bookfs.fs.state import MountState
from bookfs.types import EventNum

log = logging.getLogger(__name__)

WAITING_EVERY = 0.05  # seconds between a read-only mount's checks while a lookup waits
WATCH_EVERY = 1.0  # seconds between checks that the mount still exists, while one waits


class Tail:
    """The lookups waiting for an event, and the event that wakes them."""

    def __init__(self, fs: MountState, timeout: float = DEFAULT_TIMEOUT):
        self.fs = fs
        self.timeout = timeout
        self.waiting = 0  # lookups waiting now
        self.changed = trio.Event()  # set (and replaced) when events were published
        self.arrived = trio.Event()  # set when a wait begins (the follower looks at once)
        self.closed: str | None = None  # why the mount is going away

    # --- publishing ----------------------------------------------------------------------

    def published(self) -> None:
        """New events are visible, or the log changed: every waiter looks again.  Cheap
        when none waits (called after every commit and every change a follower sees)."""
        if self.waiting:
            changed, self.changed = self.changed, trio.Event()
            changed.set()

    def close(self, why: str) -> None:
        """The mount is going away: every waiter, and every later wait, answers
        ESHUTDOWN."""
        self.closed = why
        self.changed.set()

    def head(self) -> EventNum:
        """The number the next event committed will have (as this mount sees the log)."""
        book = self.fs.log
        return EventNum(book.last + 1 if book.count else getattr(book, "epoch", 0) + 1)

    # --- waiting -------------------------------------------------------------------------

    async def wait_for(self, event: int, what: str,
                       interrupted: trio.Event | None = None) -> None:
        """Return once ``event`` is committed; ETIMEDOUT after :attr:`timeout` seconds,
        ESHUTDOWN if the mount goes away meanwhile, EINTR once ``interrupted`` is set (the
        kernel interrupted the request: its caller got a signal; module docstring)."""
        book = self.fs.log
        if event in book:
            return
        self.fs.watch.look()  # a read-only mount: has the writer just committed it?
        if event in book:
            return
        deadline = trio.current_time() + self.timeout
        self.waiting += 1
        self.arrived.set()
        try:
            while event not in book:
                if self.closed is not None:
                    raise refuse(errno.ESHUTDOWN, f"{what}: {self.closed}")
                if trio.current_time() >= deadline:
                    # not a refusal: a shell loop that waits for the next event gets
                    # this every follow_timeout seconds while the ship is idle
                    log.debug("%s: event %d not committed within %g s", what, event,
                              self.timeout)
                    raise pyfuse3.FUSEError(errno.ETIMEDOUT)
                if interrupted is not None and interrupted.is_set():
                    raise pyfuse3.FUSEError(errno.EINTR)  # Ctrl-C: the caller goes at once
                with trio.move_on_at(deadline):
                    await _first(self.changed, interrupted)
        finally:
            self.waiting -= 1

    async def watch(self) -> None:
        """Run by the daemon: once a second while a lookup waits, check that a mount
        still shows this filesystem (``/proc/self/mountinfo``, the daemon's own); after
        a lazy unmount none does, and the waiters answer ESHUTDOWN, so the detached
        filesystem is released and the daemon ends."""
        from bookfs.fs.daemon.mountinfo import mount_devices

        device = self.fs.mounts.device
        while True:
            await trio.sleep(WATCH_EVERY)
            if not self.waiting or not device or self.closed is not None:
                continue
            try:
                shown = device in mount_devices().values()
            except OSError:
                continue
            if not shown:
                log.info("the mount was detached while %d lookups of follow/ waited: "
                         "answering them ESHUTDOWN", self.waiting)
                self.close("the mount was detached (umount -l)")


async def _first(event: trio.Event, other: trio.Event | None) -> None:
    """Wait until ``event`` or ``other`` (if any) is set."""
    if other is None:
        await event.wait()
        return
    async with trio.open_nursery() as nursery:
        async def wait(e: trio.Event) -> None:
            await e.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, event)
        nursery.start_soon(wait, other)
