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

Here is the ladder every format fills in (:class:`Recovery`: check → repair → salvage;
:class:`BookDirRecovery` for the two Book layouts), with the ``meta.bin`` steps they
share, and nothing else: the deed checks are ``deedcheck.py``, the reports
``reports.py`` (:class:`~bookfs.formats.reports.CheckReport` and its problems, re-named
here as the ladder's vocabulary), keeping bytes aside ``quarantine.py``, the noun check
``nouncheck.py``.  Each format's ladder is beside its engine (``book_recovery.py``,
``vere_recovery.py``, ``lmdb_recovery.py``, ``pier_recovery.py``); what a salvage writes
is ``salvage.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os

from bookfs.formats.layout import LOG_NAME
from bookfs.formats.lock import WriterLock, lock_path_for
from bookfs.formats.nouncheck import bob_dir_for, check_nouns
from bookfs.formats.reports import CheckReport, Problem

log = logging.getLogger(__name__)


# --- the recovery ladder every format fills in ---------------------------------------------
#
# ``bookfs fsck`` (and nothing else) drives it: ``pier_recovery.recovery_for(path)`` identifies the
# source with the same detection ``open_source`` uses and returns the format's ``Recovery``,
# each beside its engine: ``book_recovery.BookRecovery`` (UIP layout),
# ``vere_recovery.VereRecovery``, ``lmdb_recovery.LmdbRecovery``,
# ``pier_recovery.PierRecovery``.  What a salvage writes is ``salvage.py``.  No tool parses
# bytes of a format it has not identified.


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
