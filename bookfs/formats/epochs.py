"""An epoch directory of a pier (``reference-formats.md`` §3): what its ``epoc.txt`` says,
which store it holds (a Book log or an LMDB environment, decided by the files' contents,
``epoc.txt`` a cross-check: :func:`store_kind`), and a pier's epochs listed oldest first
(:func:`list_epochs`).  Reads only; opens no log.  ``pier.py`` opens what these name.
"""

from __future__ import annotations

import os

from bookfs.errors import FormatError
from bookfs.formats.fileio import open_regular
from bookfs.formats.layout import (
    EPOC_EITHER,
    EPOC_LMDB,
    EPOC_NAME,
    EPOCH_NAME,
    LMDB_DATA_NAME,
    LOG_NAME,
)


def read_epoc(directory: str) -> bytes | None:
    """What ``epoc.txt`` in ``directory`` says (its bytes, whitespace stripped), or
    ``None`` when there is none."""
    path = os.path.join(directory, EPOC_NAME)
    try:
        fd = open_regular(path, os.O_RDONLY, follow=True)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.pread(fd, 64, 0).strip()
    finally:
        os.close(fd)


def store_kind(directory: str | os.PathLike) -> str | None:
    """``"book"`` or ``"lmdb"``: the store ``directory`` holds, by what its files hold;
    ``None`` when it holds neither ``book.log`` nor ``data.mdb`` and has no ``epoc.txt``.
    Reads only (an LMDB environment is opened read-only, without its lock file).

    ``epoc.txt`` is a cross-check, never the whole answer: 1 and 2 mean LMDB in every
    vere, 3 means ``book.log`` on vere's ``ml/book`` and LMDB (ram events) on ``ml/bob``
    (``docs/format.md``, "Identifying an epoch").

    * ``book.log`` alone: Book; refused (one line, :class:`FormatError`) beside
      ``epoc.txt`` 1 or 2, which no vere writes.
    * ``data.mdb`` alone: LMDB, whatever ``epoc.txt`` says; only a ``data.mdb`` that is
      not an LMDB environment beside ``epoc.txt`` 3 decides nothing, and is Book as
      ``epoc.txt`` said before (the Book engine then refuses the missing ``book.log``).
    * Both: LMDB beside ``epoc.txt`` 1 or 2 (every vere reads ``data.mdb`` there).  Beside
      3 or no ``epoc.txt``, Book (``ml/book`` reads ``book.log``), unless ``book.log``'s
      bytes hold no event while ``data.mdb``'s ``EVENTS`` holds some: the empty
      ``book.log`` that ``ml/book`` creates when it opens an LMDB epoch, whose events are
      in ``data.mdb`` (as ``ml/bob`` reads them).
    * Neither, with an ``epoc.txt``: refused (one line).
    * ``epoc.txt`` other than 1, 2 or 3: refused (one line), as vere refuses it."""
    d = os.fspath(directory)
    epoc = read_epoc(d)
    if epoc is not None and epoc not in (*EPOC_LMDB, EPOC_EITHER):
        raise FormatError(f"{os.path.join(d, EPOC_NAME)}: epoch format {epoc[:20]!r}, "
                          "expected 1, 2 (LMDB) or 3 (Book, or LMDB with ram events)")
    log_path = os.path.join(d, LOG_NAME)
    mdb_path = os.path.join(d, LMDB_DATA_NAME)
    has_book = os.path.lexists(log_path)
    has_mdb = os.path.isfile(mdb_path)
    from bookfs.formats.detect import book_log_holds_events, is_lmdb_file

    said = epoc.decode() if epoc is not None else None
    if has_book and has_mdb:
        if epoc in EPOC_LMDB:
            return "lmdb"
        if is_lmdb_file(mdb_path) and not book_log_holds_events(log_path):
            from bookfs.formats.lmdb_log import event_count

            if event_count(d):
                return "lmdb"
        return "book"
    if has_book:
        if epoc in EPOC_LMDB:
            raise FormatError(
                f"{d}: found {LOG_NAME} and no {LMDB_DATA_NAME}, but {EPOC_NAME} says "
                f"{said}, which means an LMDB epoch ({LMDB_DATA_NAME}); no vere writes "
                f"that (a Book epoch says 3); refused, nothing was changed")
        return "book"
    if has_mdb:
        if epoc == EPOC_EITHER and not is_lmdb_file(mdb_path):
            return "book"
        return "lmdb"
    if epoc is not None:
        raise FormatError(
            f"{d}: {EPOC_NAME} says {said}, but there is neither {LOG_NAME} nor "
            f"{LMDB_DATA_NAME} (expected {LMDB_DATA_NAME}"
            f"{'' if epoc in EPOC_LMDB else f' or {LOG_NAME}'}; a roll cut short leaves "
            "this); refused, nothing was changed")
    return None


def epoch_kind(directory: str) -> str:
    """``lmdb`` or ``book`` for an epoch directory: :func:`store_kind`, which decides by
    the files' contents and uses ``epoc.txt`` as a cross-check."""
    kind = store_kind(directory)
    if kind is None:
        raise FormatError(f"{directory}: no {EPOC_NAME}, {LOG_NAME} or {LMDB_DATA_NAME} "
                          "(not an epoch)")
    return kind


def list_epochs(log_dir: str) -> tuple[list[tuple[int, str]], list[str]]:
    """``([(N, "0iN"), ...] oldest first, [kind, ...])`` for a pier's ``.urb/log``; kinds
    from :func:`epoch_kind`.  :class:`FormatError` when there is no epoch."""
    names = []
    for name in os.listdir(log_dir):
        m = EPOCH_NAME.fullmatch(name)
        if m and os.path.isdir(os.path.join(log_dir, name)):
            names.append((int(m.group(1)), name))
    names.sort()
    if not names:
        raise FormatError(f"{log_dir}: no epoch directories (0i<N>); a pier from before "
                          "epochs is not supported")
    return names, [epoch_kind(os.path.join(log_dir, name)) for _, name in names]
