"""Crash consistency and "recovery must not destroy evidence" (DESIGN.md).

Every test damages a real log the way a crash or a failing disk would (a cut at every byte
offset of the last batch, a bit flip in every byte of it, a zeroed 4 KiB page, random
damage), reopens it, and checks:

* the log now holds exactly a prefix 1..k of the original events, each read back
  identical, and nothing committed before the damaged deed was lost;
* nothing was invented: no event that was not written is visible;
* no byte was destroyed except a torn tail: the kept log, the quarantine files and the cut
  torn tail tile the damaged file exactly, and quarantined bytes are preserved verbatim;
* a read-only open never modifies anything and never serves a corrupt deed.
"""

from __future__ import annotations

import os
import random
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats import layout
from bookfs.formats.book import Book
from bookfs.errors import CorruptDeed, NoSuchEvent, TooShort
from bookfs.formats.deedcheck import find_valid_deeds

PAGE = 4096


def pay(event: int, size: int) -> bytes:
    return random.Random(event * 7_919 + size).randbytes(size)


class Original:
    """A log built from batches of payload sizes, with everything needed to judge a
    damaged copy of it."""

    def __init__(self, directory: Path, batches: list[list[int]]):
        self.events: list[bytes] = []
        with Book.open(directory, writable=True, create=True) as book:
            for sizes in batches:
                first = len(self.events) + 1
                payloads = [pay(first + k, s) for k, s in enumerate(sizes)]
                book.save(first, payloads)
                self.events += payloads
        self.raw = (directory / "book.log").read_bytes()
        self.meta = (directory / "meta.bin").read_bytes()
        self.starts = []  # offset of each deed
        off = layout.HEADER_SIZE
        for p in self.events:
            self.starts.append(off)
            off += len(p) + layout.DEED_OVERHEAD
        self.ends = self.starts[1:] + [off]
        assert off == len(self.raw)
        self.last_batch_start = self.starts[len(self.events) - len(batches[-1])]
        self.before_last_batch = len(self.events) - len(batches[-1])

    def complete_deeds(self, size: int) -> int:
        """How many deeds lie wholly below ``size``."""
        return sum(1 for e in self.ends if e <= size)

    def first_damaged(self, damaged: bytes) -> int:
        """Index of the first deed whose bytes differ in ``damaged`` (same length)."""
        for i, (a, b) in enumerate(zip(self.starts, self.ends)):
            if damaged[a:b] != self.raw[a:b]:
                return i
        return len(self.events)


def place(directory: Path, raw: bytes, meta: bytes) -> Path:
    directory.mkdir(parents=True)
    (directory / "book.log").write_bytes(raw)
    (directory / "meta.bin").write_bytes(meta)
    return directory


def check_writable_recovery(d: Path, orig: Original, damaged: bytes, *, expect_k: int,
                            min_k: int, torn_only: bool = False,
                            quarantine_only: bool = False, append: bool = True):
    """Open the damaged copy in ``d`` writable and check every recovery guarantee."""
    with Book.open(d, writable=True) as book:
        rep = book.recovery
        kept = (d / "book.log").read_bytes()
        k = book.count
        # a committed prefix, nothing invented, nothing before the damage lost
        assert k == expect_k, (k, expect_k)
        assert k >= min_k
        assert book.gulf() == ((1, k) if k else (0, 0))
        for e in range(1, k + 1):
            assert book.read(e) == orig.events[e - 1]
        assert k + 1 not in book
        with pytest.raises(NoSuchEvent):
            book.read(k + 1)
        assert book.log_bytes == len(kept)
        assert len(kept) == (orig.ends[k - 1] if k else layout.HEADER_SIZE)
        # no evidence destroyed: kept ++ quarantined ++ torn tail == the damaged file
        assert damaged[: len(kept)] == kept
        spans = []
        for qpath, off, n in rep.quarantined:
            q = Path(qpath)
            assert q.parent == d and q.name.startswith(layout.QUARANTINE_PREFIX)
            assert q.read_bytes() == damaged[off : off + n]
            spans.append((off, n))
        if rep.torn_tail is not None:
            spans.append(rep.torn_tail)
        pos = len(kept)
        for off, n in sorted(spans):
            assert off == pos and n > 0
            pos += n
        assert pos == len(damaged)
        if len(kept) == len(damaged):
            assert rep.clean
        if torn_only:
            assert rep.quarantined == []
        if quarantine_only:
            assert rep.torn_tail is None and len(rep.quarantined) == 1
        if append:  # the recovered log takes the next event
            book.save(k + 1, [b"next event"])
            assert book.read(k + 1) == b"next event"
    return rep


def each_case(cases, threads: int = 8):
    """Decorator that runs the decorated check once for every case in ``cases``, several
    at once.  Every case has its own directory and log; most of a case's time is the
    engine's wait, at a writable close, for the clock to leave the log's ctime tick
    (``index.settle_stamp``, up to 20 ms), and threads overlap those waits.  Every case
    runs, and the first failing case (in case order) is raised, with its case named."""

    def run(check):
        cases_ = list(cases)
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(check, c) for c in cases_]
        for c, f in zip(cases_, futures):
            try:
                f.result()
            except BaseException as e:
                e.add_note(f"case {c!r} of {check.__qualname__}")
                raise
        return check

    return run


def salvage_finds_later_deeds(qpath: str, qoff: int, orig: Original, damaged_i: int):
    """``find_valid_deeds`` over a quarantine file recovers every intact deed after the
    damaged one, at the right places, and nothing else."""
    fd = os.open(qpath, os.O_RDONLY)
    try:
        found = find_valid_deeds(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    assert found == [s - qoff for s in orig.starts[damaged_i + 1 :]]


@pytest.fixture(scope="module")
def small_orig(tmp_path_factory):
    """4 batches of 5 events of varied sizes; the last batch is 446 bytes."""
    d = tmp_path_factory.mktemp("orig") / "book"
    return Original(d, [[4, 17, 60, 5, 130], [9, 4, 250, 33, 8], [77, 4, 6, 300, 12],
                        [4, 37, 120, 5, 180]])


@pytest.fixture(scope="module")
def paged_orig(tmp_path_factory):
    """Like small_orig, but the last batch starts on a page boundary and spans 3 pages."""
    first = [[4, 17, 60, 5, 130], [9, 4, 250, 33, 8], [77, 4, 6, 300]]
    used = layout.HEADER_SIZE + sum(s + layout.DEED_OVERHEAD for b in first for s in b)
    pad = PAGE - used % PAGE - layout.DEED_OVERHEAD  # last event of batch 3 ends the page
    first[-1].append(pad)
    d = tmp_path_factory.mktemp("orig") / "book"
    orig = Original(d, first + [[700, 4, 3000, 5000, 2500]])
    assert orig.last_batch_start % PAGE == 0
    assert 2 * PAGE < len(orig.raw) - orig.last_batch_start < 3 * PAGE
    return orig


# --- crashes: a cut at every byte offset of the last batch ---------------------------------


def test_truncation_at_every_offset_of_the_last_batch(tmp_path, small_orig):
    orig = small_orig

    @each_case(range(orig.last_batch_start, len(orig.raw)))
    def _(cut):
        damaged = orig.raw[:cut]
        d = place(tmp_path / f"t{cut}", damaged, orig.meta)
        k = orig.complete_deeds(cut)
        rep = check_writable_recovery(d, orig, damaged, expect_k=k,
                                      min_k=orig.before_last_batch, torn_only=True,
                                      append=cut % 5 == 0)
        if cut == orig.ends[k - 1]:
            assert rep.clean
        else:  # an incomplete final deed is cut, and said so
            assert rep.torn_tail == (orig.ends[k - 1], cut - orig.ends[k - 1])


# --- bit flips in every byte of the last batch ---------------------------------------------


def test_bit_flip_in_every_byte_of_the_last_batch(tmp_path, small_orig):
    orig = small_orig

    @each_case(range(orig.last_batch_start, len(orig.raw)))
    def _(pos):
        damaged = bytearray(orig.raw)
        damaged[pos] ^= 1 << (pos % 8)
        damaged = bytes(damaged)
        i = orig.first_damaged(damaged)
        assert orig.starts[i] <= pos < orig.ends[i]
        d = place(tmp_path / f"f{pos}", damaged, orig.meta)
        rep = check_writable_recovery(d, orig, damaged, expect_k=i,
                                      min_k=orig.before_last_batch, quarantine_only=True,
                                      append=pos % 7 == 0)
        (qpath, qoff, _), = rep.quarantined
        assert qoff == orig.starts[i]
        salvage_finds_later_deeds(qpath, qoff, orig, i)


# --- zeroed pages ---------------------------------------------------------------------------


def test_zeroed_pages_in_the_last_batch(tmp_path, paged_orig):
    orig = paged_orig

    @each_case(range(orig.last_batch_start, len(orig.raw), PAGE))
    def _(page):
        stop = min(page + PAGE, len(orig.raw))  # a zeroed page never grows the file
        damaged = orig.raw[:page] + bytes(stop - page) + orig.raw[stop:]
        i = orig.first_damaged(damaged)
        assert i >= orig.before_last_batch
        d = place(tmp_path / f"p{page}", damaged, orig.meta)
        rep = check_writable_recovery(d, orig, damaged, expect_k=i,
                                      min_k=orig.before_last_batch, quarantine_only=True)
        (qpath, qoff, _), = rep.quarantined
        # every deed wholly after the zeroed page can be salvaged from the quarantine file
        fd = os.open(qpath, os.O_RDONLY)
        try:
            found = find_valid_deeds(fd, 0, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        assert [s - qoff for s in orig.starts if s >= stop] == [
            f for f in found if f + qoff >= stop]
        assert all(orig.starts.index(f + qoff) >= 0 for f in found)


def test_torn_page_write_at_the_end(tmp_path, paged_orig):
    """A crash that extended the file but persisted only its first pages: the tail reads as
    zeros.  That is not a torn tail by the framing rule (a zero len_d announces nothing),
    so it is quarantined, never silently cut."""
    orig = paged_orig
    keep = orig.last_batch_start + PAGE
    damaged = orig.raw[:keep] + bytes(len(orig.raw) - keep)
    i = orig.first_damaged(damaged)
    d = place(tmp_path / "b", damaged, orig.meta)
    check_writable_recovery(d, orig, damaged, expect_k=i, min_k=orig.before_last_batch,
                            quarantine_only=True)


# --- read-only opens of damaged logs --------------------------------------------------------


def damaged_variants(orig: Original):
    start, size = orig.last_batch_start, len(orig.raw)
    for cut in range(start, size, 13):
        yield f"cut {cut}", orig.raw[:cut]
    for pos in range(start, size, 11):
        b = bytearray(orig.raw)
        b[pos] ^= 0x80 >> (pos % 8)
        yield f"flip {pos}", bytes(b)
    yield "garbage", orig.raw + b"\xff" * 37
    yield "zero tail", orig.raw[:start] + bytes(size - start)


def snapshot(d: Path):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, stat.S_IMODE(p.stat().st_mode))
            for p in sorted(d.iterdir())}


def test_read_only_open_of_damaged_logs_never_modifies_and_never_serves_corrupt_bytes(
        tmp_path, small_orig):
    orig = small_orig
    refused = 0
    for n, (what, damaged) in enumerate(damaged_variants(orig)):
        d = place(tmp_path / f"r{n}", damaged, orig.meta)
        old = 1_000_000_000_000_000_000  # 2001: any write would move the mtime
        os.utime(d / "book.log", ns=(old, old))
        os.utime(d / "meta.bin", ns=(old, old))
        before = snapshot(d)
        first_bad = (orig.complete_deeds(len(damaged)) if len(damaged) < len(orig.raw)
                     else orig.first_damaged(damaged))
        with Book.open(d) as book:
            assert book.count >= first_bad, what
            assert book.count <= len(orig.events)
            for e in range(1, book.count + 1):
                if e - 1 < first_bad:
                    assert book.read(e) == orig.events[e - 1], what
                else:
                    try:
                        got = book.read(e)
                    except CorruptDeed as err:
                        assert err.event == e and err.offset == orig.starts[e - 1]
                        refused += 1
                    else:
                        assert got == orig.events[e - 1], what
            if len(damaged) != book.log_bytes:
                assert book.recovery.bad_region == (book.log_bytes,
                                                    len(damaged) - book.log_bytes)
            book.refresh()
            assert book.count <= len(orig.events)
        assert snapshot(d) == before, what
    assert refused > 0  # damaged deeds the open could not rule out were refused on read


def test_corrupt_middle_deed(tmp_path, small_orig):
    """A flipped payload bit in event 3 of 20: a reader refuses event 3 only; a writer keeps
    1..2 and quarantines the rest, from which the later events can be salvaged."""
    orig = small_orig
    damaged = bytearray(orig.raw)
    damaged[orig.starts[2] + 8 + 20] ^= 0x10
    damaged = bytes(damaged)
    d = place(tmp_path / "b", damaged, orig.meta)
    with Book.open(d) as book:
        assert book.gulf() == (1, 20)
        assert book.read(2) == orig.events[1] and book.read(4) == orig.events[3]
        with pytest.raises(CorruptDeed) as ei:
            book.read(3)
        assert (ei.value.event, ei.value.offset) == (3, orig.starts[2])
        assert "event 3" in str(ei.value) and str(orig.starts[2]) in str(ei.value)
        with pytest.raises(CorruptDeed):
            book.verify_event(3)
        walked = []
        with pytest.raises(CorruptDeed):
            for e, p in book.walk():
                walked.append(e)
        assert walked == [1, 2]
        assert book.verify() == [(3, orig.starts[2])]
    assert (d / "book.log").read_bytes() == damaged
    rep = check_writable_recovery(d, orig, damaged, expect_k=2, min_k=2, quarantine_only=True)
    (qpath, qoff, _), = rep.quarantined
    salvage_finds_later_deeds(qpath, qoff, orig, 2)


def test_quarantine_file_is_0644_regardless_of_umask(tmp_path, small_orig):
    orig = small_orig
    d = place(tmp_path / "b", orig.raw + b"\x00" * 100, orig.meta)
    old = os.umask(0o077)
    try:
        with Book.open(d, writable=True) as book:
            (qpath, _, _), = book.recovery.quarantined
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(qpath).st_mode) == 0o644


def test_recovered_log_is_clean_on_the_next_open(tmp_path, small_orig):
    orig = small_orig
    damaged = orig.raw[: orig.ends[-1] - 3]
    d = place(tmp_path / "b", damaged, orig.meta)
    with Book.open(d, writable=True) as book:
        assert book.recovery.torn_tail == (orig.starts[-1], orig.ends[-1] - 3 - orig.starts[-1])
    for writable, cache in ((False, True), (True, True), (True, False)):
        with Book.open(d, writable=writable, use_index_cache=cache) as book:
            assert book.recovery.clean and book.count == 19


# --- property: random damage ----------------------------------------------------------------

sizes_st = st.lists(st.one_of(st.just(4), st.integers(4, 40), st.integers(41, 900)),
                    min_size=1, max_size=25)


@st.composite
def damage_st(draw):
    sizes = draw(sizes_st)
    cuts = sorted(draw(st.sets(st.integers(1, len(sizes) - 1), max_size=4))) if len(sizes) > 1 else []
    batches = [sizes[a:b] for a, b in zip([0] + cuts, cuts + [len(sizes)])]
    kind = draw(st.sampled_from(["truncate", "flip", "append"]))
    return batches, kind, draw(st.randoms(use_true_random=False))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage_st())
def test_random_damage_yields_a_committed_prefix_and_keeps_the_evidence(case):
    batches, kind, rnd = case
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        orig = Original(tmp / "orig", batches)
        size = len(orig.raw)
        if kind == "truncate":
            damaged = orig.raw[: rnd.randrange(layout.HEADER_SIZE, size)]
            expect = orig.complete_deeds(len(damaged))
        elif kind == "flip":
            b = bytearray(orig.raw)
            for _ in range(rnd.randint(1, 4)):
                b[rnd.randrange(layout.HEADER_SIZE, size)] ^= 1 << rnd.randrange(8)
            damaged = bytes(b)
            expect = orig.first_damaged(damaged)
        else:
            damaged = orig.raw + rnd.randbytes(rnd.randint(1, 300))
            expect = len(orig.events)
        d = place(tmp / "damaged", damaged, orig.meta)
        # a read-only open first: it must change nothing
        before = (d / "book.log").read_bytes()
        if layout.HEADER_SIZE < len(damaged) <= 48 and not expect:
            # a torn first deed, or vere's layout cut inside its header slot: the bytes
            # cannot tell, so every open refuses it untouched (issue 19 #3)
            for writable in (False, True):
                with pytest.raises(TooShort, match="nothing was changed"):
                    Book.open(d, writable=writable)
            assert (d / "book.log").read_bytes() == before
            return
        with Book.open(d) as book:
            assert book.count >= expect
            for e in range(1, expect + 1):
                assert book.read(e) == orig.events[e - 1]
        assert (d / "book.log").read_bytes() == before
        assert sorted(p.name for p in d.iterdir()) == ["book.log", "meta.bin"]
        check_writable_recovery(d, orig, damaged, expect_k=expect, min_k=0,
                                torn_only=kind == "truncate")


@pytest.mark.parametrize("bad_event", [None, 3, 150, 299])
def test_parallel_crc_check_finds_the_first_bad_deed(tmp_path, monkeypatch, bad_event):
    """Large ranges are split across forked workers; the smallest failing index wins,
    wherever it falls, and a clean log gives None."""
    from bookfs.formats import deedcheck as rec

    monkeypatch.setattr(rec, "_PARALLEL_BYTES", 1)
    d = tmp_path / "log"
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, [bytes([i % 256]) * (4 + i) for i in range(300)])
        offsets = list(b.index.offsets)
    if bad_event is not None:
        with open(d / "book.log", "r+b") as f:
            f.seek(offsets[bad_event - 1] + 8)
            f.write(b"\xff\xfe\xfd\xfc")
    with Book.open(d) as b:
        for workers in (2, 3):
            got = rec.first_bad_deed(b.fileno(), b.index.offsets, 0, b.index.end,
                                     workers=workers)
            assert got == (None if bad_event is None else bad_event - 1)


def test_salvage_reads_every_window_into_one_buffer(tmp_path, monkeypatch):
    """``find_valid_deeds`` reads its windows into one buffer, as the chain walk reads its
    steps (``tests/test_chain.py``): a fresh 64 MiB ``bytes`` a window is a fresh
    ``mmap`` faulted in page by page.  It still finds every deed."""
    from bookfs.formats import deedcheck

    monkeypatch.setattr(deedcheck, "_SALVAGE_WINDOW", 4096)
    rng = random.Random(11)
    with Book.open(tmp_path, writable=True, create=True) as b:
        b.save(1, [rng.randbytes(rng.randrange(40, 400)) for _ in range(300)])
        offsets, end = list(b.index.offsets), b.index.end
    buffers = []
    real_v = os.preadv
    monkeypatch.setattr(os, "preadv", lambda f, bufs, off: (
        buffers.extend(memoryview(x).obj for x in bufs), real_v(f, bufs, off))[1])
    fd = os.open(tmp_path / "book.log", os.O_RDONLY)
    try:
        found = find_valid_deeds(fd, offsets[0], end)
    finally:
        os.close(fd)
    assert found == offsets
    assert len(buffers) >= 3, "the scan took several windows"
    assert len({id(x) for x in buffers}) == 1, "each window read into a buffer of its own"
