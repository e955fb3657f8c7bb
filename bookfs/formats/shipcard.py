"""A ship's *card*: the figures a fleet mount shows of a log it has not opened (issue 24:
``find MNT -maxdepth 2`` stats ``events/`` and ``info`` of every ship), kept with the
log's persisted index (``index.py``: the card is written in the same atomic replace as
the offsets and timeline beside it, and read back from the index file's tail alone), or,
for a pier, which has no single index, in a card file of its own in the same cache
directory (:func:`~bookfs.formats.index.save_card_file`: private, atomic, CRC-checked,
pruned with the indexes; named by the pier directory's path, device and inode).
Knows nothing of FUSE.

What a card holds: the log's event ``count``, its newest event's mtime as the index's
timeline gives it (``mtime_ns``; None for an empty log), and ``summary``
(:func:`~bookfs.formats.info.log_summary`: everything ``info`` says of the log), as they
were when the card was written by a process that had the log open; and the *witnesses*
they were read under: ``(dev, ino, mode, size, mtime_ns, ctime_ns)`` (``lstat``; None for
one that is absent) of every file and directory the log is read from, and when that was
recorded.  A Book directory's witnesses: the directory, ``book.log``, ``meta.bin``,
``epoc.txt`` (:data:`WITNESSES`).  A pier's (:data:`PIER_WITNESSES`): the pier's
directory, ``.urb``, ``.urb/log`` (its mtime moves when an epoch is added, removed or
renamed: a roll, a chop) and the top-level ``data.mdb`` (META), then for each epoch
directory ``0i<N>`` in ``.urb/log`` the directory and its ``epoc.txt``, ``book.log``,
``meta.bin`` and ``data.mdb`` (:data:`EPOCH_WITNESSES`): everything
:func:`~bookfs.formats.pier.open_source` reads of a pier opened read-only.  Not
witnessed: ``lock.mdb`` (a read-only open passes ``lock=False`` and never reads it),
``vere.txt`` (never read), ``.vere.lock`` (below).  A pier with a symbolic link among its
witnesses (but the pier's directory itself) gets no card.

When a card is believed (:func:`read_card`): only while every witness is what it was,
field for field, and each one's ctime was at least :func:`~bookfs.formats.index.racy_margin`
older than the moment the card's figures were read (the argument of
:class:`~bookfs.formats.index.FileStamp`: ctime cannot be set by a program and moves at
every write, truncate, rename over, chmod or ``utime``, so equal witnesses mean nobody
changed the files since).  A log that grew, was truncated, rewritten or replaced, a
``meta.bin`` rewritten, an ``epoc.txt`` or a ``.urb/`` or ``data.mdb`` added (the
directory's mtime) all make the card *stale*: it is never served, and the log is opened
as it would be without one.  An index file the cache would not load (its directory not
private, a symlink, a card whose CRC fails) gives no card.

A pier's card is written only when its witnesses, looked at just before the pier was
opened (:func:`write_card` ``before``, with the time they were taken), are still the same
once its figures were read, and every witness's ctime was already past the racy margin
then: so nothing was written to the pier from the moment the open began.

Which logs have one: UIP Book directories (``book.log`` of the layout bookfs writes,
a regular file, not a symlink), whose index is persisted, and piers.  A single vere
layout Book directory or a single LMDB epoch has none (:func:`write_card` declines), and a
fleet opens it to answer, as before.

A live ship: the fleet's read-only open takes no lock and a pier whose ``.vere.lock`` a
running vere holds is opened and followed, not an error (``fs/fleet/ops.py``); its figures do
not depend on the lock, so the lock is no witness.  Each commit of the running vere
changes ``book.log`` or ``data.mdb`` (size, mtime, ctime), so its card goes stale and it is
opened as without one; a card only stands in for an open that would succeed and show the
same figures (an open that fails is no card: none is written, and a ship that failed is
an error file, never answered from a card).

Cost: :func:`read_card` is four ``lstat`` calls for a Book directory, for a pier four
plus a listing of ``.urb/log`` plus five per epoch, and one small ``pread`` of the index
or card file (no log is opened); :func:`write_card`, at the open of a log whose card is
missing or stale, the log's summary (a few event reads for its dates) and one save of its
index or card file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass

from bookfs.errors import BookError
from bookfs.formats import index as X
from bookfs.formats.layout import (EPOC_NAME, EPOCH_NAME, LMDB_DATA_NAME, LOG_NAME, META_NAME,
                                   PIER_LOG_DIR)

log = logging.getLogger(__name__)

CARD_VERSION = 1
#: the files whose ``lstat`` a card is checked by ("": the log's directory itself)
WITNESSES = ("", LOG_NAME, META_NAME, EPOC_NAME)
#: a pier's, before its epochs' ("": the pier's directory)
PIER_WITNESSES = ("", os.path.dirname(PIER_LOG_DIR), PIER_LOG_DIR,
                  os.path.join(PIER_LOG_DIR, LMDB_DATA_NAME))
#: each epoch's, relative to its directory ``.urb/log/0i<N>`` ("": that directory)
EPOCH_WITNESSES = ("", EPOC_NAME, LOG_NAME, META_NAME, LMDB_DATA_NAME)


@dataclass(frozen=True)
class Card:
    """The figures of a closed log (module docstring)."""

    count: int
    mtime_ns: int | None
    summary: dict


def is_pier(path: str) -> bool:
    """True if ``path`` is a pier (has ``.urb/log/``): its card is a card file's."""
    return os.path.isdir(os.path.join(path, PIER_LOG_DIR))


def witnesses(path: str) -> tuple | None:
    """The witnesses of the Book directory or pier ``path`` (module docstring), or None
    when no card can hold: a Book directory whose ``book.log`` is not a regular file, a
    pier with a symbolic link among them, or one that cannot be looked at."""
    if not is_pier(path):
        out = _lstat(path, WITNESSES)
        return out if out is not None and out[1] is not None and stat.S_ISREG(out[1][2]) \
            else None
    try:
        names = _pier_names(path)
    except OSError:
        return None
    out = _lstat(path, names)
    if out is None or any(w is not None and stat.S_ISLNK(w[2]) for w in out[1:]):
        return None
    return out


def witness_names(path: str) -> tuple[str, ...] | None:
    """The names, relative to ``path`` ("": ``path`` itself), of what :func:`witnesses`
    looks at now, in its order; None if a pier's ``.urb/log`` cannot be listed."""
    if not is_pier(path):
        return WITNESSES
    try:
        return tuple(_pier_names(path))
    except OSError:
        return None


def _pier_names(path: str) -> list[str]:
    names = list(PIER_WITNESSES)
    for epoch in _epochs(os.path.join(path, PIER_LOG_DIR)):
        names += [os.path.join(PIER_LOG_DIR, epoch, name) for name in EPOCH_WITNESSES]
    return names


def _epochs(log_dir: str) -> list[str]:
    """The names in ``log_dir`` that name an epoch (``0i<N>``), oldest first, found by
    their names alone (one listing; what they hold is not looked at)."""
    found = [(int(m.group(1)), m.group(0)) for m in map(EPOCH_NAME.fullmatch,
                                                         os.listdir(log_dir)) if m]
    return [name for _, name in sorted(found)]


def _lstat(path: str, names) -> tuple | None:
    """The witnesses ``names`` (relative to ``path``; "": ``path``), None for one absent;
    None in all if one cannot be looked at."""
    out = []
    for name in names:
        try:
            st = os.lstat(f"{path}/{name}" if name else path)
        except (FileNotFoundError, NotADirectoryError):
            out.append(None)
            continue
        except OSError:
            return None
        out.append((st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns,
                    st.st_ctime_ns))
    return tuple(out)


def read_card(path: str, seen: tuple | None = None) -> tuple[tuple | None, Card | str]:
    """``(witnesses, card)`` of the log in directory ``path`` when its card holds, else
    ``(witnesses, why)``: ``"missing"`` (no index, no card in it, not a UIP Book
    directory) or ``"stale"`` (a card of another state of the files).  Opens no log.
    ``seen``: :func:`witnesses` of ``path``, if the caller has just looked at them."""
    seen = seen or witnesses(path)
    if seen is None:
        return None, "missing"
    if is_pier(path):
        raw = X.read_card_file(path, _DevIno(*seen[0][:2]))
    else:
        raw = X.read_card(os.path.join(path, LOG_NAME), _DevIno(*seen[1][:2]))
    if raw is None:
        return seen, "missing"
    try:
        got = json.loads(raw)
        if got.get("v") != CARD_VERSION:
            return seen, "missing"
        said = tuple(None if w is None else tuple(w) for w in got["witnesses"])
        taken = got["taken_ns"]
        card = Card(got["count"], got["mtime_ns"], got["summary"])
        where = got["path"]
    except (ValueError, KeyError, TypeError):
        return seen, "missing"
    if said != seen or where != path or not settled(seen, taken):
        return seen, "stale"
    return seen, card


def looked(path: str) -> tuple[tuple | None, int]:
    """``(witnesses, when)``: :func:`witnesses` of ``path`` and a time no later than the
    moment they were looked at; taken just before a log is opened, for
    :func:`write_card`'s ``before``."""
    now = time.time_ns()
    return witnesses(path), now


def write_card(path: str, book, before: tuple[tuple | None, int] | None = None, *,
               missing: bool = False) -> bool:
    """Store the card of ``book``, a log just opened from the directory ``path``, with its
    index (a UIP Book) or in its card file (a pier: only given ``before``, what
    :func:`looked` said just before the open), unless a card that holds is there already;
    True if one was written.  Declines (False) for a log that keeps no card (module
    docstring), a Book that is not exactly its file (a torn tail, damage, trailing bytes:
    its figures are then not the file's alone), a Book changed within the racy margin
    (waited out when it is short), and a pier whose witnesses are not those of ``before``
    or were within the racy margin of a change then.  Failures are logged, not raised: a
    card is only a cache.  ``missing``: the caller found no card that holds just before
    ``before`` was looked at (:func:`read_card`), so it is not read again; the figures
    are then checked against ``before``'s witnesses, which the files must still match."""
    from bookfs.formats.book import Book
    from bookfs.formats.info import log_summary
    from bookfs.formats.pier import Pier

    pier = isinstance(book, Pier)
    if not (pier or isinstance(book, Book)) or pier != is_pier(path) \
            or not X.cache_enabled():
        return False
    try:
        seen, held = (before[0], None) if missing and before is not None else read_card(path)
        if isinstance(held, Card) or seen is None:
            return False
        if pier:
            if before is None or before[0] != seen or not settled(seen, before[1]):
                return False
            taken = before[1]  # nothing written since, so the figures are the files'
        else:
            seen = _settle(path, seen)
            if seen is None or book.fstat().st_ino != seen[1][1]:
                return False
            book.refresh()
            size = seen[1][3]
            if book.log_bytes != size or book.index.end != size:
                return False
        first, last = book.gulf()
        card = {"v": CARD_VERSION, "path": path, "count": book.count,
                "mtime_ns": book.mtime_ns(last) if last else None,
                "summary": log_summary(book)}
        if witnesses(path) != seen:
            return False  # changed while the figures were read
        card["witnesses"] = seen
        card["taken_ns"] = taken if pier else time.time_ns()
        raw = json.dumps(card, separators=(",", ":")).encode()
        if pier:
            X.save_card_file(path, _DevIno(*seen[0][:2]), raw)
        else:
            book.save_card(raw)
        return True
    except (OSError, BookError, ValueError) as e:
        log.warning("%s: could not keep its card: %s", path, e)
        return False


def open_keeping_card(path: str, identified: tuple[str, str] | None = None, *,
                      missing: bool = False):
    """Open the log at ``path`` read-only (:func:`~bookfs.formats.pier.open_source`) and
    keep its card when it has none that holds (a pier's from what its files were just
    before the open, :func:`looked`); a card that cannot be kept never fails the open.
    What a fleet mount does to open a ship (``fs/fleet/ops.py``, in a worker thread), and
    what its card builders do ahead of a walk (``fs/fleet/ahead.py``).

    A UIP Book directory's index, when the open builds or grows it, is saved once: with
    its card, or alone when no card is kept (``Book.open(persist=False)``).

    ``identified``: what :func:`~bookfs.formats.pier.identify` said of ``path`` just
    before, when the caller has it (a card builder), so that it is not looked at twice;
    ``missing``: :func:`write_card`'s (the caller just found no card that holds)."""
    from bookfs.formats.book import Book
    from bookfs.formats.pier import identify, open_source

    before = looked(path)
    kind, where = identified or identify(path)
    book = Book.open(where, persist=False) if kind == "uip" else open_source(path)
    try:
        try:
            write_card(path, book, before, missing=missing)
        except Exception:
            log.exception("%s: keeping its card failed", path)
        if kind == "uip":
            book.save_index()  # not saved with a card: saved alone, as any open's
    except BaseException:
        book.close()
        raise
    return book


def settled(seen: tuple, taken_ns: int) -> bool:
    """True if every witness of ``seen`` changed last at least the racy margin
    (:func:`~bookfs.formats.index.racy_margin`) before ``taken_ns``, a time no later than
    the moment they were looked at: a change after that moment then gives a witness a
    later ctime, and so can never leave them as they were."""
    return all(w is None or taken_ns - w[5] >= X.racy_margin(w[5]) for w in seen)


def _settle(path: str, seen: tuple) -> tuple | None:
    """``seen`` once the clock has left the tick of every witness's ctime (waiting for
    that when the margin is short, as :func:`~bookfs.formats.index.settle_stamp`), if the
    files are still as seen; else None."""
    late = max((w[5] + X.racy_margin(w[5]) for w in seen if w is not None), default=0)
    wait = late - time.time_ns()
    if wait <= 0:
        return seen  # no time passed since they were looked at: nothing to look at again
    if wait > 100_000_000:
        return None  # a coarse clock (whole seconds or ms): not worth a 2 s wait
    time.sleep(wait / 1e9)
    return seen if witnesses(path) == seen else None


@dataclass(frozen=True)
class _DevIno:
    """What :func:`~bookfs.formats.index.read_card` needs of a ``stat``."""

    st_dev: int
    st_ino: int


def source_file(path: str) -> str:
    """The file whose owner and mode stand for the log at ``path`` (a pier: its newest
    epoch's ``book.log`` or ``data.mdb``; a Book directory: ``book.log``; an LMDB epoch:
    ``data.mdb``; else ``path`` itself), found without opening the log (a pier's newest
    epoch by its name, :func:`_epochs`): what a single mount's ``_source_file``
    (``fs/nodes/base.py``) finds once it is open."""
    with contextlib.suppress(OSError, IndexError):  # unreadable, or no epoch: ``path``
        where = path
        log_dir = os.path.join(path, PIER_LOG_DIR)
        if os.path.isdir(log_dir):
            where = os.path.join(log_dir, _epochs(log_dir)[-1])
        for name in (LOG_NAME, LMDB_DATA_NAME):
            if os.path.exists(os.path.join(where, name)):
                return os.path.join(where, name)
    return path
