"""``bookfs migrate``: copy LMDB epochs into Book logs, restartably and verified.

Sources and destinations
------------------------
* A single LMDB epoch directory (``data.mdb`` with ``EVENTS``) becomes one Book directory
  ``DEST`` (``book.log``, ``meta.bin``).
* A pier (``.urb/log/``) becomes ``DEST/0i<N>/`` for each of its LMDB epochs, with
  ``epoc.txt`` (``3``) and the epoch's ``vere.txt``, ready to replace the LMDB epoch
  directories of the pier (stop the ship first; ``image.bin`` snapshots are not copied).
  The pier's Book epochs are left alone.  The pier must not be running: a held
  ``.vere.lock`` is refused.

Meta (version, who, fake, life) is copied from the META database into ``meta.bin``: the
pier's top-level ``.urb/log/data.mdb``, or for a single epoch its own META database (or
its pier's, if the epoch sits in one).

Guarantees
----------
* **Streaming**: one LMDB cursor pass, zero-copy values, batches of at most 16 MB (and at
  most 10,000 events) written with one ``save`` each.  Memory does not grow with the log.
* **Verified**: after each batch is durable, every event is re-read from the new log (its
  CRC checked) and compared byte for byte with the LMDB value.
* **Restartable**: everything is written under ``DEST.partial/`` and renamed into place at
  the end.  After a crash, rerunning the same command opens the partial log writable (Book
  recovery cuts a torn tail), re-verifies whatever had not yet been verified, and resumes
  after its last event.  ``DEST.partial/.bookfs-migrate`` records the source and layout;
  a different source is refused.
* **No overwrite**: a ``DEST`` that exists and is not an empty directory is refused,
  unless it holds this very migration, finished (``DEST/.bookfs-migrated``: the same
  source, layout and event ranges): then nothing is written and the command says it is
  already complete (exit 0), as ``bookfs sample`` does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from bookfs.errors import BookError, ContiguityError, CorruptDeed, LockHeld, MetaAbsent
from bookfs.formats.fileio import fsync_dir, publish_dir
from bookfs.formats.layout import META_FIELDS

#: A batch is written once it holds this many payload bytes ...
BATCH_BYTES = 16 << 20
#: ... or this many events (bounds the per-event bookkeeping of one batch).
BATCH_EVENTS = 10_000

PARTIAL_SUFFIX = ".partial"
STAMP_NAME = ".bookfs-migrate"
#: Left in DEST by a finished migration: its stamp (source, layout) and each epoch's event
#: range, so that the same command run again says it is complete instead of refusing.
DONE_NAME = ".bookfs-migrated"
VERIFIED_PREFIX = ".verified-"
LAYOUTS = ("uip", "vere")

#: Test hook: exit abruptly (``os._exit``) once this many events were saved in this run,
#: after the save and before it is verified, as a crash would.
CRASH_ENV = "BOOKFS_MIGRATE_CRASH_AFTER"
#: Test hook: ``bookfs migrate`` sleeps this many seconds after each verified batch (so a
#: test can press Ctrl-C mid-way through a small log).
SLOW_ENV = "BOOKFS_MIGRATE_SLOW"

Progress = Callable[[int], None]  # called with a number of events just migrated


@dataclass
class MigratedEpoch:
    name: str  # directory name under DEST (a pier) or DEST's own name
    first: int
    last: int
    count: int
    resumed: int  # events already in the partial log when this run started


@dataclass
class MigrateReport:
    dest: str
    layout: str
    epochs: list[MigratedEpoch] = field(default_factory=list)
    #: DEST already held this very migration (same source, layout and events): nothing
    #: was written this time
    already: bool = False

    @property
    def events(self) -> int:
        return sum(e.count for e in self.epochs)

    @property
    def resumed(self) -> int:
        return sum(e.resumed for e in self.epochs)


@dataclass
class _Job:
    name: str  # target directory name inside the staging root
    base: int | None
    log: object  # an LmdbLog
    vere_txt: bytes | None


def _open_dest(directory: str, layout: str, base: int):
    if layout == "vere":
        try:
            from bookfs.formats.layout import epoch_of_directory
            from bookfs.formats.vere import VereBook
        except ImportError:
            raise BookError("the vere layout needs bookfs.formats.vere, which this bookfs lacks; "
                            "use --layout uip") from None
        named = epoch_of_directory(directory)
        if named is not None and named != base:
            raise BookError(f"{directory}: named 0i{named}, but the source epoch starts after "
                            f"event {base}; the vere layout takes its base from the name")
        return VereBook.open(directory, writable=True, create=True,
                             epoch=None if named is not None else base)
    from bookfs.formats.book import Book

    return Book.open(directory, writable=True, create=True)


def _write_file(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_int(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return int(f.read(32).strip() or b"0")
    except (OSError, ValueError):
        return 0


def _dir_is_empty(path: str) -> bool:
    with os.scandir(path) as it:
        return next(it, None) is None


#: What each runtime reads: vere opens a pier's epoch with ``epoc.txt`` 3 only in vere's
#: two-slot layout; the UIP layout is read by bookfs alone, so it is only ever written as a
#: single Book directory, never into a pier.
DEFAULT_LAYOUT = "vere"


def migrate(source: str | os.PathLike, dest: str | os.PathLike, layout: str | None = None,
            progress: Progress | None = None) -> MigrateReport:
    """Migrate the LMDB epoch or pier ``source`` to Book log(s) at ``dest`` (see the module
    docstring).  ``layout``: ``vere`` (vere's two-slot layout, the default: what the
    runtime reads) or ``uip`` (bookfs's own, for a single epoch only: a pier with a
    UIP-layout ``book.log`` beside ``epoc.txt`` 3 opens in no runtime, so that is refused).
    The source may be a pier (its epochs not yet in ``layout`` are converted: LMDB, or
    Book in the other layout), an LMDB epoch, or a Book directory in either layout.
    ``progress(n)`` is called with event counts as they are done (including, first, the
    events a resumed run finds already done).  Returns a :class:`MigrateReport`."""
    from bookfs.formats.lmdb_log import LmdbLog
    from bookfs.formats.pier import Pier

    layout = layout or DEFAULT_LAYOUT
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    src = os.path.abspath(os.fspath(source))
    dst = os.path.abspath(os.fspath(dest))
    staging = dst + PARTIAL_SUFFIX
    root = os.path.join(staging, os.path.basename(dst))
    finished = None  # what DEST says a finished migration into it was
    if os.path.lexists(dst) and not (os.path.isdir(dst) and _dir_is_empty(dst)):
        if os.path.isdir(staging) and not os.path.exists(root):
            shutil.rmtree(staging)  # a finished run that crashed while tidying up
        finished = _read_done(dst)
        if finished is None:
            raise BookError(f"{dst}: already exists and is not empty; refusing to overwrite "
                            "it (remove it or choose another DEST)")
    if src == dst or dst.startswith(src + os.sep):
        raise BookError(f"{dst}: inside the source {src}; choose a DEST outside it")

    from bookfs.formats.pier import identify, open_book_dir

    pier = single = None
    try:
        kind, _ = identify(src)
        if kind == "pier":
            if layout != "vere":
                raise BookError(f"{src}: a pier's Book epochs (epoc.txt 3) open in vere only "
                                "in vere's layout; --layout uip would write a pier no runtime "
                                "reads (use --layout vere, the default)")
            _refuse_running(src)
            pier = Pier.open(src)
            jobs = []
            for name, base, log in pier.epochs:
                if _layout_of(log) != layout:
                    try:
                        with open(os.path.join(log.directory, "vere.txt"), "rb") as f:
                            vere_txt = f.read(256)
                    except OSError:
                        vere_txt = None
                    jobs.append(_Job(name, base, log, vere_txt))
            if not jobs:
                raise BookError(f"{src}: every epoch of the pier is already in the {layout} "
                                "layout; nothing to migrate")
        elif kind == "lmdb":
            _refuse_running(os.path.dirname(os.path.dirname(os.path.dirname(src))))
            single = LmdbLog.open(src)
            jobs = [_Job(os.path.basename(dst), single.base, single, None)]
        else:  # a Book directory in either layout: a verified copy in ``layout``
            single = open_book_dir(src)
            base = getattr(single, "epoch", None)
            if base is None:
                base = single.first - 1 if single.count else 0
            jobs = [_Job(os.path.basename(dst), base, single, None)]

        stamp = json.dumps({"source": src, "layout": layout, "pier": pier is not None},
                           sort_keys=True).encode()
        ranges = [[job.name, job.log.first, job.log.last, job.log.count] for job in jobs]
        if finished is not None:
            if finished.get("stamp") != stamp.decode() or finished.get("epochs") != ranges:
                raise BookError(f"{dst}: already holds a migration of another source, layout "
                                "or event range; refusing to overwrite it (remove it or "
                                "choose another DEST)")
            report = MigrateReport(dst, layout, already=True)
            report.epochs = [MigratedEpoch(n, f, la, c, c) for n, f, la, c in ranges]
            return report
        _prepare_staging(staging, root, stamp)
        report = MigrateReport(dst, layout)
        for job in jobs:
            target = os.path.join(root, job.name) if pier is not None else root
            marker = os.path.join(staging, VERIFIED_PREFIX + job.name)
            report.epochs.append(_migrate_one(job, target, marker, layout, progress))
            if pier is not None:
                _write_file(os.path.join(target, "epoc.txt"), b"3")
                if job.vere_txt is not None:
                    _write_file(os.path.join(target, "vere.txt"), job.vere_txt)
                fsync_dir(target)
    finally:
        if pier is not None:
            pier.close()
        if single is not None:
            single.close()

    # Everything is verified and durable: say so in it, move it into place, tidy up.
    _write_file(os.path.join(root, DONE_NAME), json.dumps(
        {"stamp": stamp.decode(), "epochs": ranges}, sort_keys=True).encode())
    fsync_dir(root)
    publish_dir(root, dst)
    shutil.rmtree(staging)
    return report


def _layout_of(log) -> str:
    """``uip``, ``vere`` or ``lmdb``: the on-disk layout of an open epoch's log."""
    word = log.format.split(" ")[0]
    return {"book-v1": "uip", "vere-book": "vere"}.get(word, word)


def _values(log, start: int, end: int):
    """``(event, payload)`` for ``start..end``: zero-copy from LMDB, checked reads else."""
    if hasattr(log, "iter_buffers"):
        return log.iter_buffers(start, end)
    return log.walk(start, end)


def _refuse_running(pier_dir: str) -> None:
    """Raise :class:`LockHeld` if ``pier_dir`` is a pier whose ``.vere.lock`` is held."""
    from bookfs.formats.lock import WriterLock, describe_holder
    from bookfs.formats.pier import LOCK_NAME, is_pier

    lock_path = os.path.join(pier_dir, LOCK_NAME)
    if is_pier(pier_dir) and WriterLock.is_held(lock_path):
        raise LockHeld(f"{lock_path}: the pier is in use by {describe_holder(lock_path)}; "
                       "stop the ship before migrating")


def _read_done(dst: str) -> dict | None:
    """The record :data:`DONE_NAME` a finished migration left in ``dst`` (None if none)."""
    try:
        with open(os.path.join(dst, DONE_NAME), "rb") as f:
            done = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) else None


def _prepare_staging(staging: str, root: str, stamp: bytes) -> None:
    if os.path.isdir(staging):
        try:
            with open(os.path.join(staging, STAMP_NAME), "rb") as f:
                old = f.read(1 << 16)
        except FileNotFoundError:
            old = None
        if old != stamp:
            what = json.loads(old)["source"] if old else "an unknown source"
            raise BookError(f"{staging}: holds an unfinished migration from {what}; rerun "
                            "that migration or remove this directory")
    else:
        os.makedirs(staging)
        _write_file(os.path.join(staging, STAMP_NAME), stamp)
        fsync_dir(staging)
        fsync_dir(os.path.dirname(staging))
    os.makedirs(root, exist_ok=True)


def _verify(book, first: int, values, path: str) -> None:
    """Byte-compare what the log now holds for ``first..`` with the source ``values`` (one
    ``pread`` for the whole batch)."""
    written = book.read_payloads_unchecked(first, first + len(values) - 1)
    k = 0
    while k < len(values):  # compare runs of about 1 MiB at a time (bounded memory)
        j, size = k, 0
        while j < len(values) and size < 1 << 20:
            size += len(values[j])
            j += 1
        same = (b"".join(written[k:j]) == b"".join(values[k:j])
                and all(len(a) == len(b) for a, b in zip(written[k:j], values[k:j])))
        if not same:
            bad = next(i for i in range(k, j) if bytes(written[i]) != bytes(values[i]))
            raise CorruptDeed(f"{path}: event {first + bad} reads back different from the "
                              "source", event=first + bad)
        k = j


def _migrate_one(job: _Job, target: str, marker: str, layout: str,
                 progress: Progress | None) -> MigratedEpoch:
    src = job.log
    s_first, s_last = src.gulf()
    base = job.base if job.base is not None else (s_first - 1 if src.count else 0)
    book = _open_dest(target, layout, base)
    try:
        try:
            meta = src.meta()
        except MetaAbsent:  # a Book source without meta.bin: the copy's stays zero-filled
            meta = {key: book.read_meta(key) for key in META_FIELDS}
        for key in META_FIELDS:
            if book.read_meta(key) != meta[key]:
                book.save_meta(key, meta[key])
        resumed = book.count
        if resumed:
            d_first, d_last = book.gulf()
            if d_first != s_first or d_last > s_last:
                raise ContiguityError(
                    f"{target}: the partial log holds events {d_first}..{d_last}, "
                    f"which do not fit the source's {s_first}..{s_last}; remove "
                    f"{os.path.dirname(marker)} and start again")
            verified = max(_read_int(marker), d_first - 1)
            if verified < d_last:  # saved before a crash but never compared: compare now
                for event, value in _values(src, verified + 1, d_last):
                    if book.read(event) != value:
                        raise CorruptDeed(f"{target}: event {event} reads back different "
                                          "from the source", event=event)
                _write_file(marker, str(d_last).encode())
            if progress:
                progress(resumed)
        nxt = book.last + 1 if book.count else s_first
        crash_after = int(os.environ.get(CRASH_ENV, "0") or 0)
        saved = 0
        if src.count and nxt <= s_last:
            batch: list = []
            batch_bytes = 0
            start = nxt
            for event, value in _values(src, nxt, s_last):
                batch.append(value)
                batch_bytes += len(value)
                if (batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_EVENTS
                        or event == s_last):
                    # flush before the cursor moves on: the values point into the map
                    book.save(start, batch, epoch=base)
                    saved += len(batch)
                    if crash_after and saved >= crash_after:
                        os._exit(75)
                    _verify(book, start, batch, getattr(book, "log_path", target))
                    _write_file(marker, str(event).encode())
                    if progress:
                        progress(len(batch))
                    start = event + 1
                    batch, batch_bytes = [], 0
        if book.gulf() != src.gulf():  # pragma: no cover - a bug, never the disk
            raise BookError(f"{target}: holds {book.gulf()}, source {src.gulf()}")
        count = book.count
    finally:
        book.close()
    return MigratedEpoch(os.path.basename(target), s_first, s_last, count, resumed)


# --- the command ---------------------------------------------------------------------------


class _Interrupted(Exception):
    """Ctrl-C was pressed; raised from the progress callback, after a batch is verified."""


def cmd_migrate(args) -> int:
    """The ``bookfs migrate`` command.  Ctrl-C stops after the batch being written is
    verified (a second Ctrl-C at once) and says what ``DEST.partial`` holds."""
    from bookfs.cli.commands import _progress_bar, _SigintFlag
    from bookfs.cli.args import EXIT_INTERRUPTED
    from bookfs.formats.pier import open_source

    try:
        with open_source(args.source) as lg:
            total = lg.count
    except BookError:
        total = 0  # migrate() reports the problem
    dest = os.path.abspath(args.dest)
    slow = float(os.environ.get(SLOW_ENV) or 0)
    with _progress_bar(total, "migrate", unit="ev") as bar, _SigintFlag() as stop:
        done = 0

        def progress(n: int) -> None:
            nonlocal done
            done += n
            bar.update(n)
            if slow:
                import time

                time.sleep(slow)
            if stop():
                raise _Interrupted

        try:
            report = migrate(args.source, args.dest, layout=args.layout, progress=progress)
        except (_Interrupted, KeyboardInterrupt):
            held = (f"{dest}{PARTIAL_SUFFIX} holds the first {done:,} of {total:,} events, "
                    "verified" if os.path.isdir(dest + PARTIAL_SUFFIX) else
                    f"nothing was written ({dest} is as it was)")
            print(f"bookfs migrate: interrupted; {held}; run the same command again to "
                  "resume", file=sys.stderr)
            return EXIT_INTERRUPTED
    if report.already:
        events = sum(e.count for e in report.epochs)
        print(f"bookfs migrate: {report.dest} already holds this migration ({events:,} "
              f"events in the {report.layout} layout, verified when written): already "
              "complete, nothing written")
        return 0
    for e in report.epochs:
        span = f"events {e.first}..{e.last}" if e.count else "no events"
        again = f" ({e.resumed} already done by an earlier run)" if e.resumed else ""
        print(f"bookfs migrate: {e.name}: {span} ({e.count} events), every one verified"
              f"{again}")
    reader = ("vere and bookfs read it" if report.layout == "vere"
              else "bookfs reads it; vere does not")
    print(f"bookfs migrate: wrote {report.dest} in the {report.layout} layout ({reader})")
    return 0


def register(subparsers) -> None:
    """Add the ``migrate`` subcommand to ``bookfs``'s subparsers."""
    s = subparsers.add_parser("migrate", help="copy a log into Book logs", description=(
        "Copy SOURCE into Book logs at DEST.  SOURCE is an LMDB epoch, a Book directory "
        "(either layout) or a pier.  A single epoch becomes the Book directory DEST; a "
        "pier's epochs not yet in the layout become DEST/0iN/ (with epoc.txt 3), ready "
        "to replace the pier's epochs (stop the ship first).  The default layout is vere's "
        "two-slot layout, the one the runtime reads; --layout uip (bookfs only) is allowed "
        "for a single epoch, never for a pier.  Meta is copied into meta.bin.  Every event "
        "is re-read and compared after writing.  Work goes to DEST.partial/ and is renamed "
        "into place at the end: after a crash or Ctrl-C, run the same command again to "
        "resume.  An existing non-empty DEST is never overwritten; run again after it "
        "finished, the same command says it is complete and exits 0."))
    from bookfs.cli.args import dir_to_create, log_source

    s.add_argument("source", type=log_source,
                   help="LMDB epoch, Book directory or pier, or a bookfs mount of one")
    s.add_argument("dest", type=dir_to_create,
                   help="new Book directory (or directory of epochs, for a pier), in an "
                        "existing directory")
    s.add_argument("--layout", choices=LAYOUTS, default=DEFAULT_LAYOUT,
                   help="vere: vere's two-slot layout (default); uip: bookfs's UIP layout "
                        "(single epochs only)")
    s.set_defaults(func=cmd_migrate)
