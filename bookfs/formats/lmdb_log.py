"""Read-only access to an LMDB epoch: the event store every running ship has today.

An LMDB epoch is a directory (``<pier>/.urb/log/0i<N>/``, ``epoc.txt`` 1 or 2, or 3 as
vere's ``ml/bob`` writes it, with ram events and the tables ``BLOBS`` and ``LEASES``
besides) holding ``data.mdb`` and ``lock.mdb`` (``reference-formats.md`` §3)::

    database EVENTS (MDB_INTEGERKEY): key = event number as 8 bytes LE -> mug ++ jam
    database META:                    key = b"version" | b"who" | b"fake" | b"life"

The values of ``EVENTS`` are exactly Book payloads.  The pier's meta lives in a separate
environment at the top of ``.urb/log/`` (only ``META``); an epoch may also carry its own.

Contract
--------
* The environment is opened ``readonly=True, lock=False`` (``MDB_NOLOCK``): no file is
  created or changed, not even ``lock.mdb``, and this reader is in no reader table.
  **Why not join the reader table.**  vere >= 4.3 builds LMDB from its master line
  (urbit/vere ``a5e42df``, "build: bump lmdb from 0.9.29 to master": ``ext/lmdb/
  build.zig.zon`` pins LMDB ``40d3741``), whose lock region has format version 2
  (``mdb.c``: ``MDB_LOCK_VERSION 2``, since LMDB ``58ba039``), while the binding's engine
  for data format 1 is LMDB 0.9 (``MDB_LOCK_VERSION 1``).  ``mdb_env_setup_locks()``
  refuses a region of another format with ``MDB_VERSION_MISMATCH``, and whoever opens the
  lock file first *re-initialises* it in its own format: a reader that joined while no
  ship ran would make the ship's next start fail.  A read-only mount must never do that.
* **A read outside the reader table never returns a recycled page's bytes**, and a map
  a writer grew is adopted (``MDB_MAP_RESIZED``): ``lmdb_snapshots.py`` says how, with
  LMDB's source.  Every read copies what it keeps out of its transaction and is checked
  after; walks check every 256 events.  ``iter_buffers`` hands out the map's own bytes,
  so it is for an epoch no writer changes (``migrate`` holds the pier's lock).
* **What is committed** (``committed.py``): a transaction is visible in the map once its
  meta page is written; vere opens its environments with no sync flags
  (``pkg/vere/db/lmdb.c``, ``u3_lmdb_init()``: ``mdb_env_open(env_u, pax_c, 0, 0664)``),
  so its data pages are ``fdatasync``'d before the meta page is written (``O_DSYNC``),
  and it acknowledges a batch only after that commit returned.  This reader publishes a
  new transaction once its own ``fdatasync`` of ``data.mdb`` covered it (the meta page
  as well), so a power cut cannot take back what it served.
* **Replaced or rewritten.**  A ``data.mdb`` renamed over (another inode at the path), one
  whose newest transaction went back, or whose ctime moved with nothing committed, is
  another store: the environment is opened again and ``generation`` grows.
* ``EVENTS`` is opened with ``integerkey=True``.  LMDB keeps the flag in the database, so a
  store written without ``MDB_INTEGERKEY`` sorts its keys as bytes; that is detected (by the
  flag and by the contiguity check) and refused, never read in the wrong order.
* On open (and on ``refresh``) the keys must be contiguous: ``entries == last - first + 1``
  and, for a directory named ``0i<N>``, ``first == N + 1``.  Otherwise
  :class:`ContiguityError`.
* ``read`` returns the value bytes: LMDB has its own integrity (no CRC per event), so
  ``verify_event`` only checks the event exists.  ``payload_size`` comes from the value's
  length without copying it; ``mtime_ns`` is ``data.mdb``'s mtime for every event.
* ``save``/``save_meta`` raise :class:`ReadOnly`: migrate the epoch with ``bookfs migrate``.

Note: the ``lmdb`` binding refuses to open one environment twice in one process; opening
an epoch that is already open raises :class:`BookError` saying so.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable, Iterator

from bookfs.formats.committed import CommittedReads
from bookfs.formats.lmdb_snapshots import Snapshots
from bookfs.formats.logbase import PublishedView
from bookfs.errors import (
    BadMetaKey,
    BadMetaSize,
    BookError,
    ContiguityError,
    FormatError,
    NoSuchEvent,
    ReadOnly,
)
from bookfs.formats.layout import META_FIELDS, epoch_of_directory
from bookfs.types import EventNum

DATA_NAME = "data.mdb"
EVENTS_DB = b"EVENTS"
META_DB = b"META"
KEY = struct.Struct("<Q")  # event number, 8 bytes little-endian (vere's native c3_d)

_READ_ONLY_MSG = "LMDB epochs are read-only; migrate them with bookfs migrate"
_CHUNK = 1 << 20  # values over this are read in slices (LmdbLog.read)
log = logging.getLogger(__name__)


def is_lmdb_dir(directory: str) -> bool:
    """True if ``directory`` holds an LMDB ``data.mdb`` (the cheap test: a file check)."""
    return os.path.isfile(os.path.join(directory, DATA_NAME))


def _open_env(directory: str):
    """Open the LMDB environment in ``directory`` read-only, without its lock file."""
    import lmdb

    path = os.path.join(directory, DATA_NAME)
    if not os.path.isfile(path):
        raise BookError(f"{path}: no such file (expected an LMDB environment)")
    try:
        return lmdb.open(directory, readonly=True, lock=False, max_dbs=2, subdir=True,
                         create=False)
    except lmdb.Error as e:
        raise FormatError(f"{path}: cannot open as LMDB: {e}") from None


def _open_db(env, directory: str, name: bytes, *, integerkey: bool = False):
    """The named database ``name`` of ``env``, or ``None`` if it does not exist."""
    import lmdb

    try:
        return env.open_db(name, integerkey=integerkey, create=False)
    except lmdb.NotFoundError:
        return None
    except lmdb.Error as e:
        raise FormatError(f"{os.path.join(directory, DATA_NAME)}: cannot open database "
                          f"{name.decode()}: {e}") from None


def _events_db(env, directory: str):
    """The ``EVENTS`` database of ``env`` (``MDB_INTEGERKEY``), or ``None`` if it has none;
    :class:`FormatError` if it was created without ``MDB_INTEGERKEY``."""
    db = _open_db(env, directory, EVENTS_DB, integerkey=True)
    if db is not None:
        with env.begin() as txn:
            if not db.flags(txn).get("integerkey"):
                raise FormatError(
                    f"{os.path.join(directory, DATA_NAME)}: EVENTS was not created with "
                    "MDB_INTEGERKEY, so its keys sort as bytes, not as event numbers")
    return db


def event_count(directory: str) -> int:
    """Entries in the ``EVENTS`` database of the LMDB environment in ``directory``; 0 when
    it has none (vere's roll writes ``META`` before the first event creates ``EVENTS``).
    Opened read-only without the lock file: nothing is created or changed.
    :class:`FormatError` when it is not an LMDB environment (or already open here)."""
    env = _open_env(directory)
    try:
        db = _open_db(env, directory, EVENTS_DB)
        if db is None:
            return 0
        with env.begin(db=db) as txn:
            return txn.stat(db)["entries"]
    finally:
        env.close()


def _same_file(a: str, b: str) -> bool:
    """True when paths ``a`` and ``b`` name one file (a hard link); False if either is
    missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _meta_value(path: str, key: str, raw: bytes | None) -> bytes:
    """An LMDB META value in ``meta.bin``'s encoding for ``key`` (zeros when absent).

    The values are the same little-endian integers as ``meta.bin``; a shorter value is
    zero-extended and a longer one is accepted only if the extra bytes are zero."""
    _, size = META_FIELDS[key]
    if raw is None:
        return bytes(size)
    if len(raw) <= size:
        return raw + bytes(size - len(raw))
    if any(raw[size:]):
        raise BadMetaSize(f"{path}: META {key!r} is {len(raw)} bytes, expected {size}")
    return raw[:size]


def read_meta_db(directory: str, env=None) -> dict[str, bytes] | None:
    """The META database of the LMDB environment in ``directory`` as ``meta.bin``-encoded
    fields, or ``None`` if the environment has no META database.  ``env``: an already open
    environment of that directory (the lmdb binding refuses a second open)."""
    own = env is None
    if own:
        env = _open_env(directory)
    try:
        db = _open_db(env, directory, META_DB)
        if db is None:
            return None
        path = os.path.join(directory, DATA_NAME)
        with env.begin(db=db) as txn:
            return {k: _meta_value(path, k, txn.get(k.encode())) for k in META_FIELDS}
    finally:
        if own:
            env.close()


class LmdbLog(CommittedReads, PublishedView):
    """An LMDB epoch, read-only.  Use :meth:`open`; close with :meth:`close` or ``with``."""

    writable = False

    def __init__(self, directory: str, env, events_db, base: int | None,
                 meta: dict[str, bytes] | None, meta_source: str | None):
        self.directory = directory
        self.data_path = self.log_path = os.path.join(directory, DATA_NAME)
        #: grows when the store was replaced or rewritten under us (``eventlog.py``)
        self.generation = 0
        self._snaps = Snapshots(lambda: self._env, self.data_path)
        self._fd = os.open(self.data_path, os.O_RDONLY | os.O_CLOEXEC)  # sync, identity
        self._init_reads(None)  # bookfs never writes LMDB: no commit mark to obey
        self._seen_ctime = os.fstat(self._fd).st_ctime_ns
        self._txnid = 0  # the transaction the published view is of
        self._psize = env.stat()["psize"]
        self._metas_seen = b""  # _metas() when the view was published
        #: ``N`` of ``0i<N>`` (from the directory name), or ``None`` if the name says nothing.
        self.base = base
        self.meta_source = meta_source  # the data.mdb the meta came from, if any
        self._env = env
        self._db = events_db
        self._meta = meta
        self._view = (0, 0)  # (first, count)
        self._mtime_ns = 0
        self._size = 0

    @classmethod
    def open(cls, path: str | os.PathLike, writable: bool = False, *,
             meta_from: str | os.PathLike | None = None,
             metas: dict | None = None) -> "LmdbLog":
        """Open the LMDB epoch in directory ``path`` (read-only).

        ``writable=True`` raises :class:`ReadOnly`.  The meta comes from the META database
        of ``meta_from`` (a directory holding the pier's top-level ``data.mdb``) if given,
        else from the epoch's own environment if it has one, else from the parent directory
        when that is a pier's ``.urb/log`` holding ``data.mdb``; else every field is zero.
        ``metas``: a dict the caller keeps for one open of several epochs, in which the META
        read from ``meta_from`` is kept by path and taken from again (not re-read).
        Raises :class:`ContiguityError` if the keys are not contiguous (or do not start at
        ``N + 1`` for a directory ``0i<N>``), :class:`FormatError` if ``EVENTS`` was not
        created with ``MDB_INTEGERKEY``, or is missing from a directory that is not an
        epoch ``0i<N>``.  An epoch directory without ``EVENTS`` is one vere has just rolled
        to (it writes ``META`` before the first event creates ``EVENTS``): it opens as an
        empty epoch, and :meth:`refresh` picks up ``EVENTS`` once it exists.
        """
        directory = os.fspath(path)
        if writable:
            raise ReadOnly(f"{os.path.join(directory, DATA_NAME)}: {_READ_ONLY_MSG}")
        env = _open_env(directory)
        try:
            db = _events_db(env, directory)
            base = epoch_of_directory(directory)
            if db is None and base is None:
                raise FormatError(f"{os.path.join(directory, DATA_NAME)}: no EVENTS database "
                                  "(not an LMDB epoch)")
            # db None in an epoch directory 0i<N>: just rolled (vere writes the new epoch's
            # META before its first event creates EVENTS): an empty epoch, until it has one
            meta, source = cls._find_meta(directory, env, meta_from, metas)
            self = cls(directory, env, db, base, meta, source)
            self._scan()
        except BaseException:
            env.close()
            raise
        return self

    @staticmethod
    def _find_meta(directory: str, env, meta_from, metas: dict | None = None
                   ) -> tuple[dict[str, bytes] | None, str | None]:
        if meta_from is not None:
            d = os.fspath(meta_from)
            if _same_file(os.path.join(d, DATA_NAME), os.path.join(directory, DATA_NAME)):
                # one environment under two names (vere's migration hard-links the pier's
                # data.mdb into 0i0/, pkg/vere/disk.c _disk_migrate_epoc): the lmdb
                # binding refuses to open it twice, so read it through ``env``
                return read_meta_db(directory, env), os.path.join(d, DATA_NAME)
            if metas is not None and d in metas:
                return metas[d]
            found = read_meta_db(d), os.path.join(d, DATA_NAME)
            if metas is not None:
                metas[d] = found
            return found
        own = read_meta_db(directory, env)
        if own is not None:
            return own, os.path.join(directory, DATA_NAME)
        parent = os.path.dirname(os.path.abspath(directory))
        if (os.path.basename(parent) == "log"
                and os.path.basename(os.path.dirname(parent)) == ".urb"
                and is_lmdb_dir(parent)):
            try:
                return read_meta_db(parent), os.path.join(parent, DATA_NAME)
            except BookError:
                return None, None
        return None, None

    def _scan(self) -> None:
        """Read the first and last keys and the entry count of the newest transaction;
        check they are contiguous; publish them once durable (module docstring)."""
        st = os.fstat(self._fd)
        if self._db is None:  # a just-rolled epoch: has its first event created EVENTS?
            with self._snaps.shared():  # (a handle is opened outside a read's snapshot)
                self._db = _events_db(self._env, self.directory)
        view, txnid = self._read(self._scan_txn)
        if view != self._view and txnid > self._txnid and not self._durable_or_wait(txnid):
            return  # not durable yet: the caller syncs (wants_sync) and looks again
        self._mtime_ns, self._size = st.st_mtime_ns, st.st_size
        self._view, self._txnid = view, max(txnid, self._txnid)
        self._metas_seen = self._metas()

    def _scan_txn(self, txn) -> tuple[int, int]:
        if self._db is None:
            return (0, 0)
        entries = txn.stat(self._db)["entries"]
        cur = txn.cursor(db=self._db)
        if not entries or not cur.first():
            return (0, 0)
        first = KEY.unpack(bytes(cur.key()))[0]
        cur.last()
        last = KEY.unpack(bytes(cur.key()))[0]
        count = last - first + 1
        if count != entries:
            raise ContiguityError(
                f"{self.data_path}: EVENTS holds {entries} entries but its keys run "
                f"{first}..{last} ({count} events): the events are not contiguous")
        if self.base is not None and first != self.base + 1:
            raise ContiguityError(
                f"{self.data_path}: epoch 0i{self.base} must start at event "
                f"{self.base + 1}, but its first event is {first}")
        return (first, count)

    # --- transactions (lmdb_snapshots.py) ------------------------------------------------

    def _newest_txnid(self) -> int:
        return self._snaps.newest()

    def _read(self, use):
        return self._snaps.read(use)

    def _metas(self) -> bytes:
        """The head of the meta page of the published transaction (``MDB_meta`` follows
        a 16-byte page header; transaction T's meta is page ``T & 1``).  A writer writes
        the *other* page when it commits T + 1 (``mdb_env_write_meta()``: ``toggle =
        txnid & 1``), and this one again only when it commits T + 2: so while T is still
        the newest once this page was read, other bytes mean another store was written
        over this one (``refresh`` reads the newest id again after this page for that).
        (A live writer moves the ctime before its commit, writing data pages first: the
        ctime alone says nothing here.)"""
        return os.pread(self._fd, 256, (self._txnid & 1) * self._psize)

    def _sync_fd(self) -> int:
        return self._fd

    def identity(self) -> tuple:
        """A token naming this store as published now (``logbase.SingleFileLog``'s)."""
        st = os.fstat(self._fd)
        return (st.st_dev, st.st_ino, st.st_ctime_ns, self._txnid)

    def continues(self, token: tuple) -> bool:
        """The same file, untouched since (ctime) or with a newer transaction on top."""
        dev, ino, ctime, txnid = token
        st = os.fstat(self._fd)
        return (st.st_dev, st.st_ino) == (dev, ino) and (
            st.st_ctime_ns == ctime or self._txnid >= txnid)

    def watch_paths(self) -> list[tuple[str, bool]]:
        """What a follower watches (inotify): ``data.mdb`` (a writer's meta page write)
        and its directory (a rename over it)."""
        return [(self.data_path, False), (self.directory, True)]

    def _durable_witness(self) -> tuple[int, bytes]:
        """An ``fdatasync`` started now covers the newest transaction (its meta page is
        in the page cache: it was written before it could be read from the map)."""
        return self._newest_txnid(), b""

    # --- state ---------------------------------------------------------------------------

    @property
    def format(self) -> str:
        return f"lmdb (epoc {self.epoc})"

    @property
    def epoc(self) -> int:
        """The epoch format from ``epoc.txt`` (1 or 2; 3 from ``ml/bob``), 1 when the file
        is absent."""
        try:
            with open(os.path.join(self.directory, "epoc.txt"), "rb") as f:
                return int(f.read(16).strip() or b"1")
        except (OSError, ValueError):
            return 1

    @property
    def log_bytes(self) -> int:
        """Size of ``data.mdb`` (LMDB's pages, not just the payloads)."""
        return self._size

    def _check(self, event: int) -> None:
        if event not in self:
            first, last = self.gulf()
            raise NoSuchEvent(f"{self.data_path}: no event {event} "
                              f"(the epoch holds {first}..{last})")

    def _get(self, txn, event: int):
        value = txn.get(KEY.pack(event), db=self._db)
        if value is None:  # the store changed under us (never for a finished epoch)
            raise NoSuchEvent(f"{self.data_path}: event {event} is missing from EVENTS")
        return value

    def _with_value(self, event: int, use):
        """``use(value)`` for ``event``'s value, a buffer into the map that is valid only
        inside the one read transaction this opens (``use`` copies what it keeps; the
        read is checked against recycling: :meth:`_read`)."""
        self._check(event)
        return self._read(lambda txn: use(self._get(txn, event)))[0]

    def payload_size(self, event: int) -> int:
        """Bytes of ``event``'s payload (the value's length; nothing is copied)."""
        return self._with_value(event, len)

    def mtime_ns(self, event: int) -> int:
        """``data.mdb``'s mtime (LMDB keeps no per-event time)."""
        self._check(event)
        return self._mtime_ns

    # --- reading ---------------------------------------------------------------------------

    def read(self, event: int) -> bytes:
        """The payload of ``event`` (mug ++ jam): the value bytes as LMDB stores them.  A
        value over ``_CHUNK`` is read in slices, each in a transaction of its own, so a
        busy writer cannot recycle a snapshot under a long copy again and again (vere
        puts events with ``MDB_NOOVERWRITE``: a key's value is the same in every
        snapshot that has it)."""
        got = self._with_value(event, lambda v: bytes(v) if len(v) <= _CHUNK else len(v))
        if isinstance(got, bytes):
            return got
        return b"".join(self.read_slice(event, off, _CHUNK) for off in range(0, got, _CHUNK))

    def verify_event(self, event: int) -> None:
        """LMDB checks its own pages; this only checks that ``event`` exists."""
        self._with_value(event, len)

    def read_slice(self, event: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of ``event``'s payload from ``offset``."""
        return self._with_value(event, lambda value: bytes(value[offset : offset + size])
                                if offset < len(value) else b"")

    def walk(self, start: int | None = None, end: int | None = None
             ) -> Iterator[tuple[EventNum, bytes]]:
        """``(event, payload)`` for ``start..end`` inclusive (defaults: the whole epoch), in
        event order, by cursor passes of up to 256 events (1 MiB), each copied out of a snapshot
        known not to have been recycled while it was read (``lmdb_snapshots.py``)."""
        walked = self._walk_range(start, end, self._check)
        if walked is None:
            return
        expected, end = walked
        while expected <= end:
            batch, _ = self._read(lambda txn: self._batch(txn, expected, end))
            for event, data in batch:
                yield EventNum(event), data if data is not None else self.read(event)
            expected = batch[-1][0] + 1

    def _batch(self, txn, start: int, end: int) -> list[tuple[int, bytes | None]]:
        """The values from ``start`` on, copied, up to 256 events or ``_CHUNK`` bytes; a
        value over ``_CHUNK`` alone, as ``None`` (:meth:`read` takes it in slices)."""
        out, total = [], 0
        for event, value in self._cursor_from(txn, start, end):
            if len(value) > _CHUNK:
                return out or [(event, None)]
            out.append((event, bytes(value)))
            total += len(value)
            if total >= _CHUNK or len(out) >= 256:
                break
        return out

    def _cursor_from(self, txn, start: int, end: int):
        """``(event, value)`` from ``start`` to ``end`` in ``txn``, checking that the keys
        are contiguous."""
        cur = txn.cursor(db=self._db)
        if not cur.set_key(KEY.pack(start)):
            raise NoSuchEvent(f"{self.data_path}: event {start} is missing from EVENTS")
        expected = start
        for key, value in cur:
            (event,) = KEY.unpack(bytes(key))
            if event != expected:
                raise ContiguityError(f"{self.data_path}: expected event {expected}, "
                                      f"found {event} (the events are not contiguous)")
            yield event, value
            if event == end:
                return
            expected += 1
        raise NoSuchEvent(f"{self.data_path}: EVENTS ends before event {end}")

    def iter_buffers(self, start: int | None = None, end: int | None = None
                     ) -> Iterator[tuple[EventNum, memoryview]]:
        """Like :meth:`walk`, but zero-copy: each value is a ``memoryview`` into the map,
        valid only until the generator advances or is closed (one read transaction stays
        open meanwhile).  The map's own bytes are handed out, so only for an epoch no
        writer changes: ``migrate``, which holds the pier's lock."""
        walked = self._walk_range(start, end, self._check)
        if walked is None:
            return
        start, end = walked
        with self._snaps.shared():
            with self._env.begin(buffers=True) as txn:
                for event, value in self._cursor_from(txn, start, end):
                    yield EventNum(event), value

    def refresh(self) -> int:
        """Pick up transactions a writer committed, once durable (module docstring);
        reopen a store that was replaced or rewritten (``generation`` grows).  Returns
        how many events were added.  Cheap while nothing changed: a ``stat``, an
        ``fstat`` and the newest transaction id from the map."""
        before = self.count
        try:
            path_st = os.stat(self.data_path)
        except OSError:
            path_st = None
        st = os.fstat(self._fd)
        newest = self._newest_txnid()
        if path_st is not None and (path_st.st_dev, path_st.st_ino) != (st.st_dev, st.st_ino):
            return self._reopen("was replaced (another file at its path)", before)
        if newest < self._txnid:
            return self._reopen("was rewritten in place (its newest transaction went "
                                "back)", before)
        if st.st_ctime_ns != self._seen_ctime and newest == self._txnid \
                and self._metas() != self._metas_seen:
            # Only a commit two after ours writes that page, and it can land between
            # the two looks: a newer transaction once the page was read says it did.
            newest = self._newest_txnid()
            if newest == self._txnid:
                return self._reopen("was rewritten in place (its meta page changed "
                                    "without a new transaction)", before)
        self._seen_ctime = st.st_ctime_ns
        if newest == self._txnid and self._db is not None:
            return 0
        self._scan()
        return max(0, self.count - before)

    def _reopen(self, why: str, before: int) -> int:
        """Open the store at the path again, as a new one (``generation`` grows)."""
        log.warning("%s %s; opening it again", self.data_path, why)
        with self._snaps.alone():
            self._env.close()
            os.close(self._fd)
            self._env = _open_env(self.directory)
            self._fd = os.open(self.data_path, os.O_RDONLY | os.O_CLOEXEC)
            self._db = _events_db(self._env, self.directory)
            self._psize = self._env.stat()["psize"]
        self._view, self._txnid, self._synced = (0, 0), 0, (0, b"")
        self.generation += 1
        self._seen_ctime = os.fstat(self._fd).st_ctime_ns
        self._scan()
        return max(0, self.count - before)

    def verify(self, *, progress=None) -> list[tuple[int, int]]:
        """Read every event in one cursor pass (LMDB checks its own pages; there is no
        per-event checksum).  Returns ``(event, 0)`` for the first event that could not be
        read (an LMDB error or a missing key ends the pass); empty when all read."""
        import lmdb

        expected = self.first
        try:
            for event, value in self.walk():
                expected = event + 1
                if progress is not None:
                    progress(len(value) + 8)
        except (lmdb.Error, BookError):
            return [(expected, 0)]
        return []

    # --- writing (refused) ---------------------------------------------------------------

    def save(self, first_event: int, payloads: Iterable[bytes], epoch: int = 0) -> None:
        raise ReadOnly(f"{self.data_path}: {_READ_ONLY_MSG}")

    def save_meta(self, key: str, value: bytes) -> None:
        raise ReadOnly(f"{self.data_path}: {_READ_ONLY_MSG}")

    # --- meta ----------------------------------------------------------------------------

    def read_meta(self, key: str) -> bytes:
        """Meta field ``key`` (version, who, fake, life) in ``meta.bin``'s encoding; zeros
        when no META database was found."""
        try:
            _, size = META_FIELDS[key]
        except KeyError:
            raise BadMetaKey(f"{self.meta_source or self.data_path}: unknown meta key "
                             f"{key!r}, expected one of {', '.join(META_FIELDS)}") from None
        if self._meta is None:
            return bytes(size)
        return self._meta[key]

    # --- closing -------------------------------------------------------------------------

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            os.close(self._fd)
