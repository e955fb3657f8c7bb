"""Piers: a ship's epochs presented as one event log, and opening any log source.

A pier keeps its events in epochs (``reference-formats.md`` §3)::

    <pier>/.urb/log/data.mdb        top-level LMDB: only the META database
    <pier>/.urb/log/0i<N>/          epoch N: events N+1 .. M; the next epoch is 0i<M>
        epoc.txt                    1 or 2 = LMDB (data.mdb); 3 = Book (book.log, meta.bin)
                                    on vere's ml/book, LMDB with ram events on ml/bob
    <pier>/.vere.lock               the runtime's lock (fcntl F_SETLK on byte 0)

An epoch is identified by what its files hold (``epochs.py``), with ``epoc.txt`` as a
cross-check; :func:`identify` applies the same rule to any directory it is given, so every
tool (``open_source``, ``recovery_for``, fsck, info, the mount) sees one answer.

:class:`Pier` implements :class:`bookfs.formats.eventlog.EventLog` over them: one numbering across
all epochs (the oldest may start after event 1, after a *chop*), routed to the right epoch
by bisecting over the epoch bases.  ``pier.epochs`` lists ``(name, base, log)`` so a view
can show each epoch on its own.

Contract
--------
* Opening checks the chain: each non-empty epoch ``0i<N>`` starts at ``N + 1`` and each
  next epoch's ``N`` is the previous epoch's last event.  A gap or overlap raises
  :class:`ContiguityError` naming the epochs and the missing events.  Only the newest
  epoch may be empty (a fresh *roll*).
* A writable pier holds the runtime's own lock ``<pier>/.vere.lock`` (a running ship makes
  the open fail with :class:`LockHeld`), and opens only the newest epoch writable; appends
  go there.  If the newest epoch is LMDB the open raises :class:`ReadOnly` instead (LMDB
  epochs are never written: migrate them).  The newest epoch is opened with
  ``lock=False`` (the pier already holds the lock).  Whatever path a writable open is
  given (the pier, ``.urb/log``, an epoch, a Book directory inside the pier), the same
  ``.vere.lock`` is taken (``lock.lock_path_for``), so two writers never meet.
* Meta is the newest epoch's: ``meta.bin`` for a Book epoch, the top-level META database
  for an LMDB epoch.
* ``refresh`` delegates to the newest epoch and, on a read-only pier, picks up the epochs
  a writer created since by a *roll* (:meth:`Pier.refresh`): a follower of a live ship
  goes on across an upgrade.  A new epoch is taken once it opens and continues the
  chain (``0i<N>`` with N the last event seen); one caught half made (the directory
  without its files yet, a Book header not written) is looked at again at the next
  refresh, never refused.  The check costs one ``stat`` of ``.urb/log`` while no
  directory was added.

:func:`open_source` opens whatever a user points at: a pier, a single Book directory (UIP
or vere layout), or a single LMDB epoch directory.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from bookfs.formats.logbase import LogMixin
from bookfs.errors import (BookError, ContiguityError, FormatError, NoSuchEvent, ReadOnly,
                           UsageError)
from bookfs.formats.epochs import list_epochs, store_kind
from bookfs.formats.eventlog import EventLog
from bookfs.formats.layout import (
    EPOC_NAME,
    EPOCH_NAME,
    LMDB_DATA_NAME,
    LOG_NAME,
    PIER_LOG_DIR,
    VERE_LOCK_NAME,
)
from bookfs.types import EventNum

_log = logging.getLogger(__name__)

LOG_DIR = PIER_LOG_DIR
LOCK_NAME = VERE_LOCK_NAME  # kept for importers; lock.lock_path_for finds it from any path



class Epoch(NamedTuple):
    """One epoch of a pier: its directory name (``0i<N>``), its base ``N`` and its log."""

    name: str
    base: int
    log: EventLog


def is_pier(path: str | os.PathLike) -> bool:
    """True if ``path`` has ``.urb/log/``."""
    return os.path.isdir(os.path.join(os.fspath(path), LOG_DIR))




def open_book_dir(directory: str, writable: bool = False, *,
                  pier_locked: bool = False, progress=None) -> EventLog:
    """A directory holding ``book.log``: a :class:`~bookfs.formats.vere.VereBook` if the log is in
    vere's two-slot layout, else a UIP :class:`~bookfs.formats.book.Book`.

    The layout is identified by :func:`bookfs.formats.detect.detect_layout`; a file that is neither
    layout is refused with a :class:`FormatError` before any engine parses it.

    ``pier_locked``: the caller holds the pier's ``.vere.lock``, so a writable open does
    not take it again (``lock=False``); otherwise a writable open takes the lock
    ``lock.lock_path_for(directory)`` names (the enclosing pier's, if any)."""
    from bookfs.formats.detect import detect_layout

    if detect_layout(os.path.join(directory, LOG_NAME)) == "vere":
        from bookfs.formats.vere import VereBook as cls
    else:
        from bookfs.formats.book import Book as cls
    return cls.open(directory, writable=writable, lock=not (writable and pier_locked),
                    progress=progress)


def identify(path: str | os.PathLike) -> tuple[str, str]:
    """``(kind, directory)`` for what ``path`` is: ``pier`` (has ``.urb/log/``, or is that
    ``.urb/log`` directory; the pier's directory is returned), ``vere`` or ``uip`` (a Book
    directory, its layout by :func:`bookfs.formats.detect.detect_layout`), ``lmdb`` (an LMDB
    epoch).  Which store a directory holds is :func:`store_kind`'s answer (by the files'
    contents, ``epoc.txt`` a cross-check), the one :func:`list_epochs` gives a pier's
    epochs.  Anything else raises :class:`FormatError` (or :class:`BookError` for a missing
    directory); nothing is modified.  :func:`open_source` and
    :func:`~bookfs.formats.pier_recovery.recovery_for` both decide by this."""
    p = os.fspath(path)
    if is_pier(p):
        return "pier", p
    norm = os.path.abspath(p)
    if (os.path.basename(norm) == "log" and os.path.basename(os.path.dirname(norm)) == ".urb"
            and os.path.isdir(norm)):
        return "pier", os.path.dirname(os.path.dirname(norm))
    kind = store_kind(p)
    if kind == "book":
        from bookfs.formats.detect import detect_layout

        return detect_layout(os.path.join(p, LOG_NAME)), p
    if kind == "lmdb":
        return "lmdb", p
    if not os.path.isdir(p):  # a command-line mistake (exit 2), not a damaged log
        what = "a file" if os.path.lexists(p) else "nothing there"
        raise UsageError(f"{p}: {what}; expected a directory: a pier, a Book directory "
                         f"({LOG_NAME}) or an LMDB epoch ({LMDB_DATA_NAME})")
    raise FormatError(f"{p}: not a pier (.urb/log/), a Book directory ({LOG_NAME}) "
                      f"or an LMDB epoch ({LMDB_DATA_NAME})")


def open_source(path: str | os.PathLike, writable: bool = False, *,
                progress=None) -> EventLog:
    """Open ``path`` as an event log: a pier (has ``.urb/log/``; also accepted: the
    ``.urb/log`` directory itself), a Book directory (has ``book.log``; UIP or vere layout,
    detected), or an LMDB epoch directory (has ``data.mdb`` with ``EVENTS``), as
    :func:`identify` says.

    LMDB sources are read-only: ``writable=True`` on one raises :class:`ReadOnly`.
    ``progress`` is called with byte counts while Book logs are indexed or checked."""
    kind, p = identify(path)
    if kind == "pier":
        return Pier.open(p, writable=writable, progress=progress)
    if kind in ("uip", "vere"):
        return open_book_dir(p, writable, progress=progress)
    from bookfs.formats.lmdb_log import LmdbLog

    return LmdbLog.open(p, writable=writable)


def _short_format(log: EventLog) -> str:
    """``lmdb``, ``book-v1``, ``vere-book``: the first word of the log's format."""
    return log.format.split(" ")[0]


class Pier(LogMixin):
    """An open pier.  Use :meth:`open`; close with :meth:`close` or ``with``."""

    def __init__(self, directory: str, writable: bool):
        self.directory = directory
        self.log_dir = os.path.join(directory, LOG_DIR)
        self.writable = writable
        #: ``(name, base, log)`` per epoch, oldest first.
        self.epochs: list[Epoch] = []
        self._bases: list[int] = []
        self._lock = None
        self._log_dir_mtime: int | None = None  # .urb/log as of the last look for a roll
        self._roll_pending = False  # a new epoch seen but not taken yet (half made)
        self._roll_said: str | None = None  # the last reason a new epoch waits (logged once)
        self._inline_sync = True  # logbase.SingleFileLog.inline_sync, for every epoch
        #: ``(epochs, first, last, count)`` of every epoch but the newest (:meth:`_older`)
        self._older_view: tuple[int, int, int, int] | None = None

    @classmethod
    def open(cls, path: str | os.PathLike, writable: bool = False, *,
             progress=None) -> "Pier":
        """Open the pier at ``path``.  Raises :class:`ContiguityError` for a gap between
        epochs, :class:`FormatError` for an unknown epoch format, :class:`LockHeld` if a
        writable open finds ``.vere.lock`` held (a running ship), :class:`ReadOnly` if a
        writable open finds an LMDB newest epoch."""
        directory = os.fspath(path)
        log_dir = os.path.join(directory, LOG_DIR)
        if not os.path.isdir(log_dir):
            raise BookError(f"{log_dir}: no such directory (not a pier)")
        names, kinds = list_epochs(log_dir)
        pier = cls(directory, writable)
        metas: dict = {}  # the pier's META, read once for all its LMDB epochs
        try:
            if writable:
                newest = os.path.join(log_dir, names[-1][1])
                if kinds[-1] == "lmdb":
                    raise ReadOnly(f"{newest}: the newest epoch is LMDB, and LMDB epochs are "
                                   "read-only; open the pier read-only or migrate it with "
                                   "bookfs migrate")
                from bookfs.formats.lock import WriterLock, lock_path_for

                pier._lock = WriterLock(lock_path_for(directory))
            for i, ((base, name), kind) in enumerate(zip(names, kinds)):
                d = os.path.join(log_dir, name)
                rw = writable and i == len(names) - 1
                if kind == "lmdb":
                    log = pier._open_lmdb(d, metas)
                else:
                    log = open_book_dir(d, rw, pier_locked=rw, progress=progress)
                pier.epochs.append(Epoch(name, base, log))
                pier._bases.append(base)
            pier._check_chain()
        except BaseException:
            pier.close()
            raise
        return pier

    def _open_lmdb(self, directory: str, metas: dict | None = None):
        """The LMDB epoch in ``directory``, its meta from the pier's ``.urb/log/data.mdb``
        when there is one.  ``metas``: META already read during this open (by path), so
        a pier of many LMDB epochs opens that environment once, not once per epoch."""
        from bookfs.formats.lmdb_log import LmdbLog, is_lmdb_dir

        meta_from = self.log_dir if is_lmdb_dir(self.log_dir) else None
        return LmdbLog.open(directory, meta_from=meta_from, metas=metas)

    def _check_chain(self) -> None:
        prev_last = None
        prev_name = None
        for k, (name, base, log) in enumerate(self.epochs):
            path = os.path.join(self.log_dir, name)
            first, last = log.gulf()
            if log.count and first != base + 1:
                raise ContiguityError(f"{path}: epoch {name} must start at event {base + 1}, "
                                      f"but its first event is {first}")
            if prev_last is not None and base != prev_last:
                if base > prev_last:
                    what = (f"events {prev_last + 1}..{base} are missing"
                            if base > prev_last + 1 else f"event {base} is missing")
                else:
                    what = f"events {base + 1}..{prev_last} would be in both"
                raise ContiguityError(f"{path}: epoch {name} starts after event {base}, but "
                                      f"epoch {prev_name} ends at event {prev_last}: {what}")
            if not log.count and k != len(self.epochs) - 1:
                nxt = self.epochs[k + 1]
                if nxt.base != base:
                    raise ContiguityError(
                        f"{path}: epoch {name} is empty but is not the newest; epoch "
                        f"{nxt.name} follows it, so events {base + 1}..{nxt.base} are missing")
            prev_last = last if log.count else base
            prev_name = name

    # --- state ---------------------------------------------------------------------------

    @property
    def format(self) -> str:
        kinds = ", ".join(_short_format(e.log) for e in self.epochs)
        n = len(self.epochs)
        return f"pier ({n} epoch{'s' if n != 1 else ''}: {kinds})"

    @property
    def newest(self) -> Epoch:
        return self.epochs[-1]

    @property
    def epoch(self) -> int:
        """The newest epoch's base: an empty pier's first event is ``epoch + 1``."""
        return self.newest.base

    def _older(self) -> tuple[int, int, int]:
        """``(first, last, count)`` of the events of every epoch but the newest
        (``(0, 0, 0)`` when they hold none).  Those epochs no longer change: only the
        newest grows and is looked at again (:meth:`refresh`, :meth:`save`), and the one
        before it had its last look when the roll that follows it was taken
        (:meth:`_take_rolls`).  The list of epochs only grows, so the figures are kept
        while its length is the same: :meth:`gulf` and :attr:`count`, which a commit
        asks for a few times, cost the same for a pier of 20 epochs as for one of one
        (they walked every epoch, and a pier of 20 epochs appended at 0.9x one of one)."""
        n = len(self.epochs)
        if self._older_view is None or self._older_view[0] != n:
            first = last = count = 0
            for e in self.epochs[:-1]:
                if e.log.count:
                    first = first or e.log.first
                    last = e.log.last
                    count += e.log.count
            self._older_view = (n, first, last, count)
        return self._older_view[1:]

    def gulf(self) -> tuple[EventNum, EventNum]:
        """``(first, last)`` across all epochs; ``(0, 0)`` when none holds an event."""
        if not self.epochs:
            return EventNum(0), EventNum(0)
        first, last, _ = self._older()
        newest_first, newest_last = self.newest.log.gulf()
        if newest_last:
            return EventNum(first or newest_first), EventNum(newest_last)
        return EventNum(first), EventNum(last)

    @property
    def count(self) -> int:
        if not self.epochs:
            return 0
        return self._older()[2] + self.newest.log.count

    @property
    def log_bytes(self) -> int:
        return sum(e.log.log_bytes for e in self.epochs)

    def _holding(self, event: int) -> Epoch | None:
        i = bisect.bisect_left(self._bases, event) - 1
        return self.epochs[i] if i >= 0 and event in self.epochs[i].log else None

    def epoch_of(self, event: int) -> Epoch:
        """The epoch holding ``event`` (raises :class:`NoSuchEvent`)."""
        e = self._holding(event)
        if e is None:
            first, last = self.gulf()
            raise NoSuchEvent(f"{self.log_dir}: no event {event} (the pier holds "
                              f"{first}..{last})")
        return e

    def __contains__(self, event: int) -> bool:
        return self._holding(event) is not None

    def payload_size(self, event: int) -> int:
        return self.epoch_of(event).log.payload_size(event)

    def mtime_ns(self, event: int) -> int:
        return self.epoch_of(event).log.mtime_ns(event)

    def chain_confirmed(self, event: int) -> bool:
        e = self._holding(event)
        return e is None or e.log.chain_confirmed(event)

    def confirm_to(self, event: int, ahead: bool = True) -> None:
        self.epoch_of(event).log.confirm_to(event, ahead)

    def prefetch(self, event: int) -> None:
        e = self._holding(event)
        if e is not None:
            e.log.prefetch(event)

    # --- reading ---------------------------------------------------------------------------

    def read(self, event: int) -> bytes:
        """The payload of ``event``, from the epoch holding it (checked as that format
        checks)."""
        return self.epoch_of(event).log.read(event)

    def verify_event(self, event: int) -> None:
        self.epoch_of(event).log.verify_event(event)

    def read_slice(self, event: int, offset: int, size: int) -> bytes:
        return self.epoch_of(event).log.read_slice(event, offset, size)

    def seal(self, event: int, *, fresh: bool = False):
        return self.epoch_of(event).log.seal(event, fresh=fresh)

    def read_sealed(self, event: int, seal, offset: int, size: int) -> bytes:
        return self.epoch_of(event).log.read_sealed(event, seal, offset, size)

    def verify(self, *, progress=None) -> list[tuple[int, int]]:
        """Every epoch's own ``verify`` (CRC, framing and batch CRC, or LMDB reads):
        ``(event, offset)`` of each bad deed, offsets within that epoch's log."""
        bad = []
        for e in self.epochs:
            bad += e.log.verify(progress=progress)
        return bad

    def walk(self, start: int | None = None, end: int | None = None
             ) -> Iterator[tuple[EventNum, bytes]]:
        """``(event, payload)`` for ``start..end`` inclusive across epochs."""
        walked = self._walk_range(start, end, self.epoch_of)
        if walked is None:
            return
        start, end = walked
        for e in self.epochs:
            if not e.log.count or e.log.last < start or e.log.first > end:
                continue
            yield from e.log.walk(max(start, e.log.first), min(end, e.log.last))

    def refresh(self) -> int:
        """Events the pier gained since the last look: the newest epoch's (it rebuilds its
        view, and bumps its ``generation``, if it was rewritten under us), then, on a
        read-only pier, those of epochs a roll created since (:meth:`_take_rolls`)."""
        gained = self.newest.log.refresh()
        if not self.writable:
            gained += self._take_rolls()
        return gained

    def _take_rolls(self) -> int:
        """Open the epochs a writer's roll added to ``.urb/log`` since the last look, in
        order, as long as each continues the chain; their events gained.  One ``stat``
        while the directory is unchanged and no new epoch is pending.  An mtime within
        the racy margin of its change (:func:`~bookfs.formats.index.racy_margin`: a
        coarse clock tick) is not remembered, since a roll in the same tick, after this
        look, would leave it as it is and so go unseen until the next roll."""
        from bookfs.formats.index import racy_margin

        try:
            mtime = os.stat(self.log_dir).st_mtime_ns
        except OSError:
            return 0
        if mtime == self._log_dir_mtime and not self._roll_pending:
            return 0
        settled = time.time_ns() - mtime >= racy_margin(mtime)
        self._log_dir_mtime = mtime if settled else None
        newest = self.newest.base
        try:
            names = sorted((int(m.group(1)), name) for name in os.listdir(self.log_dir)
                           if (m := EPOCH_NAME.fullmatch(name)) and int(m.group(1)) > newest)
        except OSError:
            names = []
        gained, self._roll_pending = 0, False
        for base, name in names:
            last_log = self.newest.log
            last_log.refresh()  # the events committed before the roll
            last = last_log.last if last_log.count else self.newest.base
            why = None
            if base != last:
                why = f"it would start after event {base}, and the pier ends at {last}"
            else:
                try:
                    log = self._open_epoch(os.path.join(self.log_dir, name))
                except (BookError, OSError) as e:
                    log, why = None, f"not complete yet ({e})"
                if log is not None and log.count and log.first != base + 1:
                    why = f"its first event is {log.first}, expected {base + 1}"
                    log.close()
                    log = None
            if why is not None:
                self._roll_pending = True
                if why != self._roll_said:
                    _log.info("%s: new epoch %s not followed yet: %s", self.log_dir, name, why)
                    self._roll_said = why
                break
            if hasattr(log, "inline_sync"):
                log.inline_sync = self._inline_sync
            self.epochs.append(Epoch(name, base, log))
            self._bases.append(base)
            gained += log.count
            _log.info("%s: followed a roll: new epoch %s (%s)", self.log_dir, name, log.format)
        return gained

    def _open_epoch(self, directory: str) -> EventLog:
        """A new epoch directory, opened read-only (BookError while it is half made)."""
        kind = store_kind(directory)
        if kind is None:
            raise FormatError(f"{directory}: no {EPOC_NAME}, {LOG_NAME} or {LMDB_DATA_NAME}")
        if kind == "lmdb":
            return self._open_lmdb(directory)
        return open_book_dir(directory, False)

    # --- what a reader may publish (committed.py), for every epoch --------------------

    def _logs(self, attr: str):
        return [e.log for e in self.epochs if hasattr(e.log, attr)]

    @property
    def inline_sync(self) -> bool:
        return self._inline_sync

    @inline_sync.setter
    def inline_sync(self, value: bool) -> None:  # every epoch's, and a roll's later
        self._inline_sync = value
        for log in self._logs("inline_sync"):
            log.inline_sync = value

    @property
    def wants_sync(self) -> bool:
        return any(log.wants_sync for log in self._logs("wants_sync"))

    @wants_sync.setter
    def wants_sync(self, value: bool) -> None:
        for log in self._logs("wants_sync"):
            log.wants_sync = value

    def make_durable(self) -> bool:
        """Every epoch's own sync (``committed.py``)."""
        return all([log.make_durable() for log in self._logs("make_durable")])

    def identity(self) -> tuple:
        """A token naming the pier as published now: each epoch's name and token."""
        return tuple((e.name, e.log.identity()) for e in self.epochs)

    def continues(self, token: tuple) -> bool:
        """Every epoch the token names is still here, by name, and continues its own
        token (epochs rolled since are new, which changes nothing published)."""
        mine = {e.name: e.log for e in self.epochs}
        return all(name in mine and mine[name].continues(t) for name, t in token)

    def watch_paths(self) -> list[tuple[str, bool]]:
        """What a follower watches (inotify): ``.urb/log`` (a roll adds an epoch) and
        what the newest epoch's log says of itself."""
        newest = getattr(self.newest.log, "watch_paths", lambda: [])()
        return [(self.log_dir, True)] + newest

    @property
    def generation(self) -> int:
        """Grows whenever any epoch's published events may have changed (the sum of the
        epochs' generations; see ``eventlog.py``)."""
        return sum(e.log.generation for e in self.epochs)

    # --- writing ---------------------------------------------------------------------------

    def save(self, first_event: int, payloads: Iterable[bytes], epoch: int = 0) -> None:
        """Append to the newest epoch (``epoch`` is ignored: the newest epoch's base is
        used).  :class:`ReadOnly` for a read-only pier."""
        if not self.writable:
            raise ReadOnly(f"{self.log_dir}: pier opened read-only")
        e = self.newest
        e.log.save(first_event, payloads, epoch=e.base)

    def read_meta(self, key: str) -> bytes:
        return self.newest.log.read_meta(key)

    def save_meta(self, key: str, value: bytes) -> None:
        if not self.writable:
            raise ReadOnly(f"{self.log_dir}: pier opened read-only")
        self.newest.log.save_meta(key, value)

    # --- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Close every epoch, then release ``.vere.lock``."""
        epochs, self.epochs, self._bases = self.epochs, [], []
        err = None
        for e in epochs:
            try:
                e.log.close()
            except Exception as ex:  # close the rest before reporting
                err = err or ex
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if err is not None:
            raise err
