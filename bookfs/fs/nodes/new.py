"""``new/<N>``: appends.  Creating ``new/<N>``, writing it and closing it appends event
``N`` to the log.

Caching: ``new/<N>`` entries are never cached and a lookup answers ENOENT, so every
``open(O_CREAT)`` reaches ``create``; ``new/`` lists as empty (``dirs.py``).  While it is
written, a file's inode is ``2^48`` plus its handle (``inodes.py``), its attributes are
cached for ``CHANGING`` and its entry not at all.  Writes are ``direct_io``, so the
kernel keeps none of their pages.

After its commit, a name stays for :data:`COMMITTED_FOR` seconds, to its writer's process
only, as its committed event (:class:`Recent`; issue 33, item 3): a lookup finds it
(never cached), read-only with the log's mode, readable; setting its mode, owner, times
or extended attributes by name succeeds and keeps nothing, and a write or truncate is
refused (EEXIST, EPERM), as a create of a taken number is.  ``install``, ``rsync
--inplace`` (and ``-a``, ``-X``) and ``shutil.copy2`` set those by name after their
close, and failed with ENOENT for an event they had committed.

Every byte of an event is written by its writer (issue 33, item 2): the staging buffer
keeps the ranges written (``staging.Written``), and a file with a hole (a ``pwrite`` or
``lseek`` past the end, a gap between writes, an ``ftruncate`` up) is refused at its last
close, checked or not: EINVAL, nothing saved, the first hole's offsets in the refusal
(:func:`~bookfs.fs.append.check.hole_refusal`).  A writer that scatters more than ``staging.MAX_RANGES`` separate
pieces at once gets EINVAL at that write, and the file is poisoned.

Durability: ``new/<N>`` commits on the writer's **last** close of the open file, told
from the others by what the kernel sends with each FLUSH and WRITE (the commit rule:
``rule.py`` and docs/reliability.md): the close of a ``dup``, a forked child's exit or
an ``exec``'s copy commits nothing, and a writer killed by a signal commits nothing.
Where the rule cannot tell, the append fails (EIO) with nothing committed.  A close that
returns 0 has its event saved and ``fdatasync``'d, in order, by the ordered group-commit
queue (``fs/append/commit_queue.py``); ``fsync`` adds nothing.  A write that fails poisons the file: its
last close fails with that errno and nothing is saved.  A file whose last descriptor is
closed by a process other than its writer is abandoned, nothing saved.  The rule needs
the patched pyfuse3 (``request_owner``); on stock pyfuse3 ``new/`` and ``meta/`` writes
are refused (EROFS) with a line that says so (:func:`need_rule`).

Payloads are checked (issue 21; :class:`~bookfs.fs.append.check.PayloadStream`): a ``new/<N>`` file must hold a
4-byte mug and a jam that cues completely and exactly, or vere's ram encoding, whatever
the mug (Arvo's after the event: only a replay checks it;
:class:`~bookfs.noun.payload.PayloadCheck`).  The check is fed
as the written prefix grows (a write at the end of what was fed so far; a write
elsewhere waits for the close), on the event loop for small writes and, from the first
large one on, in order on the ``bookfs-check`` worker thread, so the writer's last close
costs about the end of the scan.  A payload that is not one is refused at that close:
EINVAL, nothing saved, the reason (with the byte where parsing failed) in the refusal
record and the log.  ``-o unchecked_payloads`` turns the check off for the mount
(:attr:`NewFiles.checked`); the extended attribute ``user.bookfs.unchecked`` set to ``1``
on an open ``new/<N>`` file (``setxattr``, as ``bookfs append --unchecked`` does) turns it
off for that file.  It is the only extended attribute a ``new/`` file has: setting
another is accepted and not kept (like its mode and times), reading another answers
ENOSYS (as every other node answers, so the kernel stops asking).

Errors follow DESIGN.md's table (``CommitQueue.reserve``: EINVAL for a name that is not
the next number, EEXIST for one the log holds, ETIMEDOUT for a stalled predecessor); a
create on a read-only mount is EROFS, elsewhere than ``new/`` EROFS (``events/``) or
EPERM.  Refused appends are recorded and shown in ``info`` (a shell ignores close()'s
errno).
"""

from __future__ import annotations

import errno
import logging
import re
import stat
import time
from collections import OrderedDict
from typing import NamedTuple

import pyfuse3

from bookfs.errors import BookError, refuse
from bookfs.fs import inodes as I
from bookfs.fs.append import rule
from bookfs.fs.append.check import PayloadStream
from bookfs.fs.append.commit_queue import Reservation, WorkerThread
from bookfs.fs.append.rule import Writer
from bookfs.fs.nodes.base import CHANGING, Kind

log = logging.getLogger(__name__)



#: the extended attribute that turns the payload check off for one ``new/<N>`` file
UNCHECKED_XATTR = b"user.bookfs.unchecked"
#: seconds a ``new/<N>`` name answers lookups as its event once its writer's close
#: committed it (:class:`Committed`), and how many such names are kept at most
COMMITTED_FOR = 30.0
COMMITTED_KEPT = 256
#: a temporary name of rsync without ``--inplace`` (``.43.Xy12ab``), which renames it
RSYNC_TEMP = re.compile(rb"\.([0-9]+)\.[A-Za-z0-9]{6}")


# --- names of events this mount just committed ---------------------------------------------

class Committed(NamedTuple):
    """A ``new/<N>`` whose writer's close committed it: its event, the inode its file
    had (``2^48 + handle``; handles are never reused), until when (monotonic) the name
    answers lookups, and the writer's threads (the creating one and the closing one)."""

    number: int
    inode: int
    until: float
    threads: tuple[int, ...] = ()

    def by_writer(self, ctx) -> bool:
        """Whether the request ``ctx`` comes from the writer: the thread that created the
        file or the one that closed it, by the caller's thread id the kernel sends with
        every request (a handler reads no other process's ``/proc``: DESIGN.md).
        Without a caller (operations driven directly), True."""
        if ctx is None or not self.threads:
            return True
        return ctx.pid in self.threads


class Recent:
    """The names in ``new/`` whose event this mount committed in the last
    :data:`COMMITTED_FOR` seconds (at most :data:`COMMITTED_KEPT`), by name and by inode.

    A copying tool sets the mode, owner or times of what it wrote **by name, after its
    close** (``install``'s ``fchmodat``/``fchownat``, ``rsync --inplace``'s ``stat`` and
    ``utimensat``): with ``new/<N>`` gone at once, those failed (ENOENT) and the tool
    reported failure for an event it had committed, which a retry would append twice.
    So for a while the name stays, for the writer's process only
    (:meth:`Committed.by_writer`), as its committed event: read-only (the log's mode),
    readable, its mode, owner and times set as no-ops, a write or truncate refused.
    Every other process finds no such name, as before: its create (a retry, ``bookfs
    append --at``) reaches ``create`` and is refused there (EEXIST), and recorded."""

    def __init__(self):
        self._by_name: OrderedDict[bytes, Committed] = OrderedDict()
        self._by_inode: dict[int, bytes] = {}

    def add(self, name: bytes, number: int, inode: int, threads: tuple[int, ...] = ()
            ) -> None:
        self._prune()
        old = self._by_name.pop(name, None)
        if old is not None:
            self._by_inode.pop(old.inode, None)
        self._by_name[name] = Committed(number, inode, time.monotonic() + COMMITTED_FOR,
                                        threads)
        self._by_inode[inode] = name
        while len(self._by_name) > COMMITTED_KEPT:
            _, c = self._by_name.popitem(last=False)
            self._by_inode.pop(c.inode, None)

    def _prune(self) -> None:
        now = time.monotonic()
        while self._by_name:
            name, c = next(iter(self._by_name.items()))
            if c.until > now:
                break
            del self._by_name[name]
            self._by_inode.pop(c.inode, None)

    def named(self, name: bytes) -> Committed | None:
        self._prune()
        return self._by_name.get(name)

    def of_inode(self, inode: int) -> tuple[bytes, Committed] | None:
        """``(name, committed)`` for a committed file's inode (until its time is up)."""
        self._prune()
        name = self._by_inode.get(inode)
        return None if name is None else (name, self._by_name[name])


# --- the commit rule, shared with meta/ ----------------------------------------------------

def need_rule(fs, path: str, ctx) -> None:
    """Refuse a write to ``new/`` or ``meta/`` that the commit rule could not judge:
    stock pyfuse3 does not say which process closes a file."""
    if not fs.request_owner and fs.mountpoint:
        raise fs.refusals.refuse(
            path, errno.EROFS, f"{path}: appends and meta writes need pyfuse3 built "
            "with bookfs's patch (bash mount_scripts/setup.sh); stock pyfuse3 does not "
            "say which process closes a file", ctx.pid)


class NewFiles(Kind):
    """``new/<N>`` files being written (a :class:`~bookfs.fs.append.commit_queue.Reservation` each)."""

    def __init__(self, fs):
        super().__init__(fs)
        #: payloads are checked (False: ``-o unchecked_payloads``, set by ``fs/daemon/mount.py``)
        self.checked = True
        self.checker = WorkerThread("bookfs-check")
        self.recent = Recent()  # names whose event this mount just committed

    async def lookup(self, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        """ENOENT, so that open(O_CREAT) reaches create; but to its writer's process, a
        name whose event this mount committed in the last :data:`COMMITTED_FOR` seconds
        is that event (:class:`Recent`), never cached (entry and attribute timeouts 0)."""
        c = self.recent.named(name)
        if c is None or not c.by_writer(ctx):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._committed_attrs(c)

    def _committed_attrs(self, c: Committed) -> pyfuse3.EntryAttributes:
        """``events/<N>``'s attributes (its mode, size and mtime) under the inode its
        ``new/`` file had."""
        a = self.fs.event_files.event_attrs(self.existing(c.number))
        a.st_ino = c.inode
        a.attr_timeout = a.entry_timeout = 0
        return a

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        fs = self.fs
        r = fs.handle(ino - I.STAGING_BASE)
        if isinstance(r, Reservation):
            return fs.entry_attrs(ino, stat.S_IFREG | fs.modes.staged, len(r.staging),
                                  time.time_ns(),
                                  CHANGING, entry_timeout=0)
        if (named := self.recent.of_inode(ino)) is not None:
            return self._committed_attrs(named[1])
        raise pyfuse3.FUSEError(errno.ENOENT)

    def _refuse_committed(self, name: bytes, c: Committed, what: str, ctx,
                          err: int) -> pyfuse3.FUSEError:
        """A write (``what``: ``written``, ``truncated to ...``) to a name just committed:
        refused, noted as ``create`` notes a taken number."""
        path = f"new/{name.decode()}"
        return self.fs.refusals.refuse(
            path, err, f"{path}: event {c.number} is already committed and cannot be "
            f"{what} (events are immutable); the next free number is "
            f"{self.fs.queue.next_free()}", None if ctx is None else ctx.pid)

    async def setattr(self, ino: int, attr, fields, fh, ctx) -> pyfuse3.EntryAttributes:
        """A file being written: a size is a truncate, the rest is ignored (an event has
        no mode, owner or times of its own).  A name just committed (:class:`Recent`):
        mode, owner and times are no-ops, so a tool that sets them by name after its
        close succeeds; a truncate is refused (EPERM)."""
        r = self.fs.handle(ino - I.STAGING_BASE)
        if not isinstance(r, Reservation):
            if (named := self.recent.of_inode(ino)) is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if fields.update_size:
                raise self._refuse_committed(*named, f"truncated to {attr.st_size:,} bytes",
                                             ctx, errno.EPERM)
            return self._committed_attrs(named[1])
        if fields.update_size:
            try:
                r.staging.truncate(attr.st_size)
            except (OSError, BookError) as e:
                r.poison(getattr(e, "errno", None) or errno.EIO)
                raise
            if r.payload is not None:
                r.payload.truncated(attr.st_size)
        return await self.attrs(ino)

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        """EBUSY for a file being written.  A name just committed (:class:`Recent`) opens
        for reading as its event; for writing it is refused as ``create`` would refuse
        the name (EEXIST)."""
        if (named := self.recent.of_inode(ino)) is None:
            raise refuse(errno.EBUSY, "an event being written cannot be opened again")
        name, c = named
        if writing:
            raise self._refuse_committed(name, c, "written", ctx, errno.EEXIST)
        fs = self.fs
        return await fs.event_files.open(
            I.event_inode(self.existing(c.number), fs.generations.slot_now()), flags, 0, ctx)

    async def create(self, parent_inode: int, name: bytes, ctx):
        """CREATE anywhere but ``meta/``: an append when ``parent_inode`` is ``new/``."""
        fs = self.fs
        if parent_inode == I.NEW and fs.readonly:  # an append: recorded
            path = f"new/{name.decode('utf-8', 'replace')}"
            raise fs.refusals.refuse(path, errno.EROFS, f"{path}: the mount is read-only",
                                     ctx.pid)
        if fs.readonly:
            raise refuse(errno.EROFS, "the mount is read-only")
        if parent_inode != I.NEW:
            where = {I.EVENTS: "events/", I.ROOT: "/"}.get(parent_inode, "")
            raise refuse(errno.EROFS if parent_inode == I.EVENTS else errno.EPERM,
                         f"cannot create {where}{name.decode('utf-8', 'replace')}: "
                         "append by creating new/<next event number>")
        if RSYNC_TEMP.fullmatch(name):  # nothing could be committed by its rename
            path = f"new/{name.decode()}"
            raise fs.refusals.refuse(
                path, errno.EINVAL, f"{path}: a temporary name (rsync without --inplace "
                "writes one, then renames it): new/ takes only event numbers, each "
                "committed by its writer's close; use rsync --inplace", ctx.pid)
        need_rule(fs, f"new/{name.decode('utf-8', 'replace')}", ctx)
        r = fs.queue.reserve(name, ctx.pid)
        fh = fs.new_fh(r)
        r.writer = Writer(ctx.pid)
        if self.checked:
            r.payload = PayloadStream(self.checker)
        attrs = await self.attrs(I.staging_inode(fh))
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), attrs

    async def write(self, h: Reservation, off: int, buf: bytes, ctx) -> int:
        if h.check is not None:
            await h.judged.wait()  # a close of its writer's table is being judged
        if h.state != "open":
            path = f"new/{h.name}"
            raise self.fs.refusals.refuse(path, errno.EBADF, f"{path}: write of {len(buf)} "
                                          f"bytes at {off} after the file was {h.state}; "
                                          "nothing of it is saved",
                                          None if ctx is None else ctx.pid)
        if ctx is not None:
            h.writer.saw(ctx)
        try:
            n = h.staging.write(off, buf)
        except (OSError, BookError) as e:
            h.poison(getattr(e, "errno", None) or errno.EIO, str(e))
            raise
        if h.payload is not None:
            await h.payload.wrote(off, buf)
        return n

    async def flush(self, h: Reservation, fh: int, ctx) -> None:
        """A close of ``new/<N>``: the append engine's commit rule judges it and, for
        the writer's last close, commits (:func:`bookfs.fs.append.rule.on_close`, which
        says what every outcome is); a committed name stays for its writer a while
        (:class:`Recent`)."""
        fs = self.fs
        if await rule.on_close(fs.queue, fs.prober, fs.mounts, h, I.staging_inode(fh), ctx,
                            mounted=bool(fs.mountpoint)):
            threads = () if ctx is None else (h.writer.thread, ctx.pid)
            self.recent.add(h.name.encode(), h.number, I.staging_inode(fh), threads)
            fs.event_files.seal_soon(h.number)  # a large one, while it is in memory

    # --- extended attributes: the per-file opt-out of the payload check ------------------

    async def setxattr(self, ino: int, name: bytes, value: bytes, ctx) -> None:
        """``user.bookfs.unchecked``: ``1`` turns the payload check off for this file,
        ``0`` on again (unless the mount is ``-o unchecked_payloads``).  Another name is
        accepted and not kept, like the file's mode, owner and times (an event has only
        its bytes), on a file being written or a name just committed (:class:`Recent`):
        ``cp --preserve=xattr`` sets them before its close and ``rsync -X --inplace``
        after it, and either would report failure for an event it committed."""
        r = self.fs.handle(ino - I.STAGING_BASE)
        if not isinstance(r, Reservation):
            if self.recent.of_inode(ino) is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            r = None  # a name just committed (Recent)
        if name != UNCHECKED_XATTR:
            log.debug("inode %d: extended attribute %r accepted and not kept", ino, name)
            return
        if r is None:
            raise refuse(errno.EBUSY, f"{UNCHECKED_XATTR.decode()} set after the file was "
                         "committed")
        if value not in (b"0", b"1"):
            raise refuse(errno.EINVAL, f"new/{r.name}: {UNCHECKED_XATTR.decode()} is 1 "
                         f"(do not check the payload) or 0, not {value[:20]!r}")
        if r.state != "open":
            raise refuse(errno.EBUSY, f"new/{r.name}: {UNCHECKED_XATTR.decode()} set "
                         f"after the file was {r.state}")
        if value == b"1":
            if r.payload is not None:
                log.info("new/%s: payload check turned off (%s, pid %s)", r.name,
                         UNCHECKED_XATTR.decode(), None if ctx is None else ctx.pid)
            r.payload = None
        elif r.payload is None and self.checked:
            r.payload = PayloadStream(self.checker)
            r.payload.stale = True  # nothing was fed: all of it is read at the close

    async def getxattr(self, ino: int, name: bytes, ctx) -> bytes:
        """``user.bookfs.unchecked``: ``1`` if this file's payload is not checked, else
        ``0``.  Another name answers ENOSYS, as every other node does (the kernel then
        stops asking, for the whole mount)."""
        if name != UNCHECKED_XATTR:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        r = self.fs.handle(ino - I.STAGING_BASE)
        if not isinstance(r, Reservation):
            if self.recent.of_inode(ino) is not None:  # committed: no such attribute
                raise pyfuse3.FUSEError(errno.ENODATA)
            raise pyfuse3.FUSEError(errno.ENOENT)
        return b"0" if r.payload is not None else b"1"

    def release(self, h: Reservation) -> None:
        try:
            if h.state in ("open", "ready"):
                # no close of the writer committed it (its last holder was a copy, or
                # the writer's last close came while a dup was open elsewhere): nobody
                # was told it was saved, so nothing is
                self.fs.queue.abandon(h, "its last descriptor was closed by a process "
                                         "other than its writer")
        finally:
            h.staging.close()
