"""``info``'s dates come from a few reads at each end of the log, whatever its size (issue
34.6: ``bookfs info`` on a ship of 10 million events took 4.3 s, all of it the walk of the
index's chain of deeds up to the last event, which a read by number makes once an open).

The newest dates are read from the log's end without the index (``Book.newest_heads``):
the deeds walked back by their trailing lengths, each CRC-checked.  These tests hold that
walk equal to reads by number on random logs, show it stops at a deed that fails, and
that ``info`` no longer confirms the chain."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.cli.sample import iter_sample_payloads
from bookfs.formats import info as info_mod
from bookfs.formats.book import Book
from bookfs.noun import jam, peek_event


def _log(path: Path, payloads: list[bytes]) -> None:
    with Book.open(path, writable=True, create=True) as book:
        for k in range(0, len(payloads), 500):
            book.save(k + 1, payloads[k:k + 500])


def _payload(date: int | None, body: int) -> bytes:
    noun = body if date is None else (date, (body, 0))
    return b"\0\0\0\0" + jam(noun)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(1 << 127, 1 << 128)),
                          st.integers(0, 1 << 4000)), min_size=1, max_size=60),
       st.integers(1, 70), st.integers(1, 600))
def test_newest_heads_are_the_newest_payloads_read_by_number(tmp_path_factory, events,
                                                             most, size):
    d = tmp_path_factory.mktemp("log")
    payloads = [_payload(date, body) for date, body in events]
    _log(d, payloads)
    with Book.open(d) as book:
        got = list(book.newest_heads(most, size))
        want = [book.read(e)[:size] for e in range(book.last, 0, -1)][:most]
        assert got == want
        # info's date from the end is the newest dated event's, as reading by number says
        dated = [peek_event(p[4:])[0] for p in reversed(payloads)][:info_mod.DATE_SEARCH]
        newest = next((d for d in dated if d is not None), None)
        assert info_mod._newest_date(book) == newest


def test_the_walk_stops_at_a_deed_that_fails(tmp_path):
    payloads = list(iter_sample_payloads(40))
    _log(tmp_path, payloads)
    log_path = tmp_path / "book.log"
    with Book.open(tmp_path) as book:
        sizes = [book.payload_size(e) for e in range(1, 41)]
    end = os.path.getsize(log_path)
    # flip a payload byte of the third newest deed: its CRC fails, the walk stops there
    off = end - sum(s + 20 for s in sizes[-3:]) + 8 + 5
    with open(log_path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    with Book.open(tmp_path, use_index_cache=False) as book:
        got = list(book.newest_heads(10, 1 << 20))
    assert got == [payloads[-1], payloads[-2]]
    # a last deed whose let_d is garbage is not in the log as opened: the walk starts at
    # the deed before it (and stops again at the bad CRC)
    with open(log_path, "r+b") as f:
        f.seek(end - 8)
        f.write(struct.pack("<Q", 1 << 40))
    with Book.open(tmp_path, use_index_cache=False) as book:
        assert book.last == 39
        assert list(book.newest_heads(10, 1 << 20)) == [payloads[-2]]


def test_info_reads_the_ends_not_the_whole_chain(tmp_path):
    """With a persisted index, ``info`` confirmed the index's chain up to the last event
    (reading the whole log); now it confirms only the few first events it reads."""
    payloads = list(iter_sample_payloads(3000))
    _log(tmp_path, payloads)
    with Book.open(tmp_path) as book:  # the persisted index, as a fresh `bookfs info`
        assert book._chain_ok == 0
        got = info_mod.log_summary(book)
        assert book._chain_ok <= info_mod.DATE_SEARCH
    dated = [peek_event(p[4:])[0] for p in payloads]
    newest = next(d for d in reversed(dated) if d is not None)
    oldest = next(d for d in dated if d is not None)
    from bookfs.noun import format_da
    assert got["dates"]["last"] == format_da(newest)
    assert got["dates"]["first"] == format_da(oldest)


def _reference_first_date(book: Book) -> int | None:
    """The oldest date as ``info`` finds it, by the plain rule: the first of the first
    :data:`~bookfs.formats.info.DATE_SEARCH` events that reads whole with its CRC and is
    dated."""
    from bookfs.errors import BookError

    first, last = book.gulf()
    for e in range(first, min(last, first + info_mod.DATE_SEARCH - 1) + 1):
        try:
            date = peek_event(book.read(e)[4:])[0]
        except BookError:
            continue
        if date is not None:
            return date
    return None


def _ovum(date: int | None, body: int) -> bytes:
    """A payload: ``[date [/behn [%wake body]]]`` (an event ``peek_event`` dates), or the
    atom ``body`` alone (undated, as boot events are)."""
    if date is None:
        return b"\0\0\0\0" + jam(body)
    cord = lambda t: int.from_bytes(t.encode(), "little")  # noqa: E731
    return b"\0\0\0\0" + jam((date, ((cord("behn"), 0), (cord("wake"), body))))


def _da(unix_seconds: int) -> int:
    """A @da in years 1..9999 (what ``peek_event`` takes for a date)."""
    from bookfs.noun.aura import DA_UNIX_EPOCH

    return (DA_UNIX_EPOCH + unix_seconds) << 64


#: payload bodies (bits): small, just over the head read, and over 1 MiB
_SIZES = {"small": 200, "head+": (info_mod.DATE_PEEK + 3000) * 8, "big": (1 << 20) * 8 + 4000}


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(sorted(_SIZES))),
                min_size=1, max_size=8),
       st.one_of(st.none(), st.tuples(st.integers(0, 7), st.floats(0, 1))))
def test_the_oldest_date_is_what_reading_every_event_whole_gives(tmp_path_factory, events,
                                                                hurt):
    """The oldest date (``date_range``'s first) is the plain rule's (:func:`_reference_first_date`):
    events of any size, dated or not, one of them maybe damaged anywhere in its payload
    (its head too, which may then look dated).  A large event is read whole only when its
    head holds a date, so that rule is what these hold it to."""
    import random

    d = tmp_path_factory.mktemp("log")
    rnd = random.Random(len(events))
    payloads = [_ovum(_da(rnd.getrandbits(30)) if dated else None,
                         rnd.getrandbits(_SIZES[size]) | 1 << _SIZES[size])
                for dated, size in events]
    _log(d, payloads)
    if hurt is not None and hurt[0] < len(payloads):
        with Book.open(d) as book:
            off = book.index.offsets[hurt[0]]
        at = off + 8 + int(hurt[1] * (len(payloads[hurt[0]]) - 1))
        with open(d / "book.log", "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x5A]))
    with Book.open(d, use_index_cache=False) as book:
        want = _reference_first_date(book)
        info_mod._date_cache.pop(book, None)
        oldest = [info_mod._event_date(book, e) for e in range(1, len(payloads) + 1)]
        got = next((x for x in oldest if x is not None), None)
        assert got == want


def test_a_large_boot_event_is_not_read_whole_to_learn_it_has_no_date(tmp_path, monkeypatch):
    """A ship's first events are its boot sequence: undated, and the pill among them
    megabytes.  ``info``'s oldest date reads each one's head (64 KiB), not the whole
    payload with its CRC: a fleet's first ``find`` computes it for every ship."""
    import random

    rnd = random.Random(5)
    pill = _ovum(None, rnd.getrandbits(3 << 23))  # 3 MiB, no date
    mid = _ovum(None, rnd.getrandbits(200_000 * 8))
    payloads = [_ovum(None, 7), pill, mid, _ovum(_da(1_700_000_000), 9)]
    _log(tmp_path, payloads)
    read = []
    real_pread, real_preadv = os.pread, os.preadv
    monkeypatch.setattr(os, "pread", lambda fd, n, off: read.append(n) or real_pread(fd, n, off))
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: read.append(
        sum(len(b) for b in bufs)) or real_preadv(fd, bufs, off))
    with Book.open(tmp_path, use_index_cache=False) as book:
        read.clear()
        dates = info_mod.date_range(book)
    assert dates is not None and dates["first"] == dates["last"]
    assert sum(read) < 512 << 10, f"{sum(read):,} bytes read for the dates"


def test_the_newest_date_reads_only_the_deeds_it_looks_at(tmp_path, monkeypatch):
    """The walk back from the log's end is lazy: when the newest deed is dated, its two
    ``u64`` s and the deed's checked bytes are all that is read, not the framing of the
    :data:`~bookfs.formats.info.DATE_SEARCH` newest deeds (two ``pread`` calls each)."""
    _log(tmp_path, [_ovum(_da(1_700_000_000 + k), k) for k in range(100)])
    calls = []
    real_pread, real_preadv = os.pread, os.preadv
    monkeypatch.setattr(os, "pread", lambda *a: calls.append(a) or real_pread(*a))
    monkeypatch.setattr(os, "preadv", lambda *a: calls.append(a) or real_preadv(*a))
    with Book.open(tmp_path, use_index_cache=False) as book:
        calls.clear()
        assert info_mod._newest_date(book) == _da(1_700_000_099)
    assert len(calls) <= 8, f"{len(calls)} reads"  # (68 when the walk read 32 deeds)


def test_infos_dates_follow_the_rule_of_the_mounts_mtimes(tmp_path):
    """A payload whose head is dated but which is not a noun past its head has no date
    for the mount (its file's mtime, the date column: ``noun.eventdate``); ``info``'s
    first and last dates agree.  The old ``info`` decoded the head alone and showed that
    event's date."""
    from bookfs.noun.eventdate import payload_date_ns

    good = [_ovum(_da(1_700_000_000 + k * 60), k) for k in range(1, 5)]
    torn_first = _ovum(_da(1_600_000_000), 7)[:-1] + b"\xff\xff"  # head intact, tail not
    torn_last = _ovum(_da(1_800_000_000), 9)[:-1] + b"\xff\xff"
    assert peek_event(torn_first[4:])[0] is not None and payload_date_ns(torn_first) is None
    _log(tmp_path / "b", [_ovum(None, 3), torn_first, *good, torn_last])
    with Book.open(tmp_path / "b") as book:
        got = info_mod.date_range(book)
    from bookfs.noun import format_da

    assert got["first"] == format_da(_da(1_700_000_060))
    assert got["last"] == format_da(_da(1_700_000_240))
