"""The directories (``/``, ``events/``, ``meta/``, ``new/``, ``pretty/``, ``segments/``,
``epochs/`` and each epoch's), their listings, and the info files (``info``,
``epochs/*/info``).

Caching: the names of the fixed directories and files never change: entries cached for
a day (``FOREVER``).  The attributes of directories (``events/``'s size and mtime) change
on append and are cached for ``CHANGING`` (1 s); without attribute caching on
directories, ``default_permissions`` would cost a round trip per directory on every path
walk.  A read-only mount tells the kernel to drop them when it sees the log grow
(:mod:`bookfs.fs.watch`; a writer's append is not slowed by that notification: its
directories may show the old size and mtime for up to 1 s).  A read-write mount drops
them as each commit is answered, but the root's, whose mtime alone changes: dropped, they
cost every writer's next path walk a GETATTR (``ops.py``, ``_committed``).

The info files change as the log grows: attribute timeout ``GROWING`` (0), so every
``stat`` asks, and they are served with ``direct_io``, so their content is always
current.  On the no-open path (the kernel reads through its page cache) they report a
new mtime whenever their content changed (``changed_mtime``), so the kernel, which
rechecks their attributes before reading, drops its stale pages.

Listings: with patched pyfuse3 directories are opened with ``cache_readdir``, and keep
the kernel's listing while the log has not changed since the last opendir (``ls -l
events/`` costs OPENDIR and RELEASEDIR).  By default every listing is READDIRPLUS: each
entry with its attributes, for which the kernel builds an inode and a dentry
(``fs/fuse/readdir.c``, ``fuse_direntplus_link()``, ``fuse_iget()``), about 3 µs an
entry in the kernel, so no later ``stat`` costs a request.  With ``-o readdirplus=auto``
(patched pyfuse3's ``readdirplus_auto``) the kernel sends READDIRPLUS for a listing's
first batch and for any batch after which one of its entries was stat'ed or looked up,
plain READDIR otherwise (``fuse_use_readdirplus()``; ``fs/fuse/dir.c``,
``fuse_dentry_revalidate()`` and ``fuse_lookup()`` advise it): ``ls -l`` still gets
every entry's attributes with its name, ``find -type f`` gets names and types only (no
inode per entry: 5x faster), but a tool that lists the whole directory before its first
``stat`` (Hadoop's and so Spark's listing, ``tar``, ``cp -r``) then pays a LOOKUP per
entry (5x slower); docs/benchmarks.md has the figures.  ``events/`` lists every event
(its dates from the log's date column, ``fs/dates.py``; its sizes, which the kernel keeps
and cuts reads to, only from the chain of deeds proved through each batch, as a lookup's:
``EventFiles.confirmed``; each READDIRPLUS entry counted as a lookup,
:meth:`~bookfs.fs.generations.Generations.entry`, a READDIR entry not); ``new/``,
``pretty/`` and ``follow/`` list as empty (write-only; reached by name; a listing of
``follow/`` would make walks wait or count events twice).  Errors: a file opened as a
directory is ENOTDIR, a directory opened as a file EISDIR, an info file opened for
writing EACCES.
"""

from __future__ import annotations

import errno
import stat
import time
from array import array

import pyfuse3
import trio

from bookfs.errors import refuse
from bookfs.formats.info import NEXT_KEY, render, summary
from bookfs.fs import inodes as I

#: The ``payloads:`` line of a read-write mount's info: whether new/ checks what it saves.
PAYLOADS_CHECKED = ("checked: a 4-byte mug, then a jam that cues exactly or a ram "
                    "encoding (-o unchecked_payloads turns this off)")
PAYLOADS_UNCHECKED = "unchecked (-o unchecked_payloads): new/ saves any bytes"
from bookfs.fs.nodes.base import CHANGING, FOREVER, GROWING, BytesHandle, Kind

#: Dates read at a time by a listing: about what one READDIRPLUS reply holds (a reply
#: that fills early leaves the rest unread; a date past the column is decoded).
LISTED = 256
#: How far past the batch it lists a listing with attributes has the chain walked in the
#: background (``EventFiles.walk_soon``): a step of the walk (``framing._WALK_DEEDS``).
WALK_LEAD = 1 << 13

_ROOT_ENTRIES = [(b"events", I.EVENTS), (b"meta", I.META), (b"new", I.NEW), (b"info", I.INFO)]


def fixed_attrs(make, modes, ino: int, count: int, mtime_ns: int,
                info_size: int) -> pyfuse3.EntryAttributes:
    """The attributes of a fixed directory (the root's entries, the root) or of ``info``
    (``ino``), made by ``make`` (:func:`~bookfs.fs.nodes.base.make_attrs` with an owner)
    from the figures they show: the mount's ``modes``, the log's event ``count``
    (``events/``'s size), its newest event's mtime ``mtime_ns`` (of every one) and
    ``info_size``.  An open log's :class:`Directories` and a fleet's closed ship
    (``fs/fleet/ship.py``) both answer with this, so the kernel sees the same attributes
    whether the ship's log is open or not."""
    if ino == I.INFO:
        return make(ino, stat.S_IFREG | modes.read, info_size, mtime_ns, GROWING,
                    entry_timeout=FOREVER)
    mode = modes.new if ino == I.NEW else modes.dir
    return make(ino, stat.S_IFDIR | mode, count if ino == I.EVENTS else 0, mtime_ns,
                CHANGING, nlink=2, entry_timeout=FOREVER)


def readonly_info(summary: dict, fuse: str) -> bytes:
    """A read-only mount's ``info``: the log's ``summary`` (``formats/info.py``) and the
    request path the mount is on (``fuse``), exactly ``bookfs info``'s lines."""
    return render({**summary, "fuse": fuse}).encode()


class Directories(Kind):
    """The directories and the info files: the inodes below ``META_BASE`` and the
    epochs' (``inodes.py``)."""

    def __init__(self, fs):
        super().__init__(fs)
        self.root = list(_ROOT_ENTRIES)
        self.root.append((b"pretty", I.PRETTY))  # readable renderings (bookfs show)
        self.root.append((b"follow", I.FOLLOW))  # names that wait (nodes/follow_dir.py)
        if fs.segments is not None:
            self.root.append((b"segments", I.SEGMENTS))
        if fs.epochs:
            self.root.append((b"epochs", I.EPOCHS))
        self.root_names = dict(self.root)
        self._reply_run = getattr(pyfuse3, "readdir_reply_run", None)  # patched pyfuse3
        #: what ``ls MNT`` shows: not ``segments/`` and ``epochs/``, which hold the log's
        #: bytes and events a second time, so that whole-mount walks (``du``, ``tar``,
        #: ``rsync``, ``find -size``) count each byte once; both are opened by name
        #: (``ls MNT/segments``: the Spark readers list it so)
        self.root_listed = [(n, i) for n, i in self.root if i not in (I.SEGMENTS, I.EPOCHS)]
        #: the directories' inodes (the root's entries but info)
        self.inodes = {ino for _, ino in self.root if ino != I.INFO} | {I.ROOT}
        self.listed: dict[int, tuple] = {}  # directory inode -> log state at its opendir
        self.content_mtime: dict[int, tuple[bytes, int]] = {}  # inode -> (content, mtime)

    def epoch_named(self, name: bytes) -> int | None:
        """The index of the epoch called ``name`` (``0i300``); one a roll created since
        the last look is picked up here (the follower looks once more)."""
        for again in (False, True):
            if again:
                self.fs.watch.look()
            for k, e in enumerate(self.fs.epochs):
                if e.name.encode() == name:
                    return k
        return None

    def owns(self, ino: int) -> bool:
        return ino in self.inodes or ino == I.INFO or I.is_epoch(ino)

    # --- attributes ----------------------------------------------------------------------

    def _log_mtime(self) -> int:
        last = self.log.last
        return self.log.mtime_ns(last) if last else self.fs.mounted_ns

    def changed_mtime(self, ino: int, content: bytes, mtime_ns: int) -> int:
        """The mtime to report for a small file whose content changes (``info``): at least
        ``mtime_ns``, and later whenever ``content`` differs from what was last reported,
        so the kernel (which rechecks it before reading) drops its cached pages."""
        seen = self.content_mtime.get(ino)
        if seen is not None and seen[0] != content:
            mtime_ns = max(mtime_ns, time.time_ns(), seen[1] + 1)
        elif seen is not None:
            mtime_ns = max(mtime_ns, seen[1])
        self.content_mtime[ino] = (content, mtime_ns)
        return mtime_ns

    def _dir_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        return fixed_attrs(self.fs.entry_attrs, self.fs.modes, ino, self.log.count,
                           self._log_mtime(), 0)

    def _epoch_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        fs = self.fs
        k, kind = I.inode_epoch(ino)
        if k >= len(fs.epochs):
            raise pyfuse3.FUSEError(errno.ENOENT)
        if kind == I.EPOCH_INFO:
            data = self._epoch_info(k)
            return fs.entry_attrs(ino, stat.S_IFREG | fs.modes.read, len(data),
                                  self.changed_mtime(ino, data, self._log_mtime()), GROWING,
                                  entry_timeout=FOREVER)
        if kind in (I.EPOCH_DIR, I.EPOCH_EVENTS):
            size = fs.epochs[k].log.count if kind == I.EPOCH_EVENTS else 0
            return fs.entry_attrs(ino, stat.S_IFDIR | fs.modes.dir, size, self._log_mtime(),
                                  CHANGING, nlink=2, entry_timeout=FOREVER)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        fs = self.fs
        if I.is_epoch(ino):
            fs.watch.look()
            return self._epoch_attrs(ino)
        if ino in self.inodes:
            fs.watch.look()
            return self._dir_attrs(ino)
        if ino == I.INFO:
            fs.watch.look()
            data = await self.info_bytes()
            return fixed_attrs(fs.entry_attrs, fs.modes, ino, self.log.count,
                               self.changed_mtime(ino, data, self._log_mtime()), len(data))
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def lookup(self, parent_inode: int, name: bytes) -> pyfuse3.EntryAttributes:
        """A name in ``/``, ``epochs/`` or an epoch's directory."""
        fs = self.fs
        if parent_inode == I.EPOCHS:
            k = self.epoch_named(name)
            if k is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._epoch_attrs(I.epoch_inode(k, I.EPOCH_DIR))
        if I.is_epoch(parent_inode):
            k, kind = I.inode_epoch(parent_inode)
            if k >= len(fs.epochs):
                raise pyfuse3.FUSEError(errno.ENOENT)
            if kind == I.EPOCH_DIR:
                sub = {b"events": I.EPOCH_EVENTS, b"info": I.EPOCH_INFO}.get(name)
                if sub is None:
                    raise pyfuse3.FUSEError(errno.ENOENT)
                return self._epoch_attrs(I.epoch_inode(k, sub))
            event = I.parse_number(name)
            if event is None or event not in fs.epochs[k].log:
                fs.watch.look()
                if event is None or event not in fs.epochs[k].log:
                    raise pyfuse3.FUSEError(errno.ENOENT)
            await fs.event_files.confirmed(event)
            return fs.event_files.event_attrs(event)
        ino = self.root_names.get(name) if parent_inode == I.ROOT else None
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await fs.attrs_of(ino)

    # --- the info files ------------------------------------------------------------------

    async def info_bytes(self) -> bytes:
        """The info file: the log's summary; on a read-write mount ``next:``, the number
        the next ``new/<N>`` must have now, and ``payloads:``, whether ``new/`` checks a
        payload before it saves it; then the last refused appends and meta writes
        (a shell ignores close()'s errno, so this is where a user reads why).  A read-only
        mount refuses writes at open(), where the shell sees the error, so it has no
        record and its info is exactly ``bookfs info``'s."""
        fs, log = self.fs, self.log
        if log.chain_confirmed(log.last):
            info = summary(log)
        else:  # its dates may read the newest events by number: EventFiles.confirmed
            info = await trio.to_thread.run_sync(summary, log)
        if fs.readonly:
            return readonly_info(info, fs.fuse_path())
        info["fuse"] = fs.fuse_path()
        info[NEXT_KEY] = fs.queue.next_free()
        info["payloads"] = (PAYLOADS_CHECKED if fs.new_files.checked else PAYLOADS_UNCHECKED)
        info["reads"] = fs.reads_note  # fs/daemon/companion.py
        return (render(info) + fs.refusals.render()).encode()

    def _epoch_info(self, k: int) -> bytes:
        e = self.fs.epochs[k]
        first, last = e.log.gulf()
        return render({"epoch": e.name, "format": e.log.format, "base": e.base,
                       "first": first, "last": last, "events": e.log.count,
                       "bytes": e.log.log_bytes, "path": e.log.directory}).encode()

    async def open(self, ino: int, flags: int, writing: int, ctx) -> pyfuse3.FileInfo:
        fs = self.fs
        if I.is_epoch(ino):
            k, kind = I.inode_epoch(ino)
            if kind != I.EPOCH_INFO or k >= len(fs.epochs):
                raise pyfuse3.FUSEError(errno.EISDIR)
            if writing:
                raise refuse(errno.EACCES, "epochs/*/info is read-only")
            return fs.file_info(fs.new_fh(BytesHandle(self._epoch_info(k))),
                                direct_io=True, keep_cache=False)
        if ino == I.INFO:
            if writing:
                raise refuse(errno.EACCES, "info is read-only")
            fs.watch.look()
            return fs.file_info(fs.new_fh(BytesHandle(await self.info_bytes())),
                                direct_io=True, keep_cache=False)
        raise pyfuse3.FUSEError(errno.EISDIR if ino in self.inodes else errno.ENOENT)

    async def read_inode(self, ino: int, off: int, size: int) -> bytes:
        if ino == I.INFO:
            return (await self.info_bytes())[off : off + size]
        if I.is_epoch(ino):
            k, kind = I.inode_epoch(ino)
            if kind == I.EPOCH_INFO and k < len(self.fs.epochs):
                return self._epoch_info(k)[off : off + size]
        raise pyfuse3.FUSEError(errno.EISDIR if ino in self.inodes else errno.EBADF)

    # --- listings ------------------------------------------------------------------------

    async def opendir(self, inode: int):
        fs = self.fs
        is_dir = inode in self.inodes or (
            I.is_epoch(inode) and I.inode_epoch(inode)[1] != I.EPOCH_INFO)
        if not is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fs.watch.look()
        if not fs.cache_dirs:
            return inode
        # the kernel may keep its cached listing unless the log changed since the last
        # opendir of this directory (an append, a recovery, a replacement)
        state = (fs.generations.generation, self.log.gulf(), len(fs.epochs))
        unchanged = self.listed.get(inode) == state
        self.listed[inode] = state
        return pyfuse3.FileInfo(fh=inode, cache_readdir=True, keep_cache=unchanged)

    async def readdir(self, fh: int, start_id: int, token) -> None:
        fs = self.fs
        if fh == I.NEW:
            return  # write-only: lists as empty, so find, du, rsync and tar work
        if fh == I.EVENTS or (I.is_epoch(fh) and I.inode_epoch(fh)[1] == I.EPOCH_EVENTS):
            # cookie = position in the log + 1 (an off_t: event numbers may pass 2^63)
            log = self.log if fh == I.EVENTS else fs.epochs[I.inode_epoch(fh)[0]].log
            plus = getattr(token, "plus", True)  # False: READDIR, names and types only
            first, last = log.gulf()
            event = first + start_id
            while last and event <= last:
                stop = last
                if plus and not log.chain_confirmed(last):
                    # a size is served from the proved chain only (EventFiles.confirmed:
                    # a walk a step, in a worker thread), a listing as much as a lookup:
                    # the kernel keeps the sizes it is handed
                    stop = min(last, event + LISTED - 1)
                    if not log.chain_confirmed(stop):
                        await fs.event_files.confirmed(stop, ahead=False)
                        first, last = log.gulf()  # a lying index was rebuilt meanwhile
                        stop = min(stop, last)
                    if event > first:  # (not a listing's first batch, which is
                        # READDIRPLUS with readdirplus=auto too, before plain READDIRs)
                        fs.event_files.walk_soon(min(last, stop + WALK_LEAD))  # next step
                event, full = self._list_events(token, log, event, first, stop, plus)
                if full:
                    return
            return
        if fh in (I.PRETTY, I.FOLLOW):
            # lists as empty: pretty/N is reached by name.  A listing would make every
            # whole-mount walk (grep -r, tar, rsync, cp -r) render every event, and copy
            # size-0 entries as empty files.
            return
        if fh == I.SEGMENTS:  # cookie = segment index + 1
            for k in range(start_id, fs.segments.slots()):
                seg = await fs.segment_files.confirmed(k)  # named by the proved chain
                if seg is None:
                    continue
                attrs = fs.segment_files.seg_attrs(seg)
                if not fs.readdir_reply(token, I.event_name(seg.first), attrs, k + 1):
                    return
                if getattr(token, "plus", True):  # linked by the kernel: counted
                    fs.generations.entry(attrs)
            return
        entries = self._small_dir(fh)
        for i in range(start_id, len(entries)):  # cookie = position + 1
            name, ino = entries[i]
            if not fs.readdir_reply(token, name, await fs.attrs_of(ino), i + 1):
                return

    def _list_events(self, token, log, event: int, first: int, stop: int,
                     plus: bool) -> tuple[int, bool]:
        """List ``log``'s events ``event .. stop``; returns the next event to list and
        whether the reply is full."""
        fs = self.fs
        if self._run_ok(log):  # a batch per call (patched pyfuse3: readdir_run)
            event, full = self._list_runs(token, log, event, first, stop, plus)
            if full or event > stop:
                return event, full
        reply, name, inode = fs.readdir_reply, I.event_name, I.event_inode
        if not plus:
            a, slot = fs.event_files.plain_attrs, fs.generations.slot
            for event in range(event, stop + 1):
                a.st_ino = inode(event, slot)
                if not reply(token, name(event), a, event - first + 1):
                    return event, True
            return stop + 1, False
        # readdir_reply copies the attributes into the reply buffer, so one object is
        # reused and only the fields that differ are set
        a = fs.event_files.event_attrs(event)
        size_of, mtimes = log.payload_size, fs.event_files.dates.mtimes
        slot, refs = fs.generations.slot, fs.generations.slot_refs
        while event <= stop:  # the dates in batches: one pread each (fs/dates.py)
            for ns in mtimes(event, min(LISTED, stop - event + 1)):
                size = size_of(event)
                a.st_ino = inode(event, slot)
                a.st_size = size
                a.st_blocks = (size + 511) >> 9
                a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = ns
                if not reply(token, name(event), a, event - first + 1):
                    return event, True
                refs[slot] += 1  # an entry the kernel links (readdirplus): Generations.entry
                event += 1
        return event, False

    def _list_runs(self, token, log, event: int, first: int, last: int,
                   plus: bool) -> tuple[int, bool]:
        """List ``log``'s events from ``event`` a batch per call; returns the next event
        to list and whether the reply is full (not full and not past ``last``: the inode
        numbers wrap within the next batch, and the caller lists one by one)."""
        fs = self.fs
        a = fs.event_files.event_attrs(event) if plus else fs.event_files.plain_attrs
        while event <= last:
            n = min(LISTED, last - event + 1)
            if (event % I.EVENT_SPAN) + n > I.EVENT_SPAN:
                return event, False
            slot = fs.generations.slot
            # a READDIR entry carries no times: none are read (nor decoded)
            mtimes = fs.event_files.dates.mtimes(event, n) if plus else array("q", bytes(8 * n))
            done = self._reply_run(token, a, event, I.NAME_DIGITS, event - first + 1,
                                   I.event_inode(event, slot), log.payload_bounds(event, n),
                                   log.DEEDS.overhead, mtimes)
            if plus:
                fs.generations.slot_refs[slot] += done  # linked by the kernel: Generations.entry
            event += done
            if done < n:
                return event, True
        return event, False

    def _run_ok(self, log) -> bool:
        """Whether a listing of ``log``'s events may go a batch per call
        (``pyfuse3.readdir_reply_run``): the patched pyfuse3 has it, this mount hands the
        kernel its own inode numbers (a fleet maps them: ``fs/fleet/ops.py``), and the log's
        sizes come from an offset index."""
        return (self._reply_run is not None and self.fs.readdir_reply is pyfuse3.readdir_reply
                and hasattr(log, "payload_bounds"))

    def _small_dir(self, fh: int) -> list[tuple[bytes, int]]:
        """The fixed entries of /, meta/, epochs/ and an epoch's directory."""
        if fh == I.ROOT:
            return self.root_listed
        if fh == I.META:
            return [(k.encode(), ino) for k, ino in I.META_INODES.items()]
        if fh == I.EPOCHS:
            return [(e.name.encode(), I.epoch_inode(k, I.EPOCH_DIR))
                    for k, e in enumerate(self.fs.epochs)]
        k = I.inode_epoch(fh)[0]
        return [(b"events", I.epoch_inode(k, I.EPOCH_EVENTS)),
                (b"info", I.epoch_inode(k, I.EPOCH_INFO))]
