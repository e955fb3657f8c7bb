"""A ship's *card*: the figures a fleet mount shows of a log it has not opened (issue 24:
``find MNT -maxdepth 2`` stats ``events/`` and ``info`` of every ship), kept with the
log's persisted index (``index.py``: the card is written in the same atomic replace as
the offsets and timeline beside it, and read back from the index file's tail alone).
Knows nothing of FUSE.

What a card holds: the log's event ``count``, its newest event's mtime as the index's
timeline gives it (``mtime_ns``; None for an empty log), and ``summary``
(:func:`~bookfs.formats.info.log_summary`: everything ``info`` says of the log), as they
were when the card was written by a process that had the log open; and the *witnesses*
they were read under: ``(dev, ino, mode, size, mtime_ns, ctime_ns)`` of the log's
directory, ``book.log``, ``meta.bin`` and ``epoc.txt`` (``lstat``; None for one that is
absent), and when that was recorded.

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

Which logs have one: UIP Book directories (``book.log`` of the layout bookfs writes,
a regular file, not a symlink), the only ones whose index is persisted.  A pier, a vere
layout log or an LMDB epoch has none (:func:`write_card` declines), and a fleet opens it
to answer, as before.

Cost: :func:`read_card` is four ``lstat`` calls and one small ``pread`` of the index
file (no log is opened); :func:`write_card`, at the open of a log whose card is missing
or stale, the log's summary (a few event reads for its dates) and one save of its index.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from dataclasses import dataclass

from bookfs.errors import BookError
from bookfs.formats import index as X
from bookfs.formats.layout import EPOC_NAME, LMDB_DATA_NAME, LOG_NAME, META_NAME, PIER_LOG_DIR

log = logging.getLogger(__name__)

CARD_VERSION = 1
#: the files whose ``lstat`` a card is checked by ("": the log's directory itself)
WITNESSES = ("", LOG_NAME, META_NAME, EPOC_NAME)


@dataclass(frozen=True)
class Card:
    """The figures of a closed log (module docstring)."""

    count: int
    mtime_ns: int | None
    summary: dict


def witnesses(path: str) -> tuple | None:
    """The witnesses of the Book directory ``path`` (module docstring), or None when its
    ``book.log`` is not a regular file (no card can hold) or cannot be looked at."""
    out = []
    for name in WITNESSES:
        try:
            st = os.lstat(os.path.join(path, name) if name else path)
        except FileNotFoundError:
            out.append(None)
            continue
        except OSError:
            return None
        out.append((st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns,
                    st.st_ctime_ns))
    book_log = out[1]
    return tuple(out) if book_log is not None and stat.S_ISREG(book_log[2]) else None


def read_card(path: str) -> tuple[tuple | None, Card | str]:
    """``(witnesses, card)`` of the log in directory ``path`` when its card holds, else
    ``(witnesses, why)``: ``"missing"`` (no index, no card in it, not a UIP Book
    directory) or ``"stale"`` (a card of another state of the files).  Opens no log."""
    seen = witnesses(path)
    if seen is None:
        return None, "missing"
    dev, ino = seen[1][:2]
    raw = X.read_card(os.path.join(path, LOG_NAME), _DevIno(dev, ino))
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
    if said != seen or where != path or not _settled(seen, taken):
        return seen, "stale"
    return seen, card


def write_card(path: str, book) -> bool:
    """Store the card of ``book``, a log just opened from the directory ``path``, with its
    index, unless a card that holds is there already; True if one was written.  Declines
    (False) for a log that has no persisted index (module docstring), one that is not
    exactly its file (a torn tail, damage, trailing bytes: its figures are then not the
    file's alone), and one changed within the racy margin (waited out when it is short).
    Failures are logged, not raised: a card is only a cache."""
    from bookfs.formats.book import Book
    from bookfs.formats.info import log_summary

    if not isinstance(book, Book) or not X.cache_enabled():
        return False
    try:
        seen, held = read_card(path)
        if isinstance(held, Card) or seen is None:
            return False
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
        card["witnesses"], card["taken_ns"] = seen, time.time_ns()
        book.save_card(json.dumps(card, separators=(",", ":")).encode())
        return True
    except (OSError, BookError, ValueError) as e:
        log.warning("%s: could not keep its card: %s", path, e)
        return False


def _settled(seen: tuple, taken_ns: int) -> bool:
    return all(w is None or taken_ns - w[5] >= X.racy_margin(w[5]) for w in seen)


def _settle(path: str, seen: tuple) -> tuple | None:
    """``seen`` once the clock has left the tick of every witness's ctime (waiting for
    that when the margin is short, as :func:`~bookfs.formats.index.settle_stamp`), if the
    files are still as seen; else None."""
    late = max((w[5] + X.racy_margin(w[5]) for w in seen if w is not None), default=0)
    wait = late - time.time_ns()
    if wait > 100_000_000:
        return None  # a coarse clock (whole seconds or ms): not worth a 2 s wait
    if wait > 0:
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
    ``data.mdb``; else ``path`` itself), found without opening the log: what a single
    mount's ``_source_file`` (``fs/nodes/base.py``) finds once it is open."""
    try:
        where = path
        log_dir = os.path.join(path, PIER_LOG_DIR)
        if os.path.isdir(log_dir):
            from bookfs.formats.pier import list_epochs

            names, _ = list_epochs(log_dir)
            where = os.path.join(log_dir, names[-1][1])
        for name in (LOG_NAME, LMDB_DATA_NAME):
            if os.path.exists(os.path.join(where, name)):
                return os.path.join(where, name)
    except (OSError, BookError):
        pass
    return path
