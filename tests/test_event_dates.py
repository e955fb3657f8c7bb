"""Each event's date kept with the persisted index (issue 34.1): the writer records it,
the mount's date pass fills what no writer recorded, the index file persists it under its
CRC, and a listing reads it without decoding an event.  Whatever path filled it, the
column holds exactly what the rule (``noun/eventdate.py``) gives for every event."""

from __future__ import annotations

import functools
import os
import random
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats import datecolumn, index as index_mod
from bookfs.formats.book import Book
from bookfs.formats.datecolumn import NO_DATE, DateColumn, event_date
from bookfs.fs import dates as fs_dates
from bookfs.fs.dates import EventDates
from bookfs.noun import DA_UNIX_EPOCH, jam
from bookfs.noun.codec import cord, from_list
from mounting import mounted, run_bookfs

MUG = b"\x01\x02\x03\x04"


def da(unix_s: int, frac: int = 0) -> int:
    return ((unix_s + DA_UNIX_EPOCH) << 64) | frac


def dated(unix_s: int, data: int = 0, frac: int = 0) -> bytes:
    """A ship event ``[date [wire [tag data]]]``, jammed behind a mug."""
    wire = from_list([cord("g"), cord("x")])
    return MUG + jam((da(unix_s, frac), (wire, (cord("hear"), data))))


KINDS = st.one_of(
    st.builds(lambda s, f: dated(s, frac=f), st.integers(0, 4_000_000_000),
              st.integers(0, (1 << 64) - 1)),
    st.binary(min_size=4, max_size=40).map(lambda b: MUG + b),  # mostly not a noun
    st.integers(0, 1000).map(lambda n: MUG + jam((0, n))),  # a lifecycle-like event
    st.just(b"big"),  # a dated event over WHOLE bytes (made below)
)


def materialise(p: bytes, k: int) -> bytes:
    if p == b"big":  # its head within the prefix, its body a large atom
        return dated(1_700_000_000 + k, data=1 << (8 * (70 << 10)))
    return p


class Streamed:
    """A payload streamed from elsewhere (Book's Blob): the writer records no date."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def chunks(self):
        yield from (self.data[i:i + 4096] for i in range(0, len(self.data), 4096))


def expected(book: Book) -> list[int]:
    first, last = book.gulf()
    return [event_date(book, e) for e in range(first, last + 1)]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(KINDS, min_size=1, max_size=6), st.booleans()),
                min_size=1, max_size=8), st.integers(0, 2**32))
def test_column_holds_the_rule_whoever_filled_it(tmp_path_factory, batches, seed):
    """Batches saved in turn (some holding a streamed payload, which the writer cannot
    date: a gap the pass fills); the column is always a prefix that agrees with the rule,
    the pass completes it, and a reopen (read-only and writable) reads it back from the
    index file."""
    d = tmp_path_factory.mktemp("dates")
    rng = random.Random(seed)
    with Book.open(d, writable=True, create=True) as book:
        k = 0
        for payloads, stream in batches:
            real = [materialise(p, k + i) for i, p in enumerate(payloads)]
            if stream:
                j = rng.randrange(len(real))
                real[j] = Streamed(real[j])
            book.save(book.last + 1 if book.last else 1, real)
            k += len(real)
            ref = expected(book)
            assert list(book.dates.values(0, len(ref))) == ref[:len(book.dates)]
        missing = len(ref) - len(book.dates)
        assert book.fill_dates(10**6) == missing
        assert list(book.dates.values(0, len(ref) + 5)) == ref
    for writable in (False, True):
        with Book.open(d, writable=writable) as again:
            assert len(again.dates) == len(ref)
            assert list(again.dates.values(0, len(ref))) == ref


def test_a_listing_reads_the_column_and_never_decodes(tmp_path, monkeypatch):
    """With the dates persisted, every mtime of a fresh open comes from the column:
    decoding is made to fail, and nothing asks for it."""
    with Book.open(tmp_path, writable=True, create=True) as book:
        book.save(1, [dated(1_600_000_000 + i) for i in range(3000)] + [MUG + b"\xff" * 9])
    with Book.open(tmp_path) as book:
        assert len(book.dates) == book.count == 3001

        def no(*a):
            raise AssertionError("a date was decoded")

        monkeypatch.setattr(fs_dates, "event_date", no)
        got = EventDates(book).mtimes(1, 3001)
        assert list(got[:3000]) == [(1_600_000_000 + i) * 10**9 for i in range(3000)]
        assert got[3000] == book.mtime_ns(3001)  # no date: the log's time


def test_past_the_column_a_listing_extends_it(tmp_path):
    with Book.open(tmp_path, writable=True, create=True) as book:
        book.save(1, [Streamed(dated(1_600_000_000 + i)) for i in range(50)])
        assert len(book.dates) == 0  # streamed: the writer recorded none
        got = EventDates(book).mtimes(1, 50)
        assert list(got) == [(1_600_000_000 + i) * 10**9 for i in range(50)]
        assert len(book.dates) == 50


def test_a_damaged_date_section_is_never_trusted(tmp_path, cache_dir):
    with Book.open(tmp_path, writable=True, create=True) as book:
        book.save(1, [dated(1_600_000_000 + i) for i in range(100)])
    [idx] = list(Path(cache_dir).glob("*.idx"))
    raw = bytearray(idx.read_bytes())
    at = index_mod._FILE_HEAD.size + 8 * 100 + 8 * 7  # the 8th event's date
    raw[at] ^= 0x40
    idx.write_bytes(bytes(raw))
    with Book.open(tmp_path) as book:  # the CRC fails: rebuilt, its dates not taken
        assert len(book.dates) == 0
        book.fill_dates(1000)
        assert list(book.dates.values(0, 100)) == [(1_600_000_000 + i) * 10**9
                                                   for i in range(100)]


def test_truncation_and_spill(tmp_path, monkeypatch):
    """The column's three stores (the index file, the spill file, memory) read and
    truncate as one."""
    monkeypatch.setattr(datecolumn, "SPILL", 7)
    with Book.open(tmp_path, writable=True, create=True) as book:
        book.save(1, [dated(1_500_000_000 + i) for i in range(20)])
    with Book.open(tmp_path) as book:
        col = book.dates
        col.add(20, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # past the log: a test of storage only
        want = [(1_500_000_000 + i) * 10**9 for i in range(20)] + list(range(1, 11))
        assert list(col.values(0, 100)) == want
        assert list(col.values(18, 5)) == want[18:23]
        for n in (29, 25, 20, 12, 0):
            col.truncate(n)
            assert list(col.values(0, 100)) == want[:n]
    c = DateColumn()
    c.add(3, [1])  # past a gap: dropped (a prefix only)
    assert len(c) == 0


def test_a_read_only_mount_fills_and_persists_the_dates(tmp_path, cache_dir):
    """A log no writer dated (streamed payloads): a read-only mount's date pass decodes
    its events in the background and saves the index, so the next open has them all; the
    mount's mtimes are the dates meanwhile."""
    src = tmp_path / "log"
    n = 2000
    with Book.open(src, writable=True, create=True) as book:
        book.save(1, [Streamed(dated(1_650_000_000 + i, frac=1 << 63)) for i in range(n)])
    with Book.open(src) as book:
        assert len(book.dates) == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(src, mnt, "-o", "ro"):
        st = os.stat(mnt / "events" / f"{n:012d}")
        assert st.st_mtime_ns == (1_650_000_000 + n - 1) * 10**9 + 500_000_000
        deadline = time.monotonic() + 120  # a loaded machine: the pass is a background job
        while time.monotonic() < deadline:
            with Book.open(src) as book:
                if len(book.dates) == n:
                    break
            time.sleep(0.2)
        names = sorted(os.listdir(mnt / "events"))
        assert len(names) == n
    with Book.open(src) as book:
        assert list(book.dates.values(0, n)) == [
            (1_650_000_000 + i) * 10**9 + 500_000_000 for i in range(n)]
    assert run_bookfs("info", str(src)).returncode == 0


@pytest.mark.parametrize("added,count,save", [
    (0, 0, False), (1, 0, True), (1, 7, True), (1, 16, False), (2, 16, True),
    (124_999, 1_000_000, False), (125_000, 1_000_000, True), (0, 1_000_000, False)])
def test_the_date_pass_saves_by_share_of_the_log(added, count, save):
    assert fs_dates.worth_saving(added, count) is save


class _Undated:
    """A log whose date column lags its events: what the date pass sees."""

    def __init__(self, count: int) -> None:
        self.count, self.dated, self.asked, self.saved = count, 0, [], []

    def fill_dates(self, most: int) -> int:
        self.asked.append(most)
        n = min(most, self.count - self.dated)
        self.dated += n
        return n

    def persist_dates(self) -> None:
        self.saved.append(self.dated)


def test_the_date_pass_saves_once_caught_up_and_not_for_a_few_more():
    """The pass catches up and saves once; following a few more events (well under a
    share of the log), it dates them and does not save again: it once saved at every
    round that added a date."""
    import trio

    log = _Undated(3000)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(fs_dates.date_pass, log, idle=0.01))
            while not log.saved:
                await trio.sleep(0.01)
            log.count += 10  # a few more: well under a share of the log
            while log.dated < log.count:
                await trio.sleep(0.01)
            await trio.sleep(0.1)  # rounds of the pass, none of which saves
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert max(log.asked) == fs_dates.BATCH
    assert log.saved == [3000]
    assert log.dated == 3010


def test_a_companions_date_pass_rests_while_its_log_grows():
    """A read-write mount's companion decodes dates only while the log rests
    (``date_pass(rest=True)``): its read-write daemon has each date already, and decoding
    every committed event a second time was most of what the companion cost the writers.
    While the log grows (here: an event every 0.3 s, the pass looking every 1 s) the pass
    decodes nothing; once it has not grown for a look, the pass dates every event.
    Virtual time, moved by the test (``MockClock``); the pass's worker thread answers in
    real time, which the test waits for: nothing depends on the machine's speed."""
    import trio
    import trio.testing

    log = _Undated(100)

    async def main():
        clock = trio.lowlevel.current_clock()

        async def run_until(done, step: float) -> None:
            deadline = time.monotonic() + 120  # real seconds: a worker thread's answer
            while not done():
                assert time.monotonic() < deadline
                clock.jump(step)
                await trio.testing.wait_all_tasks_blocked()
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(fs_dates.date_pass, log, idle=1.0,
                                                 rest=True))
            await run_until(lambda: log.saved, 0)  # resting from the start: it catches up
            asked = len(log.asked)
            for _ in range(40):  # 12 s of appends
                log.count += 1
                clock.jump(0.3)
                await trio.testing.wait_all_tasks_blocked()
            assert log.dated == 100 and len(log.asked) == asked  # nothing decoded
            await run_until(lambda: log.dated == 140, 0.25)  # it rests: all dated
            log.count += 5  # a few more, then the log rests again
            await run_until(lambda: log.dated == 145, 0.25)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())


def test_a_read_write_mount_shows_each_new_events_date_while_its_companion_rests(
        tmp_path):
    """Through a read-write mount (its reads served by the companion, whose date pass
    rests while the log grows), every event appended shows its own date as its mtime
    at once, by ``stat`` and in a listing: a listing decodes what the pass left."""
    src, mnt = tmp_path / "log", tmp_path / "mnt"
    with Book.open(src, writable=True, create=True) as book:
        book.save(1, [dated(1_650_000_000 + i) for i in range(10)])
    with mounted(src, mnt):
        for n in range(11, 71):
            with open(mnt / "new" / str(n), "wb") as f:
                f.write(dated(1_660_000_000 + n))
            assert os.stat(mnt / "events" / f"{n:012d}").st_mtime_ns == \
                (1_660_000_000 + n) * 10**9
        listed = {e.name: e.stat().st_mtime_ns for e in os.scandir(mnt / "events")}
        assert len(listed) == 70
        for n in range(1, 71):
            unix = 1_650_000_000 + n - 1 if n <= 10 else 1_660_000_000 + n
            assert listed[f"{n:012d}"] == unix * 10**9


def _index_files(cache: Path) -> dict[str, tuple[int, int]]:
    """Each index file of the cache directory: (inode, mtime): a save replaces the file."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.iterdir()
            if not p.name.startswith(".")}


def test_a_follower_saves_its_index_by_share_not_at_every_round(tmp_path, cache_dir):
    """A read-only mount following a growing log dates the new events, and saves its
    index (a rewrite of the whole file, 16 bytes an event) only once they reach
    ``1 / SAVE_SHARE`` of the log.  It once saved at every round of its date pass (each
    second): a follower of a 10-million-event log growing 20 events a second wrote 105 MB
    and read 210 MB a second."""
    src, mnt, n = tmp_path / "log", tmp_path / "mnt", 4000
    with Book.open(src, writable=True, create=True) as book:
        book.save(1, [dated(1_650_000_000 + i) for i in range(n)])
    with Book.open(src, writable=True) as writer, mounted(src, mnt, "-o", "ro"):
        os.stat(mnt / "events" / f"{n:012d}")
        before = _index_files(cache_dir)
        assert len(before) == 1
        few = n // fs_dates.SAVE_SHARE // 10  # well under a share
        for k in range(few):
            writer.save(n + 1 + k, [dated(1_660_000_000 + k)])
            time.sleep(0.05)
        last = n + few
        os.stat(mnt / "events" / f"{last:012d}")  # the follower has them
        time.sleep(2.5)  # two rounds of the date pass at least (one a second)
        assert _index_files(cache_dir) == before
        share = (last + 1000) // fs_dates.SAVE_SHARE + 10
        writer.save(last + 1, [dated(1_670_000_000 + k) for k in range(share)])
        last += share
        assert os.stat(mnt / "events" / f"{last:012d}").st_mtime_ns == \
            (1_670_000_000 + share - 1) * 10**9
        deadline = time.monotonic() + 120  # a loaded machine: the pass is a background job
        while _index_files(cache_dir) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _index_files(cache_dir) != before
        with Book.open(src) as reader:  # what the follower saved: the dates it added
            assert len(reader.dates) > n + few
            assert list(reader.dates.values(0, n + few)) == expected(reader)[:n + few]


@pytest.mark.parametrize("kind", ["noun", "not a noun"])
def test_no_date_sentinel_is_never_a_real_mtime(tmp_path, kind):
    payload = dated(0) if kind == "noun" else MUG + b"\x00\x01"
    with Book.open(tmp_path, writable=True, create=True) as book:
        book.save(1, [payload])
        want = 0 if kind == "noun" else NO_DATE
        assert book.dates.get(0) == want
        assert EventDates(book).mtime_ns(1) == (0 if kind == "noun" else book.mtime_ns(1))


def test_a_date_past_what_an_mtime_holds_never_fails_the_save(tmp_path):
    """A date in year 9000 is an @da the rule accepts, but no signed 64-bit count of
    nanoseconds holds it: the save recorded it and raised OverflowError after its
    fdatasync, so the append was refused although it was in the log."""
    far = dated(220_000_000_000)  # about year 8941
    with Book.open(tmp_path, writable=True, create=True) as book:
        book.save(1, [far, dated(1_600_000_000)])
        assert book.count == 2
        assert list(book.dates.values(0, 2)) == [NO_DATE, 1_600_000_000 * 10**9]
        assert EventDates(book).mtime_ns(1) == book.mtime_ns(1)
