"""A LOOKUP of a small event starts its disk read at once, while lookups are followed by
reads (``fs/prefetch.py``, ``EventLog.prefetch``), and a walk that only stats is not
hinted.

Through real read-only mounts of every source kind whose events lie in a file of deeds
(a UIP Book, a vere-layout Book, a pier whose events are in a Book epoch): the log's
pages are evicted from the page cache (``POSIX_FADV_DONTNEED``; the log is clean), then
``stat`` looks an event up, and ``mincore(2)`` tells whether its deed's pages came back.
On a UIP Book a ``stat`` reads no byte of the event (its date comes from the log's date
column, ``fs/dates.py``), so only the hint brings them back; a log without a date column
(vere's layout, a pier) decodes the event's date at its first lookup, which reads it
anyway.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookfs.formats.book import Book
from bookfs.formats.pier import open_source
from bookfs.fs.prefetch import LIMIT, WINDOW, LookupHints
from lmdb_fixtures import make_pier, make_vere_epoch
from mount_fixtures import payload, wait_for
from mounting import mounted
from page_cache import evict as _evict, pages as _pages, resident as _resident

N = 300  # events of SIZE bytes: each deed spans two pages or more
SIZE = 9000

# --- the rule, alone ---------------------------------------------------------------------


def test_a_walk_that_only_stats_stops_being_hinted():
    hints = LookupHints()
    hinted = sum(hints.looked_up(e) for e in range(1, 10_001))
    assert hinted <= WINDOW + LIMIT


@pytest.mark.parametrize("readers", [1, 2, 8, WINDOW])
def test_lookups_followed_by_reads_are_always_hinted(readers):
    """``readers`` readers at once: each looks its event up, then all read theirs."""
    hints = LookupHints()
    for start in range(1, 2001, readers):
        batch = range(start, start + readers)
        assert all([hints.looked_up(e) for e in batch])
        for e in batch:
            hints.read(e)


def test_reads_after_a_stat_walk_are_hinted_again():
    """After a walk that only stats, at most ``LIMIT + 1`` lookups followed by reads."""
    hints = LookupHints()
    for e in range(1, 1001):
        hints.looked_up(e)
    hinted = []
    for e in range(5000, 5000 + LIMIT + 2):
        hinted.append(hints.looked_up(e))
        hints.read(e)
    assert not hinted[0] and hinted[-1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 60)), max_size=400))
def test_the_rule_stays_bounded(ops):
    """Any interleaving of lookups and reads: the window and the score stay in bounds,
    and a read of an event never looked up changes nothing."""
    hints = LookupHints()
    for is_read, event in ops:
        before = (hints.score, list(hints._unread))
        if is_read:
            known = event in hints._unread
            hints.read(event)
            if not known:
                assert (hints.score, list(hints._unread)) == before
        else:
            assert hints.looked_up(event) == (hints.score > 0)
        assert len(hints._unread) <= WINDOW
        assert -LIMIT <= hints.score <= LIMIT


# --- through a mount ---------------------------------------------------------------------


def _uip(root: Path) -> Path:
    d = root / "uip"
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, [payload(n, SIZE) for n in range(1, N + 1)])
    return d


def _vere(root: Path) -> Path:
    return make_vere_epoch(root / "0i0", 0, [payload(n, SIZE) for n in range(1, N + 1)])


def _pier(root: Path) -> Path:
    return make_pier(root / "pier", [("lmdb", [payload(n, 40) for n in range(1, 11)]),
                                     ("book", [payload(n, SIZE) for n in range(11, N + 1)])])


SOURCES = {"UIP Book": _uip, "vere-layout Book": _vere, "pier, Book epoch": _pier}


def _log_file(src: Path) -> Path:
    (found,) = [p for p in src.rglob("*.log") if p.stat().st_size > N * SIZE // 2]
    return found


def _deed_ranges(src: Path) -> dict[int, tuple[int, int]]:
    """Each event's (offset, length) in its log file, from the log's own index."""
    with open_source(src) as log:
        def one(e):
            inner = log.epoch_of(e).log if hasattr(log, "epoch_of") else log
            off, n = inner._locate(e)
            return off, inner.DEEDS.size(n)
        return {e: one(e) for e in range(log.first, log.last + 1) if log.payload_size(e) > 100}


FLEET = "a fleet's ship (UIP Book)"


@contextlib.contextmanager
def _mounted_log(tmp_path, kind):
    """``(the directory holding events/, the log file, each event's deed range)``."""
    fleet = kind == FLEET
    src = (_uip if fleet else SOURCES[kind])(tmp_path / "fleet" if fleet else tmp_path)
    ranges = _deed_ranges(src)
    mp = tmp_path / "mnt"
    with mounted(src.parent if fleet else src, mp, *(["--fleet"] if fleet else ["-o", "ro"])):
        root = mp / os.listdir(mp)[0] if fleet else mp  # (a fleet's ship: its small
        os.stat(root / "events" / str(max(ranges)))  # events share the fleet's cache)
        yield root, _log_file(src), ranges


@pytest.mark.parametrize("kind", [*SOURCES, FLEET])
def test_a_lookup_starts_reading_the_event(tmp_path, kind):
    with _mounted_log(tmp_path, kind) as (mp, log_file, ranges):
        _lookup_reads(mp, log_file, ranges)


def test_every_cache_an_event_node_is_handed_answers_alike():
    """A single mount's events hold their small payloads in an ``EventCache``, a fleet's
    ships in a ``ShipCache`` view of the fleet's one cache: the view must answer all that
    the cache answers (a lookup asked the view ``in``, which it lacked: EIO)."""
    from bookfs.fs.cache import EventCache
    from bookfs.fs.fleet.ship import ShipCache

    asked = {n for n in vars(EventCache) if not n.startswith("_")} | {"__contains__",
                                                                      "__len__"}
    assert asked <= set(dir(ShipCache)), asked - set(dir(ShipCache))
    shared = EventCache()
    view, other = ShipCache(shared), ShipCache(shared)
    view.put(7, b"x")
    assert 7 in view and 7 not in other and 8 not in view and len(view) == 1
    view.clear()
    assert 7 not in view


def _lookup_reads(mp, log_file, ranges):
    event = sorted(ranges)[len(ranges) // 2]
    pages = _pages(*ranges[event])
    _evict(log_file)
    if any(_resident(log_file)[p] & 1 for p in pages):
        pytest.fail("the log's pages could not be evicted (POSIX_FADV_DONTNEED)")
    os.stat(mp / "events" / str(event))  # a LOOKUP; reads no byte of the event
    assert wait_for(lambda: all(_resident(log_file)[p] & 1 for p in pages), timeout=30)
    with open(mp / "events" / str(event), "rb") as f:  # and the read that follows
        assert len(f.read()) == os.stat(mp / "events" / str(event)).st_size


def test_a_walk_that_only_stats_reads_few_events(tmp_path):
    """(A log with a date column: elsewhere each first lookup reads its event.)"""
    with _mounted_log(tmp_path, "UIP Book") as (mp, log_file, ranges):
        _stat_walk(mp, log_file, ranges)


def _stat_walk(mp, log_file, ranges):
    events = sorted(ranges)[:-4]  # (the log's tail is read by the mount's own looks)
    _evict(log_file)
    for e in events:
        os.stat(mp / "events" / str(e))
    os.sync()
    vec = _resident(log_file)
    back = [e for e in events if all(vec[p] & 1 for p in _pages(*ranges[e]))]
    assert len(back) <= WINDOW + LIMIT + 2, (len(back), len(events))


@pytest.mark.parametrize("kind", list(SOURCES))
def test_a_hint_never_raises(tmp_path, kind):
    """A hint must not fail the lookup that gives it: an event the log does not hold, one
    in an LMDB epoch (nothing to hint), a closed log."""
    log = open_source(SOURCES[kind](tmp_path))
    for event in (0, 1, log.last, log.last + 1, 10**12):
        log.prefetch(event)
    log.close()
    log.prefetch(log.last if log.count else 1)
