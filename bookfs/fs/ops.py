"""The pyfuse3 ``Operations`` that present a Book as the layout DESIGN.md fixes.

Caching contract
----------------
* ``events/<N>`` files are immutable: entry and attribute timeouts of a day, and the
  kernel page cache is kept across opens (``keep_cache``).  ``st_ino`` is derived from
  the event number and the log's generation slot (``inodes.py``), so it is stable across
  remounts; ``st_size`` is exact.  A name other than the two canonical ones (``42``,
  ``000000000042``) is not cached (entry timeout 0).
* The names of the fixed directories and files never change: entries cached for a day.
  The attributes of directories (``events/``'s size and mtime) and ``meta/*`` (mtime)
  change on append and are cached for ``CHANGING`` (1 s); without attribute caching on
  directories, ``default_permissions`` would cost a round trip per directory on every
  path walk.  A read-only mount tells the kernel to drop them when ``_follow`` sees the
  log grow (a writer's append is not slowed by that notification: its directories may
  show the old size and mtime for up to 1 s).
* Files whose size changes as the log grows (``info``, ``epochs/*/info``, the last,
  incomplete segment) have an attribute timeout of ``GROWING`` (0): every ``stat`` asks,
  so ``tail -f`` (which polls ``fstat``) sees the new size.  The kernel drops a file's
  cached pages when it sees its size change.  ``info`` is served with ``direct_io``, so
  its content is always current.  A segment handle opened while the segment was the last
  one reads up to the log's current end, not the end when it was opened.  A segment that
  is complete (the log grew past its byte range) never changes: cached for a day.
* Extended attributes are not supported (ENOSYS), which the kernel remembers, so ``ls -l``
  does not ask once per file.
* ``new/<N>`` entries are never cached, so every ``open(O_CREAT)`` reaches ``create``.

Errors follow DESIGN.md's table.  Every handler is guarded: a ``BookError`` becomes its
errno, an ``OSError`` its errno, anything else EIO plus a logged traceback, and the mount
stays up.  Every refusal is logged once, in one line that says what was expected.

Reading an event checks its CRC on ``open`` (streamed, in a worker thread, for large
events), so corrupt bytes are never served.  Small events (up to ``SMALL_EVENT``) are held
once, checked, in the daemon's bounded :class:`~.cache.EventCache` shared by every handle;
large ones are served with ``pread`` per request, so memory never holds a whole large
event and never grows with the number of open handles.

``new/<N>`` and ``meta/<key>`` commit on the writer's **last** close of the open file,
told from the others by what the kernel sends with each FLUSH and WRITE (the commit rule:
``closer.py`` and docs/reliability.md): the close of a ``dup``, a forked child's exit or
an ``exec``'s copy commits nothing, and a writer killed by a signal commits nothing.
Where the rule cannot tell, the append fails (EIO) with nothing committed.  A write that
fails poisons the file: its last close fails with that errno and nothing is saved.  The
rule needs the patched pyfuse3 (``request_owner``); on stock pyfuse3 ``new/`` and
``meta/`` writes are refused (EROFS) with a line that says so.

Permissions: the mount uses ``default_permissions``; owner, group and modes come from the
source log file (and its directory's search bits), so only users who could write the log
can append through ``new/`` or write ``meta/``, and only users who could read it can read.

Fewer requests (issue 12).  With pyfuse3 built with ``mount_scripts/pyfuse3-3.5.0-bookfs.patch``
(:data:`FEATURES`; ``info`` says which path a mount is on):

* a read-only mount answers OPEN with ENOSYS, so the kernel opens every file without
  asking and never sends RELEASE, and reads arrive by inode (``read_inode``).  The check
  an open made moves to the first read of an event: a failed check answers EIO, and the
  kernel caches no byte of that event.  A warm read of an event costs no request at all;
  a cold one LOOKUP and READ.  Files whose content changes (``info``, ``epochs/*/info``,
  ``meta/*``) report a new mtime whenever their content changed, so the kernel (which
  rechecks their attributes before reading, ``GROWING``) drops its stale pages;
  ``pretty/N`` reports its rendering's real size;
* every open that cannot write says ``noflush``, so its close sends no FLUSH;
* directories are opened with ``cache_readdir``, and keep the kernel's listing while the
  log has not changed since the last opendir (``ls -l events/`` costs OPENDIR and
  RELEASEDIR).

On stock pyfuse3 everything works as before: every open and close is a request.  FLUSH
on a read-only mount is answered ENOSYS either way (there is no ``new/``), and the kernel
stops sending it.

Read-only mounts follow the writer: ``follow_loop`` checks the log every second.  When it
shrank or was replaced (the log's ``generation`` changed) every cache is dropped, the
kernel's too, and handles opened before answer ESTALE.

One read stream, one generation (issue 19, item 1).  Without opens there is no handle to
carry a generation, so the inodes do: ``events/N``, ``pretty/N`` and ``segments/K`` carry
the *slot* of the generation they were looked up in (``inodes.py``).  A new generation
takes another slot and drops every name of the old one from the kernel's dentry cache,
so a new lookup answers a new node ID (the kernel then drops its dentry:
``fs/fuse/dir.c``, ``fuse_dentry_revalidate()``), while a file opened before reads on by
its old node ID and is answered ESTALE.  Bytes read straight from the log file (a large
event, a segment, a small event not cached yet) are served only if the log is still the
same generation after the ``pread`` (``_read_then_recheck``): a writer's recovery cuts
and rewrites the file in place before the follower notices.  A slot is taken again only
when the kernel has forgotten all its inodes: lookups and readdirplus entries are counted
(``fs/fuse/inode.c``, ``fuse_iget()``; ``fs/fuse/readdir.c``, ``fuse_direntplus_link()``)
and FORGETs subtracted (``forget``).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import logging
import os
import secrets
import stat
import time
from typing import NamedTuple

import pyfuse3
import trio

from bookfs.formats.book import Book
from bookfs.formats.eventlog import EventLog
from bookfs.errors import BookError
from bookfs.formats.info import render, summary
from bookfs.formats.layout import META_FIELDS, META_KEYS
from bookfs.formats.segments import DEFAULT_SPAN, Segment, Segments
from bookfs.fs import inodes as I
from bookfs.fs.cache import EventCache
from bookfs.fs.commit import HOLD, NEXT_KEY, CommitQueue, Refusals, Reservation, WorkerThread, refuse
from bookfs.fs import closer
from bookfs.fs.closer import Writer
from bookfs.fs.staging import Staging

log = logging.getLogger(__name__)

FOREVER = 24 * 3600.0  # cache timeout for immutable entries (seconds)
CHANGING = 1.0  # attribute timeout for things an append changes (seconds)
GROWING = 0.0  # attribute timeout for files whose size an append changes
SMALL_EVENT = 128 << 10  # events up to this size are read whole and cached
FOLLOW_EVERY = 1.0  # seconds between a read-only mount's checks of the log
PROBE_DEADLINE = 10.0  # seconds the commit rule's /proc probe may take (closer.probe)
#: ``BOOKFS_BENCH_SKIP_PROBE=1`` (benchmarks only: bench/bench_append.py's "bookfs-noprobe"
#: source) commits at every close of the writer's table without probing it, so the probe's
#: cost can be measured; it gives up the dup and killed-writer checks.
SKIP_PROBE = bool(os.environ.get("BOOKFS_BENCH_SKIP_PROBE"))
PRETTY_KEPT = 64  # renderings of pretty/N kept for reads by inode (each at most ~64 KiB)

#: What the pyfuse3 in use offers beyond stock (``read_inode``, ``noflush``,
#: ``cache_readdir``: see mount_scripts/pyfuse3-3.5.0-bookfs.patch).  The environment
#: variable ``BOOKFS_STOCK_PYFUSE3=1`` makes bookfs use none of them (tests, benchmarks).
FEATURES: frozenset[str] = (frozenset() if os.environ.get("BOOKFS_STOCK_PYFUSE3")
                            else frozenset(getattr(pyfuse3, "FEATURES", ())))


def guarded(fn):
    """Turn anything but FUSEError into an errno, so no exception can kill the mount."""

    @functools.wraps(fn)
    async def wrapper(self, *args):
        if self.debug:
            log.debug("%s%r", fn.__name__, args)
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except BookError as e:
            log.warning("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno) from None
        except OSError as e:
            log.warning("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("unexpected error in %s%r; answering EIO", fn.__name__, args)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


class Modes(NamedTuple):
    """Permission bits of the mount's files, derived from the source (``source_modes``)."""

    read: int  # events, segments, info files
    dir: int  # events/, meta/, epochs/, the root
    new: int  # new/: search and list for readers, create for writers
    meta: int  # meta/<key>
    staged: int  # a new/<N> being written


def _source_file(book) -> str:
    """The file whose owner and mode stand for the log: the newest epoch's log for a
    pier, ``book.log`` (or LMDB's ``data.mdb``) otherwise."""
    epochs = getattr(book, "epochs", None)
    if epochs:
        book = epochs[-1].log
    for attr in ("log_path", "data_path"):
        path = getattr(book, attr, None)
        if path and os.path.exists(path):
            return path
    data = os.path.join(book.directory, "data.mdb")
    return data if os.path.exists(data) else book.directory


def source_modes(book, readonly: bool, *, owner: tuple[int | None, int | None] = (None, None),
                 umask: int | None = None) -> tuple[int, int, Modes]:
    """``(uid, gid, modes)`` for the mount: the source log file's owner, and its mode
    bits for each class (user, group, other), dropped for a class that cannot search the
    log's directory.  Write bits are dropped on a read-only mount.  With the kernel's
    ``default_permissions`` this lets exactly the users who could read the log read the
    mount, and the users who could write it append (root is, as always, exempt).

    The mount options ``uid=``/``gid=`` (``owner``) replace the owner and group, and
    ``umask=`` replaces the log's mode bits with ``0o777 & ~umask`` (then the same rules:
    read bits for files, search where readable, write only on a read-write mount)."""
    path = _source_file(book)
    st = os.stat(path)
    mode = st.st_mode & 0o777
    dst = os.stat(os.path.dirname(path) if path != book.directory else path)
    if (dst.st_uid, dst.st_gid) == (st.st_uid, st.st_gid):
        for shift in (6, 3, 0):
            if not (dst.st_mode >> shift) & 1:
                mode &= ~(7 << shift)
    if umask is not None:
        mode = 0o777 & ~umask
    r = mode & 0o444
    w = 0 if readonly else mode & 0o222
    rx = r | (r >> 2)
    modes = Modes(read=r, dir=rx, new=rx | w | (w >> 1), meta=r | w, staged=w)
    uid, gid = owner
    return (st.st_uid if uid is None else uid), (st.st_gid if gid is None else gid), modes


class _EventHandle:
    """An open event: its number and the log generation it was opened in (the bytes
    live in the shared cache or on disk, never in the handle)."""

    __slots__ = ("event", "generation", "small")

    def __init__(self, event: int, generation: int, small: bool):
        self.event, self.generation, self.small = event, generation, small


class _SegmentHandle:
    """An open segment and the log generation it was opened in."""

    __slots__ = ("seg", "generation")

    def __init__(self, seg: Segment, generation: int):
        self.seg, self.generation = seg, generation


class _BytesHandle:
    """A snapshot served to readers (``info``, a meta field)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data


class _MetaWriteHandle:
    """A meta field open for writing.  The buffer starts as the field's current bytes
    (empty after ``O_TRUNC``), so a partial write keeps the bytes it does not touch."""

    __slots__ = ("key", "staging", "dirty", "poisoned", "writer")

    def __init__(self, key: str, current: bytes, writer: Writer | None):
        self.key, self.staging, self.dirty = key, Staging(4096), False
        self.poisoned = 0
        self.writer = writer  # who opened it (its thread: the refusal record's pid)
        if current:
            self.staging.write(0, current)


class BookOperations(pyfuse3.Operations):
    """FUSE operations over one open log: a :class:`Book`, or any ``EventLog`` (a vere
    log, an LMDB epoch, a :class:`~bookfs.formats.pier.Pier`, whose epochs appear under
    ``epochs/``)."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, book: EventLog, *, stall_timeout: float = 30.0, debug: bool = False,
                 spill_dir: str | None = None, mountpoint: str | None = None,
                 segment_span: int = DEFAULT_SPAN,
                 owner: tuple[int | None, int | None] = (None, None),
                 umask: int | None = None):
        super().__init__()
        self.book = book
        # the bulk view needs the UIP layout's deeds; a pier shows its epochs instead
        self.segments = Segments(book, segment_span) if isinstance(book, Book) else None
        self.epochs = list(getattr(book, "epochs", []))
        self._epoch_by_name = {e.name.encode(): k for k, e in enumerate(self.epochs)}
        self._root = list(_ROOT_ENTRIES)
        self._root.append((b"pretty", I.PRETTY))  # readable renderings (bookfs show)
        if self.segments is not None:
            self._root.append((b"segments", I.SEGMENTS))
        if self.epochs:
            self._root.append((b"epochs", I.EPOCHS))
        self._root_names = dict(self._root)
        self._dirs = {ino for _, ino in self._root if ino != I.INFO} | {I.ROOT}
        # resolved before mounting: descriptors' links name files by their real path
        self.mountpoint = mountpoint
        self.readonly = not book.writable
        self.debug = debug
        self.refusals = Refusals()  # refused appends and meta writes: in info
        self.queue = CommitQueue(book, stall_timeout=stall_timeout, spill_dir=spill_dir,
                                 refusals=self.refusals, check_deadline=PROBE_DEADLINE)
        self._handles: dict[int, object] = {}
        # handles start at a random point, so a new/ file's inode (2^48 + its handle)
        # names it on this mount alone: the commit rule finds its descriptors in another
        # process's table by inode, and another mount's leftovers must not look like it
        self._next_fh = secrets.randbelow(1 << 40) + 1
        self._cache = EventCache()
        self._verified_large: set[int] = set()  # large events whose check passed (8 B each)
        self._generation = getattr(book, "generation", 0)
        # the generation slot of events/, pretty/ and segments/ inodes (inodes.py), None
        # while no slot is free; and how many lookups of each slot's inodes the kernel
        # has not forgotten yet (a slot is taken again only at 0)
        self._slot: int | None = 0
        self._slot_refs = [0] * I.SLOTS
        self._known = book.gulf()  # the range the kernel may have cached
        self._uid, self._gid, self._modes = source_modes(book, self.readonly, owner=owner,
                                                         umask=umask)
        self._mounted_ns = time.time_ns()
        self._segment_names: dict[int, bytes] = {}  # segment index -> name the kernel holds
        # fewer requests (module docstring): which of pyfuse3's extensions this mount uses
        self.no_open = self.readonly and "read_inode" in FEATURES
        self.noflush = "noflush" in FEATURES
        self.cache_dirs = "cache_readdir" in FEATURES
        # the commit rule needs each FLUSH's and WRITE's caller (pyfuse3 then passes ctx)
        self.request_owner = "request_owner" in FEATURES
        self.mounts = closer.Mounts(None)  # set_device() once mounted
        self.prober = WorkerThread("bookfs-probe")
        self._listed: dict[int, tuple] = {}  # directory inode -> log state at its opendir
        # (event, generation) -> its rendering; renderings under way (ops._pretty_text)
        self._pretty: collections.OrderedDict[tuple[int, int], bytes] = collections.OrderedDict()
        self._pretty_rendering: dict[tuple[int, int], trio.Event] = {}
        self._content_mtime: dict[int, tuple[bytes, int]] = {}  # inode -> (content, mtime)
        self._segment_checked: dict[int, int] = {}  # segment index -> size whose deeds passed

    # --- helpers -------------------------------------------------------------------------

    def _new_fh(self, handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return fh

    def _file_info(self, fh: int, **kw) -> pyfuse3.FileInfo:
        """A FileInfo for an open that cannot write: ``noflush`` where pyfuse3 offers it
        (a close then sends no FLUSH; only ``new/`` and ``meta/`` writes need one)."""
        fi = pyfuse3.FileInfo(fh=fh, **kw)
        if self.noflush:
            fi.noflush = True
        return fi

    def fuse_path(self) -> str:
        """Which request path this mount is on, for ``info``."""
        if self.no_open:
            return "patched pyfuse3: no-open reads by inode, noflush, cached listings"
        if self.noflush:
            return ("patched pyfuse3: noflush, cached listings (opens kept for new/ and "
                    f"meta/); the commit rule's descriptor scan in {closer.SCAN}")
        refused = "" if self.readonly else "; appends and meta writes refused"
        return (f"stock pyfuse3: a request for every open and close{refused} "
                "(mount_scripts/setup.sh builds the patched one)")

    def _changed_mtime(self, ino: int, content: bytes, mtime_ns: int) -> int:
        """The mtime to report for a small file whose content changes (``info``): at least
        ``mtime_ns``, and later whenever ``content`` differs from what was last reported,
        so the kernel (which rechecks it before reading) drops its cached pages."""
        seen = self._content_mtime.get(ino)
        if seen is not None and seen[0] != content:
            mtime_ns = max(mtime_ns, time.time_ns(), seen[1] + 1)
        elif seen is not None:
            mtime_ns = max(mtime_ns, seen[1])
        self._content_mtime[ino] = (content, mtime_ns)
        return mtime_ns

    def _attrs(self, ino: int, mode: int, size: int, mtime_ns: int, timeout: float,
               nlink: int = 1, entry_timeout: float | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = mode
        a.st_nlink = nlink
        a.st_uid, a.st_gid = self._uid, self._gid
        a.st_size = size
        a.st_blksize = 4096
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = a.st_ctime_ns = a.st_mtime_ns = mtime_ns
        a.attr_timeout = timeout
        a.entry_timeout = timeout if entry_timeout is None else entry_timeout
        return a

    # --- generation slots (inodes.py; issue 19, item 1) ----------------------------------

    def _slot_now(self) -> int:
        """The slot new lookups of events, renderings and segments get.  While none is
        free (the kernel still holds inodes of every other slot: files of older
        generations held open) those lookups answer EIO, until one is forgotten."""
        if self._slot is None:
            self._slot = self._free_slot(None)
            if self._slot is None:
                raise refuse(errno.EIO, "files of the log's older generations are still "
                                        "open (the log was replaced or recovered "
                                        f"{I.SLOTS} times while they were held); close "
                                        "them to read the new log")
            log.info("generation slot %d taken", self._slot)
        return self._slot

    def _free_slot(self, old: int | None) -> int | None:
        """A slot other than ``old`` whose inodes the kernel has all forgotten."""
        start = 0 if old is None else old + 1
        for k in range(I.SLOTS):
            s = (start + k) % I.SLOTS
            if s != old and not self._slot_refs[s]:
                return s
        return None

    def _entry(self, attrs: pyfuse3.EntryAttributes) -> pyfuse3.EntryAttributes:
        """Count an entry handed to the kernel (a lookup or a readdirplus entry: the
        kernel's ``nlookup`` grows by one, ``fs/fuse/inode.c``, ``fuse_iget()``)."""
        slot = I.slot_of(attrs.st_ino)
        if slot is not None and slot < I.SLOTS:
            self._slot_refs[slot] += 1
        return attrs

    def _stale(self, inode: int) -> bool:
        """Whether ``inode`` names a file of an older generation of the log."""
        slot = I.slot_of(inode)
        return slot is not None and slot != self._slot

    def _current(self, inode: int, what: str) -> None:
        """ESTALE for a file of an older generation: it was looked up before the log
        was replaced or recovered, and its bytes are not the new log's."""
        if self._stale(inode):
            raise refuse(errno.ESTALE, f"{what}: the log was recovered or replaced since "
                                       "this file was looked up; open it again")

    @guarded
    async def forget(self, inode_list):
        for inode, nlookup in inode_list:
            slot = I.slot_of(inode)
            if slot is not None and slot < I.SLOTS:
                self._slot_refs[slot] = max(0, self._slot_refs[slot] - nlookup)

    def _follow(self) -> None:
        """On a read-only mount, pick up events another process committed; if the log
        shrank or was replaced under us, drop every cache (ours and the kernel's)."""
        if not self.readonly:
            return
        self.book.refresh()
        gen = getattr(self.book, "generation", 0)
        old = self._known
        self._known = self.book.gulf()
        if gen == self._generation and self._known != old and self.mountpoint:
            trio.lowlevel.spawn_system_task(self._drop_attrs)  # it grew
        if gen != self._generation:
            self._generation = gen
            old_slot, self._slot = self._slot, self._free_slot(self._slot)
            if self._slot is None:
                log.error("the log changed again while files of %d older generations are "
                          "still open: events, renderings and segments answer EIO until "
                          "they are closed", I.SLOTS - 1)
            self._cache.clear()
            self._verified_large.clear()
            self._segment_checked.clear()
            self._pretty.clear()
            log.warning("the log changed under the mount (it shrank or was replaced): "
                        "events %s..%s are reread from disk", old[0], old[1])
            segments, self._segment_names = self._segment_names, {}
            trio.lowlevel.spawn_system_task(self._invalidate_kernel, old, self._known,
                                            segments, old_slot)

    def _changing_inodes(self) -> list[int]:
        """Inodes whose attributes an append changes and the kernel caches for
        ``CHANGING`` (the root, ``events/``, every epoch's directories) and the info files."""
        inos = [I.ROOT, I.EVENTS, I.INFO]
        for k in range(len(self.epochs)):
            inos += [I.epoch_inode(k, kind)
                     for kind in (I.EPOCH_DIR, I.EPOCH_EVENTS, I.EPOCH_INFO)]
        return inos

    def _drop_attrs_sync(self, inodes: list[int]) -> None:
        for ino in inodes:
            with contextlib.suppress(OSError):  # ENOENT: the kernel holds nothing of it
                pyfuse3.invalidate_inode(ino, attr_only=True)

    async def _drop_attrs(self) -> None:
        """Make the kernel forget the attributes the log's growth changed (a worker
        thread, as every notification: see ``_invalidate_kernel``)."""
        try:
            await trio.to_thread.run_sync(self._drop_attrs_sync, self._changing_inodes())
        except Exception:  # never let a system task kill the mount
            log.exception("invalidating the kernel's cached attributes failed")

    async def _invalidate_kernel(self, old: tuple[int, int], new: tuple[int, int],
                                 segments: dict[int, bytes], slot: int | None) -> None:
        """Make the kernel forget what it cached of events ``old`` and of ``segments``
        (index -> name), looked up in generation ``slot`` (a worker thread: dropping
        pages waits for reads in flight, which this loop must keep serving)."""
        try:
            await trio.to_thread.run_sync(self._invalidate_sync, old, new, segments, slot)
        except Exception:  # never let a system task kill the mount
            log.exception("invalidating the kernel's caches failed")

    def _invalidate_sync(self, old: tuple[int, int], new: tuple[int, int],
                         segments: dict[int, bytes], slot: int | None) -> None:
        """Every name of the old generation is dropped from the kernel's dentry cache,
        gone or not: its next lookup answers the new slot's inode, and the dentry's
        inode, no longer held, is evicted and forgotten (``_slot_refs``).  Names other
        than the two canonical ones are never cached (``lookup``)."""
        slot = 0 if slot is None else slot
        for k, name in segments.items():  # a segment's bytes may have changed
            with contextlib.suppress(OSError):
                pyfuse3.invalidate_inode(I.segment_inode(k, slot))
            with contextlib.suppress(OSError):
                pyfuse3.invalidate_entry(I.SEGMENTS, name)
        first, last = old
        if not last:
            return
        self._drop_attrs_sync(self._changing_inodes())
        parents = [I.EVENTS, I.PRETTY] + [I.epoch_inode(k, I.EPOCH_EVENTS)
                                          for k in range(len(self.epochs))]
        for event in range(first, last + 1):  # names first: new opens find the new log
            for name in (I.event_name(event), str(event).encode()):
                for parent in parents:
                    with contextlib.suppress(OSError):  # ENOENT: nothing cached
                        pyfuse3.invalidate_entry(parent, name)
        for event in range(first, last + 1):  # then the old inodes' pages and attributes
            with contextlib.suppress(OSError):
                pyfuse3.invalidate_inode(I.event_inode(event, slot))
            if self.no_open:  # renderings were cached by inode too
                with contextlib.suppress(OSError):
                    pyfuse3.invalidate_inode(I.pretty_inode(event, slot))

    async def follow_loop(self) -> None:
        """Run by the daemon of a read-only mount: check the log every ``FOLLOW_EVERY``
        seconds, so a recovery or replacement by the writer is noticed even while the
        kernel serves every read from its cache."""
        while True:
            await trio.sleep(FOLLOW_EVERY)
            try:
                self._follow()
            except Exception:
                log.exception("following the log failed; trying again")

    def _event_of(self, ino: int) -> int:
        return I.inode_event(ino, self.book.first)

    def _log_mtime(self) -> int:
        last = self.book.last
        return self.book.mtime_ns(last) if last else self._mounted_ns

    def _event_attrs(self, event: int) -> pyfuse3.EntryAttributes:
        return self._attrs(I.event_inode(event, self._slot_now()),
                           stat.S_IFREG | self._modes.read,
                           self.book.payload_size(event), self.book.mtime_ns(event), FOREVER)

    async def _pretty_attrs(self, event: int) -> pyfuse3.EntryAttributes:
        """``pretty/<event>``: size 0 (like a /proc file), content rendered on open and
        served with ``direct_io``.  On the no-open path the kernel reads through its page
        cache up to the size, so the rendering is made here and its real size given."""
        slot = self._slot_now()  # before the rendering: its size is this generation's
        size = len(await self._pretty_text(event)) if self.no_open else 0
        return self._attrs(I.pretty_inode(event, slot), stat.S_IFREG | self._modes.read, size,
                           self.book.mtime_ns(event), FOREVER)

    async def _pretty_text(self, event: int) -> bytes:
        """The rendering of ``event``, made once per event and log generation: every name
        of it (``pretty/1``, ``pretty/01``) and every open or lookup while it is being
        rendered share one rendering (the others wait for it), kept for the last
        ``PRETTY_KEPT`` events (each at most ~64 KiB: bounded memory)."""
        key = (event, self._generation)
        while True:
            text = self._pretty.get(key)
            if text is not None:
                self._pretty.move_to_end(key)
                return text
            rendering = self._pretty_rendering.get(key)
            if rendering is None:
                break
            await rendering.wait()  # then it is kept, or it failed and is made again here
        done = self._pretty_rendering[key] = trio.Event()
        try:
            text = await self._pretty_bytes(event)
            if key[1] != self._generation:  # rendered from a log that is gone
                raise refuse(errno.ESTALE, f"pretty/{event}: the log was recovered or "
                                           "replaced while it was rendered")
            self._pretty[key] = text
            while len(self._pretty) > PRETTY_KEPT:
                self._pretty.popitem(last=False)
        finally:
            del self._pretty_rendering[key]
            done.set()
        return text

    async def _pretty_bytes(self, event: int) -> bytes:
        """The rendering of ``event`` (``bookfs show``'s text, abbreviated: bounded size).
        The payload is checked first, as for ``events/``; a large one is then read in
        place by the renderer, a few blocks at a time, in a worker thread."""
        from bookfs.errors import MetaAbsent
        from bookfs.noun.event import event_text

        size = self.book.payload_size(event)
        data = await self._check_event(event)
        if data is not None:
            def pread(off: int, n: int) -> bytes:
                return data[off:off + n]
        else:
            def pread(off: int, n: int) -> bytes:
                return self.book.read_slice(event, off, n)
        try:
            who = int.from_bytes(self.book.read_meta("who"), "little")
        except MetaAbsent:
            who = None
        text = await trio.to_thread.run_sync(
            lambda: "".join(event_text(event, size, pread, who=who)))
        return text.encode()

    def _dir_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        mode = self._modes.new if ino == I.NEW else self._modes.dir
        size = self.book.count if ino == I.EVENTS else 0
        return self._attrs(ino, stat.S_IFDIR | mode, size, self._log_mtime(), CHANGING,
                           nlink=2, entry_timeout=FOREVER)

    def _segment_attrs(self, seg: Segment) -> pyfuse3.EntryAttributes:
        """A segment's attributes; its name is noted as one the kernel may cache."""
        self._segment_names[seg.index] = I.event_name(seg.first)
        return self._attrs(I.segment_inode(seg.index, self._slot_now()),
                           stat.S_IFREG | self._modes.read, seg.size,
                           self.book.mtime_ns(seg.last), FOREVER if seg.complete else GROWING,
                           entry_timeout=FOREVER)

    def _negative(self) -> pyfuse3.EntryAttributes:
        """A negative entry the kernel may cache: for names that can never exist."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        a.entry_timeout = FOREVER
        return a

    def _info_bytes(self) -> bytes:
        """The info file: the log's summary; on a read-write mount ``next:``, the number
        the next ``new/<N>`` must have now; then the last refused appends and meta writes
        (a shell ignores close()'s errno, so this is where a user reads why).  A read-only
        mount refuses writes at open(), where the shell sees the error, so it has no
        record and its info is exactly ``bookfs info``'s."""
        info = summary(self.book)
        info["fuse"] = self.fuse_path()
        if self.readonly:
            return render(info).encode()
        info[NEXT_KEY] = self.queue.next_free()
        return (render(info) + self.refusals.render()).encode()

    def _epoch_info(self, k: int) -> bytes:
        e = self.epochs[k]
        first, last = e.log.gulf()
        return render({"epoch": e.name, "format": e.log.format, "base": e.base,
                       "first": first, "last": last, "events": e.log.count,
                       "bytes": e.log.log_bytes, "path": e.log.directory}).encode()

    def _meta_mtime(self) -> int:
        book = self.book
        log = self.epochs[-1].log if self.epochs else book
        path = getattr(log, "meta_path", None)
        return os.stat(path).st_mtime_ns if path else self._mounted_ns

    def _epoch_attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        k, kind = I.inode_epoch(ino)
        if k >= len(self.epochs):
            raise pyfuse3.FUSEError(errno.ENOENT)
        if kind == I.EPOCH_INFO:
            data = self._epoch_info(k)
            return self._attrs(ino, stat.S_IFREG | self._modes.read, len(data),
                               self._changed_mtime(ino, data, self._log_mtime()), GROWING,
                               entry_timeout=FOREVER)
        if kind in (I.EPOCH_DIR, I.EPOCH_EVENTS):
            size = self.epochs[k].log.count if kind == I.EPOCH_EVENTS else 0
            return self._attrs(ino, stat.S_IFDIR | self._modes.dir, size, self._log_mtime(),
                               CHANGING, nlink=2, entry_timeout=FOREVER)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def _attrs_of(self, ino: int) -> pyfuse3.EntryAttributes:
        self._current(ino, f"inode {ino}")
        if I.is_pretty(ino):
            event = I.inode_pretty(ino, self.book.first)
            if event not in self.book:
                self._follow()
            if event not in self.book:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return await self._pretty_attrs(event)
        if I.is_event(ino):
            event = self._event_of(ino)
            if event not in self.book:
                self._follow()
            if event not in self.book:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._event_attrs(event)
        if I.is_epoch(ino):
            self._follow()
            return self._epoch_attrs(ino)
        if I.is_segment(ino) and self.segments is not None:
            seg = self.segments.get(I.inode_segment(ino))
            if seg is None or not seg.complete:  # it may have grown: look at the log
                self._follow()
                self._current(ino, f"segment {I.inode_segment(ino)}")
                seg = self.segments.get(I.inode_segment(ino))
            if seg is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._segment_attrs(seg)
        if ino in self._dirs:
            self._follow()
            return self._dir_attrs(ino)
        if ino == I.INFO:
            self._follow()
            data = self._info_bytes()
            return self._attrs(ino, stat.S_IFREG | self._modes.read, len(data),
                               self._changed_mtime(ino, data, self._log_mtime()), GROWING,
                               entry_timeout=FOREVER)
        if ino in I.META_BY_INODE:
            key = I.META_BY_INODE[ino]
            mode = self._modes.meta
            mtime = self._meta_mtime()
            return self._attrs(ino, stat.S_IFREG | mode, META_FIELDS[key][1], mtime, CHANGING,
                               entry_timeout=FOREVER)
        if I.is_staging(ino):
            r = self._handles.get(ino - I.STAGING_BASE)
            if isinstance(r, Reservation):
                return self._attrs(ino, stat.S_IFREG | self._modes.staged, len(r.staging),
                                   time.time_ns(),
                                   CHANGING, entry_timeout=0)
        raise pyfuse3.FUSEError(errno.ENOENT)

    # --- lookups and attributes ----------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        attrs = await self._lookup(parent_inode, name)
        if I.slot_of(attrs.st_ino) is not None:
            self._entry(attrs)
            number = I.parse_number(name)
            names = {I.event_name(number), str(number).encode()}
            if parent_inode == I.SEGMENTS:  # the name _segment_names notes
                names = {I.event_name(number)}
            if name not in names:
                # a third spelling of a number (``0042``): never cached, so that a
                # replacement, which drops the canonical names (_invalidate_sync),
                # leaves no dentry that holds an old generation's inode
                attrs.entry_timeout = 0
        return attrs

    async def _lookup(self, parent_inode, name):
        if parent_inode == I.PRETTY:
            event = I.parse_number(name)
            if event is None:
                return self._negative()
            if event not in self.book:
                self._follow()
                if event not in self.book:
                    raise pyfuse3.FUSEError(errno.ENOENT)
            return await self._pretty_attrs(event)
        if parent_inode == I.EVENTS:
            event = I.parse_number(name)
            if event is None:  # can never exist (Hadoop's .<name>.crc, say): cache that
                return self._negative()
            if event not in self.book:
                self._follow()
                if event not in self.book:
                    raise pyfuse3.FUSEError(errno.ENOENT)
            return self._event_attrs(event)
        if parent_inode == I.EPOCHS and self.epochs:
            k = self._epoch_by_name.get(name)
            if k is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._epoch_attrs(I.epoch_inode(k, I.EPOCH_DIR))
        if I.is_epoch(parent_inode):
            k, kind = I.inode_epoch(parent_inode)
            if k >= len(self.epochs):
                raise pyfuse3.FUSEError(errno.ENOENT)
            if kind == I.EPOCH_DIR:
                sub = {b"events": I.EPOCH_EVENTS, b"info": I.EPOCH_INFO}.get(name)
                if sub is None:
                    raise pyfuse3.FUSEError(errno.ENOENT)
                return self._epoch_attrs(I.epoch_inode(k, sub))
            event = I.parse_number(name)
            if event is None or event not in self.epochs[k].log:
                self._follow()
                if event is None or event not in self.epochs[k].log:
                    raise pyfuse3.FUSEError(errno.ENOENT)
            return self._event_attrs(event)
        if parent_inode == I.SEGMENTS and self.segments is not None:
            event = I.parse_number(name)
            self._follow()
            seg = self.segments.containing_first(event) if event is not None else None
            if seg is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._segment_attrs(seg)
        if parent_inode == I.ROOT:
            ino = self._root_names.get(name)
        elif parent_inode == I.META:
            ino = I.META_INODES.get(name.decode("utf-8", "replace"))
        else:  # new/: entries are never looked up, so that open(O_CREAT) reaches create
            ino = None
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self._attrs_of(ino)

    @guarded
    async def getattr(self, inode, ctx=None):
        attrs = await self._attrs_of(inode)
        self._current(inode, f"inode {inode}")  # the log may have changed meanwhile
        return attrs

    @guarded
    async def setattr(self, inode, attr, fields, fh, ctx):
        times = fields.update_atime or fields.update_mtime or fields.update_ctime
        owner = fields.update_mode or fields.update_uid or fields.update_gid
        if I.is_staging(inode):
            r = self._handles.get(inode - I.STAGING_BASE)
            if not isinstance(r, Reservation):
                raise pyfuse3.FUSEError(errno.ENOENT)
            if fields.update_size:
                try:
                    r.staging.truncate(attr.st_size)
                except (OSError, BookError) as e:
                    r.poison(getattr(e, "errno", None) or errno.EIO)
                    raise
            return await self._attrs_of(inode)
        if inode in I.META_BY_INODE:
            key = I.META_BY_INODE[inode]
            path, refused = f"meta/{key}", self.refusals.refuse
            if self.readonly:
                raise refused(path, errno.EROFS, f"{path}: the mount is read-only", ctx.pid)
            if owner:
                raise refused(path, errno.EPERM, f"{path}: meta files keep their owner and "
                                                 "mode", ctx.pid)
            if fields.update_size:
                h = self._handles.get(fh) if fh is not None else None
                if isinstance(h, _MetaWriteHandle):  # O_TRUNC, ftruncate: judged at close
                    h.staging.truncate(attr.st_size)
                    h.dirty = True
                elif attr.st_size != META_FIELDS[key][1]:
                    raise refused(path, errno.EINVAL, f"{path}: truncate to {attr.st_size} "
                                                      f"bytes; the field is exactly "
                                                      f"{META_FIELDS[key][1]} bytes", ctx.pid)
            elif times:
                raise refused(path, errno.EPERM, f"{path}: times follow the log; write the "
                                                 "field to change it", ctx.pid)
            return await self._attrs_of(inode)
        if fields.update_size:
            raise refuse(errno.EROFS, f"inode {inode}: events are immutable; append through new/")
        raise refuse(errno.EPERM, f"inode {inode}: attributes are fixed")

    # --- directories ---------------------------------------------------------------------

    @guarded
    async def opendir(self, inode, ctx):
        is_dir = inode in self._dirs or (
            I.is_epoch(inode) and I.inode_epoch(inode)[1] != I.EPOCH_INFO)
        if not is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        self._follow()
        if not self.cache_dirs:
            return inode
        # the kernel may keep its cached listing unless the log changed since the last
        # opendir of this directory (an append, a recovery, a replacement)
        state = (self._generation, self.book.gulf())
        unchanged = self._listed.get(inode) == state
        self._listed[inode] = state
        return pyfuse3.FileInfo(fh=inode, cache_readdir=True, keep_cache=unchanged)

    @guarded
    async def readdir(self, fh, start_id, token):
        if fh == I.NEW:
            return  # write-only: lists as empty, so find, du, rsync and tar work
        if fh == I.EVENTS or (I.is_epoch(fh) and I.inode_epoch(fh)[1] == I.EPOCH_EVENTS):
            # cookie = position in the log + 1 (an off_t: event numbers may pass 2^63)
            log = self.book if fh == I.EVENTS else self.epochs[I.inode_epoch(fh)[0]].log
            first, last = log.gulf()
            if not last:
                return
            event = first + start_id
            if event > last:
                return
            # readdir_reply copies the attributes into the reply buffer, so one object is
            # reused and only the fields that differ are set (this is the ls -l hot path)
            a = self._event_attrs(event)
            reply, name, inode = pyfuse3.readdir_reply, I.event_name, I.event_inode
            size_of, mtime_of = log.payload_size, log.mtime_ns
            slot, refs = self._slot, self._slot_refs
            while event <= last:
                size = size_of(event)
                a.st_ino = inode(event, slot)
                a.st_size = size
                a.st_blocks = (size + 511) >> 9
                a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = mtime_of(event)
                if not reply(token, name(event), a, event - first + 1):
                    return
                refs[slot] += 1  # an entry the kernel links (readdirplus): _entry
                event += 1
            return
        if fh == I.PRETTY:
            # lists as empty: pretty/N is reached by name.  A listing would make every
            # whole-mount walk (grep -r, tar, rsync, cp -r) render every event, and copy
            # size-0 entries as empty files.
            return
        if fh == I.SEGMENTS:  # cookie = segment index + 1
            for k in range(start_id, self.segments.slots()):
                seg = self.segments.get(k)
                if seg is None:
                    continue
                attrs = self._segment_attrs(seg)
                if not pyfuse3.readdir_reply(token, I.event_name(seg.first), attrs, k + 1):
                    return
                self._entry(attrs)
            return
        entries = self._small_dir(fh)
        for i in range(start_id, len(entries)):  # cookie = position + 1
            name, ino = entries[i]
            if not pyfuse3.readdir_reply(token, name, await self._attrs_of(ino), i + 1):
                return

    def _small_dir(self, fh: int) -> list[tuple[bytes, int]]:
        """The fixed entries of /, meta/, epochs/ and an epoch's directory."""
        if fh == I.ROOT:
            return self._root
        if fh == I.META:
            return [(k.encode(), ino) for k, ino in I.META_INODES.items()]
        if fh == I.EPOCHS:
            return [(e.name.encode(), I.epoch_inode(k, I.EPOCH_DIR))
                    for k, e in enumerate(self.epochs)]
        k = I.inode_epoch(fh)[0]
        return [(b"events", I.epoch_inode(k, I.EPOCH_EVENTS)),
                (b"info", I.epoch_inode(k, I.EPOCH_INFO))]

    @guarded
    async def releasedir(self, fh):
        return None

    # --- reading -------------------------------------------------------------------------

    async def _check_event(self, event: int) -> bytes | None:
        """Check ``event`` before any of its bytes are served: a small one is read whole,
        checked and kept in the shared cache (returned); a large one is checked by
        streaming it in a worker thread, once per log generation (None: read it with
        ``read_slice``).  A failed check raises, which the handlers answer EIO."""
        if self.book.payload_size(event) <= SMALL_EVENT:
            return self._checked(event)
        if event not in self._verified_large:
            await trio.to_thread.run_sync(self.book.verify_event, event)
            self._verified_large.add(event)
        return None

    def _checked(self, event: int) -> bytes:
        """The payload of small ``event``, checked, from the shared cache or the disk."""
        data = self._cache.get(event)
        if data is None:
            # the format's check (CRC); kept only if the log is still this generation
            # once it was read (a recovery rewrites the file in place: _read_then_recheck)
            data = self._read_then_recheck(None, f"events/{event}", self.book.read, event)
            self._cache.put(event, data)
        return data

    @guarded
    async def open(self, inode, flags, ctx):
        if self.no_open:
            # the kernel takes ENOSYS as "opens need no request" for the whole mount: it
            # opens every file itself (a read-only mount: the kernel refuses writes) and
            # reads arrive by inode (read_inode), where the open's checks now happen
            raise pyfuse3.FUSEError(errno.ENOSYS)
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND)
        self._current(inode, f"inode {inode}")
        if I.is_event(inode):
            event = self._event_of(inode)
            if writing:
                raise refuse(errno.EROFS, f"events/{event} is immutable; append through new/")
            if event not in self.book:
                raise pyfuse3.FUSEError(errno.ENOENT)
            generation = self._generation
            small = await self._check_event(event) is not None
            handle = _EventHandle(event, generation, small)
            return self._file_info(self._new_fh(handle), keep_cache=True)
        if I.is_pretty(inode):
            event = I.inode_pretty(inode, self.book.first)
            if writing:
                raise refuse(errno.EROFS, f"pretty/{event} is a read-only rendering")
            if event not in self.book:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._file_info(self._new_fh(_BytesHandle(await self._pretty_text(event))),
                                   direct_io=True, keep_cache=False)
        if I.is_epoch(inode):
            k, kind = I.inode_epoch(inode)
            if kind != I.EPOCH_INFO or k >= len(self.epochs):
                raise pyfuse3.FUSEError(errno.EISDIR)
            if writing:
                raise refuse(errno.EACCES, "epochs/*/info is read-only")
            return self._file_info(self._new_fh(_BytesHandle(self._epoch_info(k))),
                                   direct_io=True, keep_cache=False)
        if I.is_segment(inode) and self.segments is not None:
            if writing:
                raise refuse(errno.EROFS, "segments are read-only")
            seg = self.segments.get(I.inode_segment(inode))
            if seg is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            generation = self._generation
            await self._check_segment(seg)
            return self._file_info(self._new_fh(_SegmentHandle(seg, generation)),
                                   keep_cache=seg.complete)
        if inode == I.INFO:
            if writing:
                raise refuse(errno.EACCES, "info is read-only")
            self._follow()
            return self._file_info(self._new_fh(_BytesHandle(self._info_bytes())),
                                   direct_io=True, keep_cache=False)
        if inode in I.META_BY_INODE:
            key = I.META_BY_INODE[inode]
            if writing:
                path, refused = f"meta/{key}", self.refusals.refuse
                if self.readonly:
                    raise refused(path, errno.EROFS, f"{path}: the mount is read-only",
                                  ctx.pid)
                if flags & os.O_APPEND:
                    raise refused(path, errno.EINVAL, f"{path}: write the whole field, "
                                                      "not an append", ctx.pid)
                self._need_rule(path, ctx)
                truncated = bool(flags & os.O_TRUNC)
                current = b"" if truncated else self.book.read_meta(key)
                h = _MetaWriteHandle(key, current, Writer(ctx.pid))
                h.dirty = truncated  # emptied: judged (and refused, unless rewritten) at close
                return pyfuse3.FileInfo(fh=self._new_fh(h), direct_io=True, keep_cache=False)
            return self._file_info(self._new_fh(_BytesHandle(self.book.read_meta(key))),
                                   direct_io=True, keep_cache=False)
        if I.is_staging(inode):
            raise refuse(errno.EBUSY, "an event being written cannot be opened again")
        raise pyfuse3.FUSEError(errno.EISDIR if inode in self._dirs else errno.ENOENT)

    async def _check_segment(self, seg: Segment) -> None:
        """Check ``seg``'s deeds before its bytes are served: once at each size (a complete
        segment's never changes; the growing last one is checked again when it grew)."""
        if self._segment_checked.get(seg.index) == seg.size:
            return
        await trio.to_thread.run_sync(self.segments.verify, seg)
        self._segment_checked[seg.index] = seg.size

    @guarded
    async def read(self, fh, off, size):
        return await self._read_handle(fh, off, size)

    @guarded
    async def read_inode(self, inode, fh, off, size):
        """Every read, with patched pyfuse3 (``read_inode`` in :data:`FEATURES`): through
        the handle an open made, or by inode when the kernel opened the file itself
        (fh 0: the no-open path)."""
        if fh:
            return await self._read_handle(fh, off, size)
        return await self._read_by_inode(inode, off, size)

    async def _read_by_inode(self, inode: int, off: int, size: int) -> bytes:
        """A read with no open behind it.  An event is checked on its first read (CRC;
        streamed, in a worker thread, for a large one): a failed check answers EIO, so
        the kernel caches none of its bytes."""
        if I.is_event(inode):
            event = self._event_of(inode)
            self._current(inode, f"events/{event}")
            if event not in self.book:
                self._follow()
                if event not in self.book:
                    raise refuse(errno.ESTALE, f"events/{event}: no longer in the log")
            self._current(inode, f"events/{event}")
            data = await self._check_event(event)
            self._current(inode, f"events/{event}")
            if data is not None:
                return data[off : off + size]
            return self._read_then_recheck(inode, f"events/{event}", self.book.read_slice,
                                           event, off, size)
        if I.is_pretty(inode):
            event = I.inode_pretty(inode, self.book.first)
            self._current(inode, f"pretty/{event}")
            if event not in self.book:
                raise refuse(errno.ESTALE, f"pretty/{event}: no longer in the log")
            text = await self._pretty_text(event)
            self._current(inode, f"pretty/{event}")
            return text[off : off + size]
        if inode == I.INFO:
            return self._info_bytes()[off : off + size]
        if I.is_epoch(inode):
            k, kind = I.inode_epoch(inode)
            if kind == I.EPOCH_INFO and k < len(self.epochs):
                return self._epoch_info(k)[off : off + size]
        elif I.is_segment(inode) and self.segments is not None:
            what = f"segment {I.inode_segment(inode)}"
            self._current(inode, what)
            seg = self.segments.get(I.inode_segment(inode))
            if seg is None:
                raise refuse(errno.ESTALE, f"{what}: no longer in the log")
            await self._check_segment(seg)
            self._current(inode, what)
            return self._read_then_recheck(inode, what, self.segments.read, seg, off, size)
        elif inode in I.META_BY_INODE:
            return self.book.read_meta(I.META_BY_INODE[inode])[off : off + size]
        raise pyfuse3.FUSEError(errno.EISDIR if inode in self._dirs else errno.EBADF)

    def _read_then_recheck(self, inode: int | None, what: str, read, *args) -> bytes:
        """``read(*args)``: bytes straight from the log file, served only if the log is
        still the generation of ``inode`` (or of the handle's ``generation``, when
        ``inode`` is None) *after* they were read.  A writer's recovery rewrites the file
        in place (cut, then appended again), which the follower notices only at its
        next check: without this look after the ``pread``, a stream could get the old
        event's first bytes and the new one's rest.  A rename leaves the old file open
        until that check, so the bytes read before it are the old generation's."""
        generation = self._generation
        data = read(*args)
        self._follow()  # one fstat, one stat and two small preads while nothing changed
        if self._generation != generation or (inode is not None and self._stale(inode)):
            raise refuse(errno.ESTALE, f"{what}: the log was recovered or replaced while "
                                       "it was read; open it again")
        return data

    async def _read_handle(self, fh: int, off: int, size: int) -> bytes:
        h = self._handles.get(fh)
        if isinstance(h, (_EventHandle, _SegmentHandle)) and h.generation != self._generation:
            what = (f"events/{h.event}" if isinstance(h, _EventHandle)
                    else f"segment {h.seg.index}")
            raise refuse(errno.ESTALE, f"{what}: the log was recovered or replaced since "
                                       "this file was opened; reopen it")
        if isinstance(h, _EventHandle):
            if h.small:
                return self._checked(h.event)[off : off + size]
            return self._read_then_recheck(None, f"events/{h.event}", self.book.read_slice,
                                           h.event, off, size)
        if isinstance(h, _BytesHandle):
            return h.data[off : off + size]
        if isinstance(h, _SegmentHandle):
            if not h.seg.complete and off + size > h.seg.size:
                # the last segment grows with the log: read up to its current end (the
                # new deeds' CRCs were checked by the save or by Book.refresh)
                seg = self.segments.get(h.seg.index)
                if seg is not None and seg.first == h.seg.first:
                    h.seg = seg
            return self._read_then_recheck(None, f"segment {h.seg.index}", self.segments.read,
                                           h.seg, off, size)
        raise pyfuse3.FUSEError(errno.EBADF)

    # --- writing -------------------------------------------------------------------------

    def set_device(self, device: str) -> None:
        """The mount's ``major:minor`` (from mountinfo, once mounted): how the commit rule
        knows this mount's descriptors in another process's table."""
        self.mounts = closer.Mounts(device)

    def _need_rule(self, path: str, ctx) -> None:
        """Refuse a write to ``new/`` or ``meta/`` that the commit rule could not judge:
        stock pyfuse3 does not say which process closes a file."""
        if not self.request_owner and self.mountpoint:
            raise self.refusals.refuse(
                path, errno.EROFS, f"{path}: appends and meta writes need pyfuse3 built "
                "with bookfs's patch (bash mount_scripts/setup.sh); stock pyfuse3 does not "
                "say which process closes a file", ctx.pid)

    async def _closing(self, writer: Writer | None, inode: int, ctx) -> tuple[str, str]:
        """What this FLUSH is (the commit rule, ``closer.py``): ``(verdict, why)`` with
        verdict COPY (another table: commit nothing), HELD (the writer's table holds
        another descriptor), LAST (commit), KILLED or UNKNOWN (commit nothing; fail).

        Decided from the request where it can be (a copy's close costs no probe); the
        writer's closes are probed off the event loop, with ``PROBE_DEADLINE``.  Without
        a mount (operations driven directly) or a caller (``ctx`` None), every close is
        the last."""
        if writer is None or ctx is None or not self.mountpoint:
            return closer.LAST, ""
        known = writer.closing(ctx)
        if known is False:
            return closer.COPY, ""
        if SKIP_PROBE:
            return closer.LAST, ""
        try:
            return await self.prober.run(closer.probe, ctx.pid, writer, inode, self.mounts,
                                         known, deadline=PROBE_DEADLINE)
        except TimeoutError as e:
            return closer.UNKNOWN, f"the close could not be judged ({e})"

    @guarded
    async def create(self, parent_inode, name, mode, flags, ctx):
        text = name.decode("utf-8", "replace")
        if parent_inode in (I.NEW, I.META):  # an append or a meta write: recorded
            path = f"{'new' if parent_inode == I.NEW else 'meta'}/{text}"
            if self.readonly:
                raise self.refusals.refuse(path, errno.EROFS, f"{path}: the mount is "
                                                              "read-only", ctx.pid)
            if parent_inode == I.META:  # an existing key never reaches create: unknown key
                raise self.refusals.refuse(path, errno.ENOENT, f"{path}: unknown meta key; "
                                           f"expected one of {', '.join(I.META_INODES)}",
                                           ctx.pid)
        if self.readonly:
            raise refuse(errno.EROFS, "the mount is read-only")
        if parent_inode != I.NEW:
            where = {I.EVENTS: "events/", I.ROOT: "/"}.get(parent_inode, "")
            raise refuse(errno.EROFS if parent_inode == I.EVENTS else errno.EPERM,
                         f"cannot create {where}{name.decode('utf-8', 'replace')}: "
                         "append by creating new/<next event number>")
        self._need_rule(f"new/{name.decode('utf-8', 'replace')}", ctx)
        r = self.queue.reserve(name, ctx.pid)
        fh = self._new_fh(r)
        r.writer = Writer(ctx.pid)
        attrs = await self._attrs_of(I.staging_inode(fh))
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), attrs

    @guarded
    async def write(self, fh, off, buf, ctx=None):
        h = self._handles.get(fh)
        if isinstance(h, Reservation):
            if h.check is not None:
                await h.judged.wait()  # a close of its writer's table is being judged
            if h.state != "open":
                path = f"new/{h.name}"
                raise self.refusals.refuse(path, errno.EBADF, f"{path}: write of {len(buf)} "
                                           f"bytes at {off} after the file was {h.state}; "
                                           "nothing of it is saved",
                                           None if ctx is None else ctx.pid)
            if ctx is not None:
                h.writer.saw(ctx)
            try:
                return h.staging.write(off, buf)
            except (OSError, BookError) as e:
                h.poison(getattr(e, "errno", None) or errno.EIO)
                raise
        if isinstance(h, _MetaWriteHandle):
            if ctx is not None:
                h.writer.saw(ctx)
            try:
                n = h.staging.write(off, buf)
            except (OSError, BookError) as e:
                h.poisoned = h.poisoned or getattr(e, "errno", None) or errno.EIO
                raise
            h.dirty = True
            return n
        raise pyfuse3.FUSEError(errno.EBADF)

    @guarded
    async def flush(self, fh, ctx=None):
        if self.readonly:
            # nothing commits on a read-only mount; ENOSYS makes the kernel stop sending
            # FLUSH on every close
            raise pyfuse3.FUSEError(errno.ENOSYS)
        h = self._handles.get(fh)
        if isinstance(h, Reservation):
            await self._flush_reservation(h, fh, ctx)
        elif isinstance(h, _MetaWriteHandle):
            await self._flush_meta(h, fh, ctx)

    async def _flush_reservation(self, h: Reservation, fh: int, ctx) -> None:
        """The commit rule for ``new/<N>``: a copy's close returns at once; the writer's
        last close commits and returns the outcome; a killed writer, or a close that
        cannot be judged, fails the append with nothing committed.  The writer's closes
        are probed on the commit thread, in the hand-off of the save itself."""
        if h.state == "failed":
            raise pyfuse3.FUSEError(h.error)
        writer = h.writer
        known = None if ctx is None else writer.closing(ctx)
        if known is False or h.state == "done":
            return  # a copy's close (another table): commits nothing, waits for nothing
        check = None
        if h.state == "open" and known is None and self.mountpoint:
            # the writer's table is not known yet: another thread closes (the writer's,
            # or a forked child's).  Judged before anything is frozen, since a child's
            # close must not stop the writer's writes.
            verdict, why = await self._closing(writer, I.staging_inode(fh), ctx)
            if verdict == closer.COPY:
                return
            if verdict != closer.UNKNOWN and not writer.table:
                writer.table = ctx.lock_owner  # a thread of the writer: its table now
            if verdict == closer.HELD:
                if h.poisoned:
                    raise pyfuse3.FUSEError(h.poisoned)
                return
            if verdict in (closer.KILLED, closer.UNKNOWN):
                if h.state == "open":
                    self.queue.abandon(h, why, errno.EIO)  # noted in the refusals
                raise pyfuse3.FUSEError(errno.EIO)
        elif h.state == "open" and ctx is not None and self.mountpoint and not SKIP_PROBE:
            check = functools.partial(self._judge_close, ctx.pid, writer,
                                      I.staging_inode(fh), known)
        if h.state == "failed":
            raise pyfuse3.FUSEError(h.error)
        if not await self.queue.commit(h, check) and h.poisoned:
            raise pyfuse3.FUSEError(h.poisoned)  # a dup's close: its write failed

    def _judge_close(self, tid: int, writer: Writer, inode: int, known,
                     scans: dict) -> object:
        """The commit queue's check of a writer's close (on the commit thread; ``scans``
        shared by one batch): None to commit, ``HOLD`` if it was not the last close,
        ``(EIO, why)`` to fail."""
        verdict, why = closer.probe(tid, writer, inode, self.mounts, known, scans)
        if verdict == closer.LAST:
            return None
        if verdict in (closer.HELD, closer.COPY):
            return HOLD
        return errno.EIO, why

    async def _flush_meta(self, h: _MetaWriteHandle, fh: int, ctx) -> None:
        """The commit rule for ``meta/<key>`` (as for ``new/``): the writer's last close
        saves a changed field; a copy's or a dup's close saves nothing."""
        if not h.dirty and not h.poisoned:
            return
        path = f"meta/{h.key}"
        pid = h.writer.thread
        verdict, why = await self._closing(h.writer, I.META_INODES[h.key], ctx)
        size = META_FIELDS[h.key][1]
        if verdict == closer.COPY or (verdict == closer.HELD and not h.poisoned
                                      and len(h.staging) != size):
            return  # a copy's close, or a dup's before the field is whole
        # a dup's close of a whole field saves it: every open of a key shares its inode,
        # so a second open in the writer's table looks like a dup, and its close must
        # not be left unsaved
        h.dirty = False
        if verdict in (closer.KILLED, closer.UNKNOWN):
            h.poisoned = 0
            raise self.refusals.refuse(path, errno.EIO, f"{path}: not saved: {why}", pid)
        if h.poisoned:
            err, h.poisoned = h.poisoned, 0
            raise self.refusals.refuse(path, err, f"{path}: not saved, because a write to it "
                                       "failed", pid)
        value = h.staging.getvalue()
        if len(value) != size:
            raise self.refusals.refuse(path, errno.EINVAL, f"{path}: {len(value)} bytes "
                                       f"written, expected exactly {size}; the field is "
                                       "unchanged", pid)
        await trio.to_thread.run_sync(self.book.save_meta, h.key, value)

    @guarded
    async def release(self, fh, ctx=None):
        h = self._handles.pop(fh, None)
        if isinstance(h, Reservation):
            try:
                if h.state in ("open", "ready"):
                    # no close of the writer committed it (its last holder was a copy, or
                    # the writer's last close came while a dup was open elsewhere): nobody
                    # was told it was saved, so nothing is
                    self.queue.abandon(h, "its last descriptor was closed by a process "
                                          "other than its writer")
            finally:
                h.staging.close()
        elif isinstance(h, _MetaWriteHandle):
            if h.dirty:
                log.warning("meta/%s: not saved: its last descriptor was closed by a "
                            "process other than its writer", h.key)
            h.staging.close()

    @guarded
    async def fsync(self, fh, datasync):
        return None  # committed events are already durable; new/ commits on close

    # --- refusals ------------------------------------------------------------------------

    def _refuse_change(self, parent_inode, name, what: str):
        where = "events/" if parent_inode == I.EVENTS else ""
        name = name.decode("utf-8", "replace")
        if self.readonly:
            raise refuse(errno.EROFS, f"cannot {what} {where}{name}: the mount is read-only")
        raise refuse(errno.EPERM, f"cannot {what} {where}{name!r}: the log is append-only")

    @guarded
    async def unlink(self, parent_inode, name, ctx):
        self._refuse_change(parent_inode, name, "unlink")

    @guarded
    async def rmdir(self, parent_inode, name, ctx):
        self._refuse_change(parent_inode, name, "remove")

    @guarded
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._refuse_change(parent_inode_old, name_old, "rename")

    @guarded
    async def mkdir(self, parent_inode, name, mode, ctx):
        self._refuse_change(parent_inode, name, "mkdir")

    @guarded
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        self._refuse_change(parent_inode, name, "mknod")

    @guarded
    async def symlink(self, parent_inode, name, target, ctx):
        self._refuse_change(parent_inode, name, "symlink")

    @guarded
    async def link(self, inode, new_parent_inode, new_name, ctx):
        self._refuse_change(new_parent_inode, new_name, "link")

    @guarded
    async def getxattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel stops asking

    @guarded
    async def listxattr(self, inode, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def setxattr(self, inode, name, value, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def removexattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @guarded
    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (self.book.log_bytes + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = self.book.count + 16
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s


_ROOT_ENTRIES = [(b"events", I.EVENTS), (b"meta", I.META), (b"new", I.NEW), (b"info", I.INFO)]

assert set(META_KEYS) == set(I.META_INODES)
