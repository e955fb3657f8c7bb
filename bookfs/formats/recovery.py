"""Checking deeds and recovering a log after a crash, without destroying evidence.

The rules (``docs/format.md`` states them for users):

1. A deed is *valid* when its framing holds (``4 <= len_d <= 2^32``, it fits in the file,
   ``let_d == len_d``) and its CRC matches.
2. Recovery finds the longest prefix of valid deeds.  The bytes after it, if any, are the
   *bad region*.
3. The bad region is a *torn tail* when it can only be an incomplete final deed: it is
   shorter than the deed its first bytes announce (or too short to announce one), it does
   not end with a length trailer that closes a deed at its start (that is a whole deed
   whose ``len_d`` was damaged), and no valid deed starts anywhere inside it.  A torn tail
   is cut.
4. Any other bad region may hold valid events.  Its bytes are first copied aside to a
   quarantine file beside the log (fsync'd), then the log is cut back to the valid prefix.
   The quarantine file is reported; ``bookfs fsck --salvage`` can recover events from it.
5. A read-only open never modifies anything; it simply stops at the valid prefix.

Here are the reports an open and ``bookfs fsck`` make
(:class:`RecoveryReport`, :class:`CheckReport`), and the ladder every format fills in
(:class:`Recovery`: check → repair → salvage; :class:`BookDirRecovery` for the two Book
layouts), with the steps they share (``meta.bin``, the noun check, quarantine).  Each format's ladder
is beside its engine (``book_recovery.py``, ``vere_recovery.py``, ``lmdb_recovery.py``,
``pier_recovery.py``); what a salvage writes is ``salvage.py``.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

# the deed checks live in deedcheck.py; named here too, beside the rules they serve
from bookfs.formats import deedcheck
from bookfs.formats.deedcheck import (deed_crc_ok, find_valid_deeds,  # noqa: F401
                                      first_bad_deed, in_workers, is_torn_tail)
from bookfs.formats.fileio import fsync_dir
from bookfs.formats.lock import WriterLock, lock_path_for
from bookfs.formats.layout import (
    FILE_MODE,
    LOG_NAME,
    QUARANTINE_PREFIX,
)

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What opening a log found and did.  Empty lists mean the log was clean."""

    torn_tail: tuple[int, int] | None = None  # (offset, bytes) cut
    quarantined: list[tuple[str, int, int]] = field(default_factory=list)  # (path, offset, bytes)
    bad_region: tuple[int, int] | None = None  # (offset, bytes) excluded (read-only opens)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.torn_tail is None and not self.quarantined and self.bad_region is None


@dataclass
class VereRecoveryReport(RecoveryReport):
    """What opening a vere log found and did, beyond :class:`RecoveryReport`."""

    slot: str | None = None  # "A"/"B": the slot whose state is committed; None: framing only
    bad_slots: list[str] = field(default_factory=list)  # "B: CRC mismatch (...)", ...
    rolled_back: tuple[int, int] | None = None  # (first, last) events a header claimed, dropped
    header_repaired: str | None = None  # the slot rewritten to describe the recovered state

    @property
    def clean(self) -> bool:
        return (super().clean and not self.bad_slots and self.rolled_back is None
                and self.header_repaired is None)


def quarantine(dir_fd_path: str, fd: int, off: int, size: int) -> str:
    """Copy ``[off, size)`` of the log to a new quarantine file beside it, durably.
    Returns its path.  The file name says what it is and where the bytes came from."""
    name = f"{QUARANTINE_PREFIX}{off}-{int(time.time())}"
    path = os.path.join(dir_fd_path, name)
    k = 0
    while os.path.exists(path):
        k += 1
        path = os.path.join(dir_fd_path, f"{name}.{k}")
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(out, FILE_MODE)  # regardless of umask, like the log itself
        pos = off
        while pos < size:
            chunk = os.pread(fd, min(deedcheck._CRC_CHUNK, size - pos), pos)
            if not chunk:
                break
            os.write(out, chunk)
            pos += len(chunk)
        os.fsync(out)
    finally:
        os.close(out)
    fsync_dir(dir_fd_path)
    return path




# --- the recovery ladder every format fills in ---------------------------------------------
#
# ``bookfs fsck`` (and nothing else) drives it: ``pier_recovery.recovery_for(path)`` identifies the
# source with the same detection ``open_source`` uses and returns the format's ``Recovery``,
# each beside its engine: ``book_recovery.BookRecovery`` (UIP layout),
# ``vere_recovery.VereRecovery``, ``lmdb_recovery.LmdbRecovery``,
# ``pier_recovery.PierRecovery``.  What a salvage writes is ``salvage.py``.  No tool parses
# bytes of a format it has not identified.


@dataclass
class Problem:
    """One finding.  ``kind``: header | slot | meta | crc | framing | torn-tail | garbage |
    rollback | noun | read | chain.  ``offset`` is a byte offset in ``path`` (the log)."""

    kind: str
    offset: int | None
    message: str
    event: int | None = None
    path: str | None = None
    #: ``noun`` problems: the byte of the event's payload where parsing failed
    payload_offset: int | None = None


@dataclass
class CheckReport:
    """What :meth:`Recovery.check` found; nothing was modified to find it.

    ``repairs`` says what :meth:`Recovery.repair` would do; ``parts`` are a pier's epochs;
    ``state`` holds the format's own findings for its ``repair``/``salvage``."""

    path: str
    format: str
    first: int = 0
    last: int = 0
    events: int = 0
    problems: list[Problem] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    nouns_checked: int = 0  # events decode-checked (``--nouns``)
    nouns_ram: int = 0  # of which in vere's ram encoding
    parts: list["CheckReport"] = field(default_factory=list)
    state: object = field(default=None, repr=False)

    @property
    def clean(self) -> bool:
        return not self.problems and all(p.clean for p in self.parts)

    def all_problems(self) -> list[Problem]:
        out = list(self.problems)
        for p in self.parts:
            out += p.all_problems()
        return out


class Recovery:
    """The recovery ladder for one identified source: ``check`` (read-only, reports every
    problem with its offset) → ``repair`` (only what is safe for the format, never
    destroying bytes that may hold events: they are quarantined first) → ``salvage``
    (every recoverable event copied into a new log).  Subclasses live with their format.
    """

    #: the source kind: uip | vere | lmdb | pier
    kind: str = ""
    #: False for a format bookfs never writes: ``repair`` always refuses (``ReadOnly``)
    writes: bool = True

    def __init__(self, path: str, *, pier_locked: bool = False):
        self.path = os.fspath(path)
        #: the caller holds the pier's ``.vere.lock``: repairs skip the epoch's own lock
        self.pier_locked = pier_locked
        #: the pier's ``.urb/bob`` (bob atoms of ram events), when ``path`` is in a pier
        self.bob_dir = bob_dir_for(self.path)

    def size(self) -> int:
        """Bytes ``check`` reads (for a progress bar)."""
        return 0

    def open_log(self):
        """The source opened read-only with its engine (an ``EventLog``)."""
        raise NotImplementedError

    def check(self, *, mugs: bool = False, progress=None) -> CheckReport:
        """Read-only: every problem with its offset.  ``mugs`` (``--nouns``, and its alias
        ``--mugs``): also decode-check every event (:func:`check_nouns`)."""
        raise NotImplementedError

    def repair(self, report: CheckReport) -> list[str]:
        """Do the safe repairs ``report`` lists; returns what was done, one line each.
        Raises :class:`~bookfs.errors.ReadOnly` for a format bookfs does not write."""
        raise NotImplementedError

    def salvage(self, report: CheckReport, out: str, *, progress=None) -> dict:
        """Copy every recoverable event into a new log at ``out`` and write
        ``out/salvage-report.json``; returns that report.

        Only deeds the format's recovery counts as committed, or that a committed header
        vouches for past damage, become events of the new log.  Everything else that may
        hold an event (bytes past the committed end, a batch that is rolled back, damaged
        bytes, payloads under 4 bytes) is copied byte for byte to ``out/``
        :data:`LEFT_OUT_NAME` and listed under ``left_out`` in the report, never as events.
        The result is built beside ``out`` and published by rename
        (:func:`publish_salvage`): a killed salvage leaves ``out`` as it was, and running
        it again starts over."""
        from bookfs.formats.salvage import publish_salvage

        return publish_salvage(self.path, out, lambda root: self.salvage_into(
            report, root, progress=progress))

    def salvage_into(self, report: CheckReport, out: str, *, progress=None) -> dict:
        """:meth:`salvage`'s work, into the new directory ``out`` (not yet published);
        returns the report's content."""
        raise NotImplementedError

    # shared steps ------------------------------------------------------------------------

    def _check_nouns(self, rep: CheckReport, progress=None) -> None:
        with self.open_log() as lg:
            check_nouns(lg, rep, bob_dir=self.bob_dir, progress=progress)


class BookDirRecovery(Recovery):
    """The ladder for a Book directory in either layout (``book_recovery.py``,
    ``vere_recovery.py``): its ``book.log``, its layout's ``engine``, and repairs made
    under the writer lock."""

    #: the layout's engine (:class:`~bookfs.formats.book.Book` or
    #: :class:`~bookfs.formats.vere.VereBook`)
    engine: type

    @property
    def log_path(self) -> str:
        return os.path.join(self.path, LOG_NAME)

    def open_log(self):
        return self.engine.open(self.path)

    def _finish_check(self, rep: CheckReport, mugs: bool, progress) -> CheckReport:
        """``check``'s last steps: each problem names the log unless it names another
        file (``meta.bin``); then, when ``mugs`` (``--nouns``), every event is
        decode-checked."""
        for p in rep.problems:
            p.path = p.path or self.log_path
        if mugs:
            self._check_nouns(rep, progress)
        return rep

    @contextlib.contextmanager
    def _repairing(self):
        """Hold the writer lock a repair needs: the one :func:`lock_path_for` names for
        the directory, or none when the caller holds the pier's (``pier_locked``)."""
        lock = None if self.pier_locked else WriterLock(lock_path_for(self.path))
        try:
            yield
        finally:
            if lock is not None:
                lock.release()


#: what ``--mugs`` says, once, now that it means ``--nouns`` (``verify`` and ``fsck``)
MUGS_NOTE = ("--mugs is --nouns: an event's stored mug is the mug of Arvo's state after "
             "the event, not of the event's noun, so it cannot be checked without replaying "
             "the ship; every event is decode-checked instead")

#: payloads up to this are read whole to be decode-checked; larger ones in slices
NOUN_WHOLE = 16 << 20
_NOUN_RUN = 4096  # events read in one run by check_nouns (at most deedcheck._CRC_CHUNK bytes)


def bob_dir_for(path: str | None) -> str | None:
    """The ``.urb/bob`` directory of the pier ``path`` belongs to (``path`` being the pier,
    its ``.urb/log`` or an epoch ``.urb/log/0iN``), or None when ``path`` is in no pier.
    Bob atoms of ram events (vere ``ml/bob``) live there."""
    if not path:
        return None
    p = os.path.abspath(os.fspath(path))
    for _ in range(3):
        if os.path.isdir(os.path.join(p, ".urb", "log")):
            return os.path.join(p, ".urb", "bob")
        if os.path.basename(p) == ".urb" and os.path.isdir(os.path.join(p, "log")):
            return os.path.join(p, "bob")
        p = os.path.dirname(p)
    return None


def check_nouns(lg, rep: CheckReport, *, bob_dir: str | None = None, progress=None,
                crc_failed=None, workers: int | None = None) -> None:
    """Decode-check every readable event of the open log ``lg``
    (:func:`bookfs.noun.payload.payload_problem`: a 4-byte mug, then a jam that cues
    completely and exactly, or vere's ram encoding; the stored mug is not compared, being
    Arvo's state's after the event); adds a ``noun`` problem to ``rep`` for each event that
    does not decode, naming the byte where parsing failed, and counts the events checked
    (``rep.nouns_checked``, ``rep.nouns_ram``).  Events the format itself refuses (a CRC
    or framing failure) are skipped: ``check`` reports them already.  Read-only: nothing
    is repaired or cut because an event does not decode.

    ``crc_failed``: the events whose check the format has just failed, when every other
    event's was just checked (``bookfs verify``'s first pass: ``lg.verify()``, which also
    confirms the index).  Then a single-file log's payloads are read in runs of up to
    8 MiB without checking their CRCs a second time, and a log of more
    than 256 MiB is split between ``workers`` processes (one per CPU by default; forked,
    each checking a contiguous range of events: ``deedcheck.in_workers``)."""
    if not lg.count:
        return
    first, last = lg.gulf()
    batched = crc_failed is not None and hasattr(lg, "read_payloads_unchecked") \
        and hasattr(lg, "payload_bounds")
    skip = frozenset(crc_failed or ())
    workers = workers or os.cpu_count() or 1
    if not batched or workers < 2 or lg.log_bytes < deedcheck._PARALLEL_BYTES:
        found = _nouns_range(lg, first, last, bob_dir, progress, skip if batched else None)
        _add_nouns(lg, rep, found)
        return
    bounds = [first + (last + 1 - first) * k // workers for k in range(workers + 1)]

    def part(k: int, progress=None):  # events bounds[k] .. bounds[k + 1] - 1
        return _nouns_range(lg, bounds[k], bounds[k + 1] - 1, bob_dir, progress, skip)

    def done(_, found) -> None:
        if progress is not None:
            progress(found[3])

    for found in in_workers(workers, part, progress, done, "the noun check"):
        _add_nouns(lg, rep, found)


def _add_nouns(lg, rep: CheckReport, found) -> None:
    from bookfs.noun.payload import not_a_noun

    checked, ram, problems, _ = found
    path = getattr(lg, "log_path", None) or getattr(lg, "data_path", None) or lg.directory
    rep.nouns_checked += checked
    rep.nouns_ram += ram
    for event, problem in problems:
        rep.problems.append(Problem("noun", None, not_a_noun(event, problem), event=event,
                                    path=path, payload_offset=problem.offset))


def _nouns_range(lg, lo: int, hi: int, bob_dir, progress, skip) -> tuple:
    """:func:`check_nouns` of events ``lo..hi``: ``(checked, ram, [(event, problem)],
    payload bytes)``.  ``skip``: None to read each event checked by the format (its
    failures skipped); else the events to skip, the rest read in runs, unchecked."""
    from bookfs.errors import CorruptDeed
    from bookfs.noun.payload import payload_problem
    from bookfs.noun.ram import is_ram

    checked = ram = nbytes = 0
    problems = []
    event = lo
    while event <= hi:
        if skip is None or lg.payload_size(event) > NOUN_WHOLE:
            run = None  # one event, read as the format reads it
        else:
            bounds = lg.payload_bounds(event, min(_NOUN_RUN, hi - event + 1))
            run = max(bisect.bisect_right(bounds, bounds[0] + deedcheck._CRC_CHUNK) - 1, 1)
        if run is None:
            try:
                size = lg.payload_size(event)
                if size > NOUN_WHOLE:  # checked by the format, then read in slices
                    lg.verify_event(event)
                    ev = event
                    r = is_ram(lg.read_slice(event, 4, 5))
                    got = payload_problem(size, lambda off, n: lg.read_slice(ev, off, n),
                                          bob_dir)
                    payloads = None
                else:
                    payloads = [memoryview(lg.read(event))]
            except CorruptDeed:
                event += 1
                continue
            if payloads is None:
                checked, ram, nbytes = checked + 1, ram + r, nbytes + size
                if got is not None:
                    problems.append((event, got))
                if progress is not None:
                    progress(size)
                event += 1
                continue
        else:
            payloads = lg.read_payloads_unchecked(event, event + run - 1)
        done = 0
        for j, mv in enumerate(payloads):
            if skip and event + j in skip:
                continue
            size = len(mv)
            ram += is_ram(mv[4:9])
            got = payload_problem(size, lambda off, n: mv[off:off + n], bob_dir)
            if got is not None:
                problems.append((event + j, got))
            checked += 1
            done += size
        nbytes += done
        if progress is not None:
            progress(done)
        event += len(payloads)
    return checked, ram, problems, nbytes

def check_meta_file(directory: str, rep: CheckReport) -> bool:
    """Report a missing or wrong-sized ``meta.bin`` in ``rep``; True if it is missing
    (``repair`` then creates it zero-filled, as a writable open does)."""
    from bookfs.formats.layout import META_NAME, META_SIZE

    meta = os.path.join(directory, META_NAME)
    try:
        size = os.stat(meta).st_size
    except FileNotFoundError:
        rep.problems.append(Problem("meta", None, f"{meta} is missing (a writable open, or "
                                    "fsck --repair, creates it zero-filled)", path=meta))
        rep.repairs.append(f"create {meta} zero-filled")
        return True
    if size != META_SIZE:
        rep.problems.append(Problem("meta", None, f"{meta} has {size} bytes, expected "
                                    f"{META_SIZE}", path=meta))
    return False


def create_meta_file(directory: str) -> str | None:
    """Create a missing ``meta.bin`` zero-filled, durably; returns the action taken."""
    from bookfs.formats.fileio import create_files
    from bookfs.formats.layout import META_NAME, META_SIZE

    meta = os.path.join(directory, META_NAME)
    if os.path.lexists(meta):
        return None
    create_files(directory, [(meta, bytes(META_SIZE))])
    return f"created {meta} zero-filled ({META_SIZE} bytes), as the reference does"
