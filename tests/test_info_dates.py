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
