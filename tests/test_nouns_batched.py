"""``bookfs verify --nouns`` reads payloads in runs, unchecked, after ``verify`` has checked
every CRC, and splits a large log between processes (issue 34.6: 119 MB/s on a ship of 10
million events, reading and CRC-checking every event a second time, in one process).

The class: on random logs (nouns, payloads that are not nouns, a deed whose CRC fails,
payloads large enough to be read alone), the batched check, serial and forked, reports
exactly what the per-event check reports."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats import deedcheck, nouncheck
from bookfs.formats.book import Book
from bookfs.formats.reports import CheckReport
from bookfs.formats.nouncheck import check_nouns
from bookfs.noun import jam

_payloads = st.lists(st.one_of(
    st.integers(0, 1 << 3000).map(lambda n: b"\1\0\0\0" + jam((n, n & 0xFFFF))),
    st.binary(min_size=5, max_size=300).map(lambda b: b"\2\0\0\0" + b),  # mostly not nouns
    st.integers(0, 1 << 20).map(lambda n: b"\3\0\0\0" + jam(n) + bytes(300_000)),  # trailing junk
), min_size=1, max_size=40)


def _report(book, **kw) -> tuple:
    rep = CheckReport(book.directory, book.format)
    check_nouns(book, rep, **kw)
    return (rep.nouns_checked, rep.nouns_ram,
            sorted((p.event, p.payload_offset, p.message) for p in rep.problems))


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_payloads, st.data())
def test_batched_and_forked_checks_report_what_the_per_event_check_does(
        tmp_path_factory, monkeypatch, payloads, data):
    d = tmp_path_factory.mktemp("log")
    with Book.open(d, writable=True, create=True) as book:
        book.save(1, payloads)
    bad = data.draw(st.sampled_from([None, *range(1, len(payloads) + 1)]))
    if os.path.getsize(d / "book.log") < 64:  # under vere's header slot: a damaged log
        bad = None  # that small is refused as ambiguous (detect.py), not checked
    if bad is not None:  # flip a payload byte: its CRC fails
        with Book.open(d) as book:
            off = book.index.offsets[bad - 1] + 8 + 2
        with open(d / "book.log", "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x40]))
    monkeypatch.setattr(deedcheck, "_CRC_CHUNK", 1 << 16)  # runs of a few events
    monkeypatch.setattr(nouncheck, "_NOUN_RUN", 3)
    with Book.open(d, use_index_cache=False) as book:
        failed = {e for e, _ in book.verify()}
        # (a failing last deed may be a torn tail: not in the log as opened)
        assert failed <= ({bad} if bad is not None else set())
        want = _report(book)  # each event read and checked by the format
        assert _report(book, crc_failed=failed, workers=1) == want
        monkeypatch.setattr(deedcheck, "_PARALLEL_BYTES", 0)
        assert _report(book, crc_failed=failed, workers=3) == want
        assert want[0] == book.count - len(failed)

