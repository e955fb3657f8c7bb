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

Here are those checks of UIP deeds, the reports an open and ``bookfs fsck`` make
(:class:`RecoveryReport`, :class:`CheckReport`), and the ladder every format fills in
(:class:`Recovery`: check → repair → salvage; :class:`BookDirRecovery` for the two Book
layouts), with the steps they share (``meta.bin``, the noun check, quarantine).  Each format's ladder
is beside its engine (``book_recovery.py``, ``vere_recovery.py``, ``lmdb_recovery.py``,
``pier_recovery.py``); what a salvage writes is ``salvage.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from bookfs.formats.fileio import fsync_dir, pread_into
from bookfs.formats.lock import WriterLock, lock_path_for
from bookfs.formats.layout import (
    DEED_LEN,
    DEED_OVERHEAD,
    DEED_TAIL,
    FILE_MODE,
    LOG_NAME,
    MAX_PAYLOAD,
    MIN_PAYLOAD,
    QUARANTINE_PREFIX,
    crc32,
)

log = logging.getLogger(__name__)

_CRC_CHUNK = 8 << 20  # bytes per pread when checking large deeds / ranges
_SALVAGE_WINDOW = 64 << 20  # bytes examined at a time by find_valid_deeds


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


def deed_crc_ok(fd: int, off: int, n: int) -> bool:
    """Stream the CRC of the deed at ``off`` with payload ``n`` (constant memory)."""
    tail = os.pread(fd, 12, off + 8 + n)
    if len(tail) != 12:  # the deed does not fit in the file (it was cut)
        return False
    want_crc, let = DEED_TAIL.unpack(tail)
    if let != n:
        return False
    crc = 0
    pos, stop = off, off + 8 + n
    while pos < stop:
        chunk = os.pread(fd, min(_CRC_CHUNK, stop - pos), pos)
        if not chunk:
            return False
        crc = crc32(chunk, crc)
        pos += len(chunk)
    return crc == want_crc


_PARALLEL_BYTES = 256 << 20  # ranges larger than this are checked by several processes


def first_bad_deed(fd: int, offsets, start_i: int, end: int, *, progress=None,
                   workers: int | None = None) -> int | None:
    """Index (into ``offsets``) of the first deed from ``start_i`` on whose CRC fails, or
    ``None``.  A range of more than 256 MiB is split between ``workers`` processes (one
    per CPU by default; forked, so the offsets are shared copy-on-write), each checking a
    contiguous part; the smallest failing index wins."""
    count = len(offsets)
    if start_i >= count:
        return None
    workers = workers or os.cpu_count() or 1
    if workers < 2 or end - offsets[start_i] < _PARALLEL_BYTES:
        return _first_bad_serial(fd, offsets, start_i, end, progress=progress)
    bounds = [start_i + (count - start_i) * k // workers for k in range(workers + 1)]
    children = []
    for k in range(1, workers):
        lo, hi = bounds[k], bounds[k + 1]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: check [lo, hi) and report, touching nothing else
            code = 1
            try:
                os.close(r)
                bad = _first_bad_serial(fd, offsets[lo:hi], 0,
                                        offsets[hi] if hi < count else end)
                os.write(w, str(-1 if bad is None else lo + bad).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        children.append((pid, r, offsets[lo], offsets[hi] if hi < count else end))
    try:
        mine = _first_bad_serial(fd, offsets[: bounds[1]], start_i,
                                 offsets[bounds[1]] if bounds[1] < count else end,
                                 progress=progress)
    finally:
        results = []
        for pid, r, lo_off, hi_off in children:
            with os.fdopen(r, "rb") as f:
                text = f.read().decode() or "error"
            _, status = os.waitpid(pid, 0)
            if status != 0 or text == "error":
                raise OSError(f"CRC check of bytes {lo_off}..{hi_off} failed in a worker")
            results.append(int(text))
            if progress is not None:
                progress(hi_off - lo_off)
    if mine is not None:
        return mine
    return next((b for b in results if b >= 0), None)


def _first_bad_serial(fd: int, offsets, start_i: int, end: int, *,
                      progress=None) -> int | None:
    """``first_bad_deed`` in this process: big sequential chunks, each deed checked in
    place."""
    count = len(offsets)
    i = start_i
    if i >= count:
        return None
    scratch = bytearray(min(_CRC_CHUNK, end - offsets[i]))  # no 8 MiB to check one small deed
    while i < count:
        base = offsets[i]
        nxt0 = offsets[i + 1] if i + 1 < count else end
        if nxt0 - base > _CRC_CHUNK:  # one big deed: stream it
            if not deed_crc_ok(fd, base, nxt0 - base - DEED_OVERHEAD):
                return i
            if progress is not None:
                progress(nxt0 - base)
            i += 1
            continue
        # read as many whole deeds as fit in one chunk
        j = i
        while j < count:
            nxt = offsets[j + 1] if j + 1 < count else end
            if nxt - base > _CRC_CHUNK:
                break
            j += 1
        stop = offsets[j] if j < count else end
        mv = pread_into(fd, scratch, stop - base, base)
        if len(mv) != stop - base:
            return i  # the file is shorter than the index says
        u32 = [mv[a : a + (len(mv) - a) // 4 * 4].cast("I") for a in range(4)]
        rel = [o - base for o in offsets[i:j]]
        rel.append(stop - base)
        for a, b in zip(rel, rel[1:]):
            t = b - 12  # where the stored CRC sits
            if crc32(mv[a:t]) != u32[t & 3][t >> 2]:
                return i + rel.index(a)
        if progress is not None:
            progress(stop - base)
        i = j
    return None


def find_valid_deeds(fd: int, start: int, stop: int, *, limit: int | None = None) -> list[int]:
    """Offsets in ``[start, stop)`` where a valid deed (framing and CRC) begins, trying every
    byte offset.  A candidate is accepted only when its length trailer and CRC agree.  Deeds
    must end by ``stop``.  Stops after ``limit`` finds.  Vectorised with numpy, so scanning a
    region of hundreds of MB takes seconds, not hours."""
    import numpy as np

    found: list[int] = []
    pos = start
    while pos < stop - (MIN_PAYLOAD + DEED_OVERHEAD) + 1:
        win = min(_SALVAGE_WINDOW, stop - pos)
        buf = os.pread(fd, win + 7, pos)
        arr = np.frombuffer(buf, dtype=np.uint8)
        cands = []
        for a in range(8):
            usable = (len(arr) - a) // 8 * 8
            if usable <= 0:
                continue
            lens = arr[a : a + usable].view("<u8")
            starts = pos + a + 8 * np.arange(len(lens), dtype=np.int64)
            ok = (lens >= MIN_PAYLOAD) & (lens <= MAX_PAYLOAD)
            ok &= starts < pos + win
            room = (stop - starts - DEED_OVERHEAD).astype(np.int64)
            ok &= lens.astype(np.int64) <= room
            cands.extend(starts[ok].tolist())
        cands.sort()
        for off in cands:
            (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
            if deed_crc_ok(fd, off, n):
                found.append(off)
                if limit is not None and len(found) >= limit:
                    return found
        pos += win
    return found


def is_torn_tail(fd: int, off: int, size: int) -> bool:
    """True when ``[off, size)`` can only be an incomplete final deed (rule 3)."""
    region = size - off
    if region >= 8:
        (n,) = DEED_LEN.unpack(os.pread(fd, 8, off))
        if not (MIN_PAYLOAD <= n <= MAX_PAYLOAD) or off + n + DEED_OVERHEAD <= size:
            return False  # announces no deed, or a complete one that failed its checks
        if region >= MIN_PAYLOAD + DEED_OVERHEAD:
            (let,) = DEED_LEN.unpack(os.pread(fd, 8, size - 8))
            if let + DEED_OVERHEAD == region:
                return False  # a whole deed whose len_d was damaged, not an incomplete one
    return not find_valid_deeds(fd, off + 1, size, limit=1)


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
            chunk = os.pread(fd, min(_CRC_CHUNK, size - pos), pos)
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


def check_nouns(lg, rep: CheckReport, *, bob_dir: str | None = None, progress=None) -> None:
    """Decode-check every readable event of the open log ``lg``
    (:func:`bookfs.noun.payload.payload_problem`: a 4-byte mug, then a jam that cues
    completely and exactly, or vere's ram encoding; the stored mug is not compared, being
    Arvo's state's after the event); adds a ``noun`` problem to ``rep`` for each event that
    does not decode, naming the byte where parsing failed, and counts the events checked
    (``rep.nouns_checked``, ``rep.nouns_ram``).  Events the format itself refuses (a CRC
    or framing failure) are skipped: ``check`` reports them already.  Read-only: nothing
    is repaired or cut because an event does not decode."""
    from bookfs.errors import CorruptDeed
    from bookfs.noun.payload import not_a_noun, payload_problem
    from bookfs.noun.ram import is_ram

    if not lg.count:
        return
    path = getattr(lg, "log_path", None) or getattr(lg, "data_path", None) or lg.directory
    first, last = lg.gulf()
    for event in range(first, last + 1):
        try:
            size = lg.payload_size(event)
            if size > NOUN_WHOLE:  # checked by the format, then read in slices
                lg.verify_event(event)
                ram = is_ram(lg.read_slice(event, 4, 5))
                found = payload_problem(size, lambda off, n: lg.read_slice(event, off, n),
                                        bob_dir)
            else:
                mv = memoryview(lg.read(event))
                size = len(mv)
                ram = is_ram(mv[4:9])
                found = payload_problem(size, lambda off, n: mv[off:off + n], bob_dir)
        except CorruptDeed:
            continue
        rep.nouns_ram += ram
        rep.nouns_checked += 1
        if found is not None:
            rep.problems.append(Problem("noun", None, not_a_noun(event, found), event=event,
                                        path=path, payload_offset=found.offset))
        if progress is not None:
            progress(size)


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
