"""What the log formats share, written once.

``LogMixin`` gives any ``EventLog`` (``eventlog.py``) the members derived from its
``gulf``/``read``/``read_meta``: ``first``, ``last``, ``meta``, ``walk`` and the context
manager.  ``SingleFileLog`` is the engine base of the two Book layouts (``book.py``, the
UIP's; ``vere.py``, vere's): one log file plus ``meta.bin``, opened the same way (the
directory, the writer lock, the files), an offset index, the published view readers see,
what an open does with bytes past the valid prefix (cut a torn tail, else quarantine
first), the meta fields, vectored writes and closing.  Each layout adds its header, its
deeds' checks, its recovery rule and its commit.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator

from bookfs.errors import (
    BadMetaFile,
    BadMetaKey,
    BadMetaSize,
    BookError,
    CorruptDeed,
    MetaAbsent,
    NoSuchEvent,
    PathEscape,
    PayloadError,
    PayloadTooLarge,
    ReadOnly,
)
from bookfs.formats import quarantine
from bookfs.formats.committed import CommittedReads
from bookfs.formats.deeds import BadDeed, Deeds
from bookfs.formats.fileio import create_files, open_regular
from bookfs.formats.index import OffsetIndex
from bookfs.formats.layout import (
    LOG_NAME,
    MAX_PAYLOAD,
    META_FIELDS,
    META_NAME,
    META_SIZE,
    MIN_PAYLOAD,
)
from bookfs.formats.lock import WriterLock, lock_path_for
from bookfs.formats.mark import MarkReader, MarkWriter
from bookfs.formats.seals import Seal, SealBroken, read_sealed
from bookfs.types import EventNum

log = logging.getLogger(__name__)


def contained(directory: str, name: str) -> str:
    """``directory/name``, refusing a path that resolves outside ``directory`` (a
    ``book.log`` symlinked elsewhere, say) with :class:`PathEscape`."""
    path = os.path.join(directory, name)
    try:
        if os.sep not in name and not stat.S_ISLNK(os.lstat(path).st_mode):
            return path  # a plain name that is no symlink is in ``directory`` itself
    except FileNotFoundError:
        return path  # not there (yet): whatever creates it creates it here
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(directory):
        raise PathEscape(f"{path}: resolves to {real}, outside {directory}; refusing it")
    return path


def _open_meta(meta_path: str, flags: int, writable: bool, follow: bool) -> int | None:
    """Open ``meta.bin`` (through :func:`open_regular`).  When it is missing, a writable
    open creates it zero-filled (256 bytes, durably), as vere's reference does; a
    read-only open changes nothing and returns ``None``: the events are served and the
    meta reads as absent (:class:`MetaAbsent`)."""
    try:
        return open_regular(meta_path, flags, follow=follow)
    except FileNotFoundError:
        if not writable:
            return None
    create_files(os.path.dirname(meta_path) or ".", [(meta_path, bytes(META_SIZE))])
    return open_regular(meta_path, flags, follow=follow)


class LogMixin:
    """Members every ``EventLog`` derives from ``gulf``, ``read`` and ``read_meta``."""

    @property
    def first(self) -> EventNum:
        return self.gulf()[0]

    @property
    def last(self) -> EventNum:
        return self.gulf()[1]

    def meta(self) -> dict[str, bytes]:
        return {k: self.read_meta(k) for k in META_FIELDS}

    def chain_confirmed(self, event: int) -> bool:
        """True when reading ``event`` by number walks no chain of deeds first (only a UIP
        Book opened from a persisted index has one to walk: ``Book.confirm_to``)."""
        return True

    def confirm_to(self, event: int, ahead: bool = True) -> None:
        """Do now what a read of ``event`` by number would do first (``Book.confirm_to``);
        nothing for a log whose index is built from the log itself."""

    def prefetch(self, event: int) -> None:
        """A hint that ``event`` will be read soon: start bringing its bytes into the page
        cache and return at once.  Nothing here, for a log that cannot say where an
        event's bytes lie (LMDB maps its file; the kernel pages it in)."""

    def seal(self, event: int, *, fresh: bool = False) -> Seal | None:
        """``verify_event``, and ``event``'s seal where its format makes one (a UIP deed
        of ``seals.SEALED_FROM`` bytes or more: ``Book.seal``); None here."""
        self.verify_event(event)
        return None

    def read_sealed(self, event: int, seal: Seal, offset: int, size: int) -> bytes:
        """``read_slice`` of a deed :meth:`seal` sealed (a format that seals: one file of
        deeds), each block read checked against the seal: :class:`SealBroken` if one
        fails or the index no longer puts the deed where the seal does."""
        if self._locate(event) != (seal.off, seal.n):
            raise SealBroken(f"{self.log_path}: event {event} moved since it was sealed")
        return read_sealed(self._fd, seal, offset, size, self.DEEDS)

    def walk(self, start: int | None = None, end: int | None = None
             ) -> Iterator[tuple[EventNum, bytes]]:
        """``(event, payload)`` for ``start..end`` inclusive (defaults: the whole log),
        each checked as ``read`` checks it.  A bound outside the log raises
        ``NoSuchEvent`` before anything is yielded."""
        first, last = self.gulf()
        if start is None and end is None and not self.count:
            return  # walking an empty log yields nothing
        start = first if start is None else start
        end = last if end is None else end
        if start > end:
            return
        for bound in (start, end):
            if bound not in self:
                raise NoSuchEvent(f"{self.directory}: no event {bound} "
                                  f"(the log holds {first}..{last})")
        for event in range(start, end + 1):
            yield EventNum(event), self.read(event)

    def _walk_range(self, start: int | None, end: int | None, check
                    ) -> tuple[int, int] | None:
        """The inclusive range a walk of ``start..end`` covers (``None``: the log's own
        bound), after ``check(start)`` and ``check(end)`` (each raises for an event the log
        does not hold); ``None`` when it covers nothing: the log is empty, or
        ``start > end``."""
        first, last = self.gulf()
        if not self.count:
            return None
        start = first if start is None else start
        end = last if end is None else end
        if start > end:
            return None
        check(start)
        check(end)
        return start, end

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PublishedView(LogMixin):
    """State answered from ``_view``, a tuple starting ``(first, count, ...)`` that the
    log replaces with one atomic assignment whenever it changes, so a reader in another
    thread (the FUSE event loop while a save runs in a worker) never sees it half-updated."""

    _view: tuple = (0, 0)

    def gulf(self) -> tuple[EventNum, EventNum]:
        """``(first, last)`` committed event numbers; ``(0, 0)`` when the log is empty."""
        first, count = self._view[0], self._view[1]
        if not count:
            return EventNum(0), EventNum(0)
        return EventNum(first), EventNum(first + count - 1)

    @property
    def count(self) -> int:
        return self._view[1]

    def __contains__(self, event: int) -> bool:
        return 0 <= event - self._view[0] < self._view[1]


class SingleFileLog(CommittedReads, PublishedView):
    """The engine base of a one-file Book log.  Subclasses set ``DEEDS`` (their
    layout's deed, ``deeds.py``) and ``WHAT``, keep ``_index`` and ``recovery`` (a
    :class:`~bookfs.formats.reports.RecoveryReport`), call ``_publish_view`` after the
    index grows, and say what a torn tail is (``_is_torn_tail``)."""

    DEEDS: Deeds
    #: the kind of log a missing ``book.log`` was expected to be (error messages)
    WHAT: str
    #: what the bytes past the valid prefix are not, and what quarantined ones do (logs)
    _NOT_VALID = "valid deeds"
    _QUARANTINED = "do not continue the log"

    def __init__(self, directory: str, log_name: str, meta_name: str, fd: int,
                 meta_fd: int | None, writable: bool, lock):
        self.directory = directory
        self.log_path = os.path.join(directory, log_name)
        self.meta_path = os.path.join(directory, meta_name)
        self.writable = writable
        self._fd = fd
        self._meta_fd = meta_fd
        self._lock = lock
        self._index = OffsetIndex()
        self._view = (0, 0, 0)  # (first, count, end of the last deed, ...)
        #: Grows whenever published events may have changed (see ``eventlog.py``).
        self.generation = 0
        self._retired_fds: list[int] = []
        # the commit mark (``mark.py``): a writer's to publish, a reader's to obey
        self._mark: MarkWriter | None = None
        self._init_reads(None if writable else MarkReader(directory))

    @classmethod
    def _open_directory(cls, path: str | os.PathLike, writable: bool, create: bool,
                        lock: bool, initial_log, load):
        """``open``'s steps, the same for both layouts: refuse ``create`` without
        ``writable``; make the directory (``create``) or refuse a missing one; refuse a
        ``book.log`` or ``meta.bin`` resolving outside it (:func:`contained`); take the
        writer lock :func:`bookfs.formats.lock.lock_path_for` names (writable, unless
        ``lock`` is False); create missing files (``create``: ``initial_log(directory)``,
        called before the lock is taken, gives a new log's bytes); open the files; check
        ``meta.bin``'s size; then ``load(log)``.  Anything failing releases what was
        taken (the lock, the files) before it propagates."""
        directory = os.fspath(path)
        if create and not writable:
            raise ValueError("create=True needs writable=True")
        if not os.path.isdir(directory):
            if create:
                os.makedirs(directory, exist_ok=True)
            else:
                raise BookError(f"{directory}: not a directory holding {LOG_NAME}")
        log_path = contained(directory, LOG_NAME)
        meta_path = contained(directory, META_NAME)
        initial = initial_log(directory) if create else b""
        held = WriterLock(lock_path_for(directory)) if writable and lock else None
        try:
            if create:
                create_files(directory, [(log_path, initial), (meta_path, bytes(META_SIZE))])
            fd, meta_fd = cls._open_files(log_path, meta_path, writable, cls.WHAT)
            opened = cls(directory, fd, meta_fd, writable, held)
        except BaseException:
            if held:
                held.release()
            raise
        try:
            opened._check_meta_file()
            load(opened)
            if writable:
                opened._mark = MarkWriter.claim(directory, opened._fd, opened.log_bytes,
                                                opened._mark_last())
        except BaseException:
            opened.close(save=False)
            raise
        return opened

    @staticmethod
    def _open_files(log_path: str, meta_path: str, writable: bool,
                    what: str) -> tuple[int, int | None]:
        """Open the log and ``meta.bin`` (read-write or read-only) through
        :func:`bookfs.formats.fileio.open_regular`: a missing log is a :class:`BookError` saying
        what was expected (``what``: the kind of log); a FIFO, socket, device or directory
        is a :class:`NotRegularFile`, never a hang.  A read-only open may follow a symlink
        the caller checked with :func:`contained`; a writable open never follows one.  A
        missing ``meta.bin`` is handled by :func:`_open_meta`."""
        flags = os.O_RDWR if writable else os.O_RDONLY
        follow = not writable
        try:
            fd = open_regular(log_path, flags, follow=follow)
        except FileNotFoundError:
            raise BookError(f"{log_path}: no such file (expected {what})") from None
        try:
            meta_fd = _open_meta(meta_path, flags, writable, follow)
        except BaseException:
            os.close(fd)
            raise
        return fd, meta_fd

    def _reopen_if_replaced(self) -> bool:
        """For a read-only follower: if ``log_path`` now names another file than the one
        open (a rename over it), open the new ``book.log`` and ``meta.bin`` in place of the
        old ones and return True; the caller then rebuilds its view.  A writer never
        reopens (its lock guards the file it has).  A path that is missing or not a
        regular file right now is left for a later look."""
        if self.writable:
            return False
        try:
            st = os.stat(self.log_path)
        except OSError:
            return False
        mine = os.fstat(self._fd)
        if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
            return False
        try:
            fd, meta_fd = self._open_files(self.log_path, self.meta_path, False, "a log")
        except (OSError, BookError):
            return False
        # The old descriptors stay open until close(): a read in another thread may still
        # be using them, and a closed number could be reused for an unrelated file.
        self._retired_fds += [f for f in (self._fd, self._meta_fd) if f is not None]
        self._fd, self._meta_fd = fd, meta_fd
        return True

    def _publish_view(self, end: int, *extra) -> None:
        ix = self._index
        self._view = (ix.first, ix.count, end, *extra)

    # --- the commit mark (mark.py; what readers obey: committed.py) -----------------------

    def _mark_last(self) -> int:
        """The last committed event, as the mark states it."""
        return self.last

    def _publish_mark(self) -> None:
        """A writer's save returned: tell readers in other processes (``mark.py``)."""
        if self._mark is not None:
            self._mark.publish(self._view[2], self._mark_last())

    def _header_witness(self) -> bytes:
        """The header bytes a reader's durability proof must have seen (a format that
        rewrites its header in place says which; the UIP's header never changes once
        ``fir_d`` is set, and a change is a rewrite that ``refresh`` catches)."""
        return b""

    def _sync_fd(self) -> int:
        return self._fd

    def identity(self) -> tuple:
        """A token naming this log as it is published now, for :meth:`continues`: its
        file (device, inode), ctime, published end, and the bytes that end it (a fleet
        keeps it while the log is closed)."""
        st = os.fstat(self._fd)
        end = self._view[2]
        return (st.st_dev, st.st_ino, st.st_ctime_ns, end, self._end_witness(end))

    def continues(self, token: tuple) -> bool:
        """Whether this log is the one ``token`` (:meth:`identity`) named, unchanged or
        grown by appends: the same file, and either untouched since (ctime) or still
        holding the bytes that ended it then.  False for anything else (a rename over
        it, a rewrite in place, a cut): every cached byte or size of it is stale."""
        dev, ino, ctime, end, witness = token
        st = os.fstat(self._fd)
        if (st.st_dev, st.st_ino) != (dev, ino):
            return False
        if st.st_ctime_ns == ctime:
            return True
        # written since: an append grew it and left what ended it; the same size with a
        # moved ctime is a rewrite in place (a rewrite that also grew and kept the end
        # bytes cannot be told without reading it all: committed.py's stamp rules)
        return self._view[2] > end and self._end_witness(end) == witness

    def _end_witness(self, end: int) -> bytes:
        """The header and the 16 bytes before ``end`` (a deed's last fields)."""
        return os.pread(self._fd, 16, 0) + os.pread(self._fd, 16, max(0, end - 16))

    def watch_paths(self) -> list[tuple[str, bool]]:
        """What a follower watches (inotify) to hear of a commit at once: ``(path,
        is_directory)`` for the log, its directory (a rename over the log) and the commit
        mark with its directory (where a writer publishes, and creates it)."""
        paths = [(self.log_path, False), (self.directory, True)]
        if self._marks is not None:
            paths += [(self._marks.path, False), (os.path.dirname(self._marks.path), True)]
        return paths

    # --- recovery on open ----------------------------------------------------------------

    def _is_torn_tail(self, off: int, size: int) -> bool:
        """Whether ``[off, size)`` can only be an incomplete final deed (the layout's rule)."""
        raise NotImplementedError

    def _handle_bad_region(self, off: int, size: int, *, claimed: bool = False) -> None:
        """Bytes ``[off, size)`` past the valid prefix (``recovery.py``'s rules).  A
        read-only open records them as ``bad_region`` and changes nothing.  A writable open
        cuts them: at once when they are a torn tail, else after copying them to a
        quarantine file beside the log.  ``claimed``: a valid header slot says events there
        were committed (vere: a batch that failed its check), so however short they are
        they are evidence, never a torn tail: a flipped ``len_d`` can make a whole deed
        look incomplete."""
        report = self.recovery
        if not self.writable:
            report.bad_region = (off, size - off)
            log.warning("%s: %d bytes at offset %d are not %s; a writable open "
                        "would recover them (read-only: left untouched)",
                        self.log_path, size - off, off, self._NOT_VALID)
            return
        if not claimed and self._is_torn_tail(off, size):
            report.torn_tail = (off, size - off)
            log.warning("%s: cut a torn final deed of %d bytes at offset %d",
                        self.log_path, size - off, off)
        else:
            qpath = quarantine.quarantine(self.directory, self._fd, off, size)
            report.quarantined.append((qpath, off, size - off))
            log.warning("%s: %d bytes at offset %d %s; copied to %s "
                        "before cutting them (try `bookfs fsck --salvage`)",
                        self.log_path, size - off, off, self._QUARANTINED, qpath)
        os.ftruncate(self._fd, off)
        os.fsync(self._fd)

    # --- state ---------------------------------------------------------------------------

    @property
    def log_bytes(self) -> int:
        """Bytes of the valid log (headers and committed deeds)."""
        return self._view[2]

    @property
    def index(self) -> OffsetIndex:
        return self._index

    def _locate(self, event: int) -> tuple[int, int]:
        """``(offset, payload size)`` of ``event``'s deed, from the index alone."""
        first, count, end = self._view[0], self._view[1], self._view[2]
        i = event - first
        if i < 0 or i >= count:
            lo, hi = self.gulf()
            raise NoSuchEvent(f"{self.log_path}: no event {event} (the log holds {lo}..{hi})")
        offsets = self._index.offsets
        off = offsets[i]
        nxt = offsets[i + 1] if i + 1 < count else end
        return off, self.DEEDS.payload_size(off, nxt)

    def payload_size(self, event: int) -> int:
        """Bytes of ``event``'s payload (mug + jam), from the index alone."""
        return self._locate(event)[1]

    def prefetch(self, event: int) -> None:
        """Ask the kernel to start reading ``event``'s deed into the page cache and return
        at once (``POSIX_FADV_WILLNEED``: ``mm/fadvise.c``, ``generic_fadvise()``, calls
        ``force_page_cache_readahead()``, whose ``read_pages()`` in ``mm/readahead.c``
        submits the reads and does not wait for them).  The index's offset is used as it
        stands: a hint reads nothing into the process and checks nothing, so a wrong
        offset costs only a useless read.  Never raises: a hint must not fail the
        request that gives it (an index replaced meanwhile, a closed log)."""
        try:
            off, n = self._locate(event)
            os.posix_fadvise(self._fd, off, self.DEEDS.size(n), os.POSIX_FADV_WILLNEED)
        except (OSError, LookupError, ValueError, BookError):
            pass

    def payload_bounds(self, event: int, n: int):
        """The offsets where the deeds of ``event .. event + n - 1`` start and where the
        last one ends (``n + 1`` of them, an ``array('Q')``): each payload's size is the
        difference less ``DEEDS.overhead``.  For a listing's batch, from the index alone."""
        first, count, end = self._view[0], self._view[1], self._view[2]
        i = event - first
        if i < 0 or n < 1 or i + n > count:
            lo, hi = self.gulf()
            raise NoSuchEvent(f"{self.log_path}: no events {event}..{event + n - 1} (the "
                              f"log holds {lo}..{hi})")
        out = self._index.offsets[i : i + n]
        out.append(self._index.offsets[i + n] if i + n < count else end)
        return out

    def mtime_ns(self, event: int) -> int:
        """When ``event`` arrived, as far as the index knows (see ``index.py``)."""
        return self._index.mtime_ns(event)

    def _confirm_offset(self, event: int, i: int) -> bool:
        """Hook: make sure ``offsets[i]`` really is where event ``event`` starts (an index
        loaded from a cache is only a hint); True when the index had to be rebuilt (the
        caller locates ``event`` again).  The formats whose index is always built from
        the log itself need nothing here."""
        return False

    def _check_len(self, event: int, off: int, n: int) -> None:
        """The deed at ``off`` must announce the ``n`` payload bytes the index gives it."""
        try:
            self.DEEDS.check_len(self._fd, off, n)
        except BadDeed as e:
            self._corrupt(event, off, e.what, e.detail)

    def _corrupt(self, event: int, off: int, what: str = "CRC", detail: str = ""):
        """Log and raise :class:`CorruptDeed`: ``event``'s deed at ``off`` fails ``what``."""
        msg = f"{self.log_path}: event {event} at offset {off} fails its {what} check"
        if detail:
            msg += f": {detail}"
        log.error("%s", msg)
        raise CorruptDeed(msg, event=event, offset=off)

    def read_slice(self, event: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of ``event``'s payload from ``offset``.  Only the framing is
        checked here (the deed's ``len_d`` equals the indexed size, so the index cannot
        send a read into another deed); the caller must have called ``verify_event`` for
        the payload check (the FUSE layer does so on open).  :class:`CorruptDeed` if the
        framing does not hold."""
        off, n = self._locate(event)
        if self._confirm_offset(event, event - self._view[0]):
            off, n = self._locate(event)  # the index was rebuilt
        self._check_len(event, off, n)
        if offset >= n:
            return b""
        return self.DEEDS.payload_at(self._fd, off, min(size, n - offset), offset)

    def read_payloads_unchecked(self, first: int, last: int) -> list[memoryview]:
        """The payloads of ``first..last`` as views into one ``pread`` of their byte range,
        **unchecked** (no CRC, no framing check): for a caller that compares them with
        known bytes, as ``migrate`` does after writing."""
        start, _ = self._locate(first)
        end_off, n = self._locate(last)
        buf = memoryview(os.pread(self._fd, end_off + self.DEEDS.size(n) - start, start))
        offsets = self._index.offsets
        i0 = first - self._view[0]
        out = []
        for k in range(last - first + 1):
            a = offsets[i0 + k] - start
            b = (offsets[i0 + k + 1] - start if first + k < last else len(buf))
            out.append(buf[a + 8 : b - self.DEEDS.tail])
        return out

    def fileno(self) -> int:
        return self._fd

    # --- writing and meta ----------------------------------------------------------------

    def _require_writable(self) -> None:
        if not self.writable:
            raise ReadOnly(f"{self.log_path}: opened read-only")

    def _checked_payloads(self, first_event: int, payloads) -> list:
        """``payloads`` as a list, after refusing a read-only log (:class:`ReadOnly`), a
        payload under 4 bytes (:class:`PayloadError`) or over 2^32 (:class:`PayloadTooLarge`);
        nothing has been written when these raise."""
        self._require_writable()
        payloads = payloads if isinstance(payloads, list) else list(payloads)
        for k, p in enumerate(payloads):
            n = len(p)
            if n < MIN_PAYLOAD:
                raise PayloadError(f"event {first_event + k}: {n} bytes, expected at least "
                                   f"{MIN_PAYLOAD} (a 4-byte mug, then the jam)")
            if n > MAX_PAYLOAD:
                raise PayloadTooLarge(f"event {first_event + k}: {n} bytes, over the "
                                      f"{MAX_PAYLOAD}-byte limit")
        return payloads

    @property
    def has_meta(self) -> bool:
        """False when ``meta.bin`` is missing (a read-only open of such a directory)."""
        return self._meta_fd is not None

    def _check_meta_file(self) -> None:
        if self._meta_fd is None:
            return
        size = os.fstat(self._meta_fd).st_size
        if size != META_SIZE:
            raise BadMetaFile(f"{self.meta_path}: {size} bytes, expected exactly {META_SIZE}")

    def _meta_field(self, key: str) -> tuple[int, int]:
        try:
            return META_FIELDS[key]
        except KeyError:
            raise BadMetaKey(f"{self.meta_path}: unknown meta key {key!r}, expected one of "
                             f"{', '.join(META_FIELDS)}") from None

    def read_meta(self, key: str) -> bytes:
        """The raw bytes of meta field ``key`` (version, who, fake, life), as stored."""
        off, size = self._meta_field(key)
        if self._meta_fd is None:
            raise MetaAbsent(f"{self.meta_path}: no such file (the log was opened read-only "
                             "without its meta.bin; a writable open creates it zero-filled)")
        return os.pread(self._meta_fd, size, off)

    def save_meta(self, key: str, value: bytes) -> None:
        """Write meta field ``key`` (exactly its size, raw bytes) and fsync."""
        self._require_writable()
        off, size = self._meta_field(key)
        if len(value) != size:
            raise BadMetaSize(f"{self.meta_path}: meta {key!r} takes exactly {size} bytes, "
                              f"got {len(value)}")
        os.pwrite(self._meta_fd, bytes(value), off)
        os.fsync(self._meta_fd)

    # --- closing -------------------------------------------------------------------------

    def _close_files(self) -> None:
        """Close the files and release the lock (idempotent)."""
        if self._mark is not None:
            self._mark.release()
        if self._marks is not None:
            self._marks.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._meta_fd is not None:
            os.close(self._meta_fd)
            self._meta_fd = None
        retired, self._retired_fds = self._retired_fds, []
        for f in retired:
            os.close(f)
        if self._lock is not None:
            self._lock.release()
            self._lock = None
