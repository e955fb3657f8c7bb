"""The noun check of ``bookfs verify --nouns`` and ``fsck --nouns``: every readable event
decode-checked (a 4-byte mug, then a jam that cues completely and exactly, or vere's ram
encoding), in runs of payloads read together and, past 256 MiB, in forked workers; and
where a pier keeps the bob atoms ram events point to (:func:`bob_dir_for`)."""

from __future__ import annotations

import bisect
import os

from bookfs.formats import deedcheck
from bookfs.formats.deedcheck import in_workers
from bookfs.formats.reports import CheckReport, Problem

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
