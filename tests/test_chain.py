"""The chain walk that confirms a persisted index (``framing.confirm_chain``, issue 34.6:
a log of 10 million deeds is confirmed at the speed of reading it, not of one ``pread``
a deed) finds exactly the first deed the per-deed rule finds, whatever the index says:
random chains, random lies, steps cut by the deed and byte bounds, a file cut short."""

from __future__ import annotations

import os
import random
from array import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats import framing
from bookfs.formats.book import Book
from bookfs.formats.layout import DEED_LEN, DEED_OVERHEAD


def reference(fd, offsets, k, i, count, end, overhead) -> int:
    """The rule, one deed at a time (what Book._confirm_offset did before)."""
    while k <= i:
        nxt = offsets[k + 1] if k + 1 < count else end
        head = os.pread(fd, 8, offsets[k])
        if len(head) != 8 or DEED_LEN.unpack(head)[0] + overhead != nxt - offsets[k]:
            return k
        k += 1
    return k


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(4, 3000), min_size=1, max_size=120),
       seed=st.integers(0, 2**32), lie=st.sampled_from(["none", "shift", "swap", "end",
                                                        "cut"]),
       step_deeds=st.integers(1, 40), step_bytes=st.integers(8, 20000),
       alone=st.sampled_from([0, 30, 256]), first=st.integers(1, 20000))
def test_confirm_chain_agrees_with_the_rule(tmp_path_factory, monkeypatch, sizes, seed, lie,
                                            step_deeds, step_bytes, alone, first):
    monkeypatch.setattr(framing, "_WALK_ALONE", alone)  # 0: always the vectorised steps
    monkeypatch.setattr(framing, "_WALK_DEEDS", step_deeds)
    monkeypatch.setattr(framing, "_WALK_BYTES", step_bytes)
    monkeypatch.setattr(framing, "_WALK_FIRST", first)  # below a step's size: it grows
    rng = random.Random(seed)
    d = tmp_path_factory.mktemp("chain")
    with Book.open(d, writable=True, create=True) as b:
        b.save(1, [rng.randbytes(n) for n in sizes])
        offsets = array("Q", b.index.offsets)
        end = b.index.end
    n = len(offsets)
    if lie == "shift" and n > 1:
        j = rng.randrange(1, n)
        offsets[j] += rng.choice([-1, 1, 8])
    elif lie == "swap" and n > 2:
        j = rng.randrange(1, n - 1)
        offsets[j], offsets[j + 1] = offsets[j + 1], offsets[j]
    elif lie == "end":
        end += rng.choice([-8, 1, 12])
    path = d / "book.log"
    if lie == "cut":
        os.truncate(path, rng.randrange(16, os.path.getsize(path)))
    fd = os.open(path, os.O_RDONLY)
    try:
        for k, i in ((0, n - 1), (rng.randrange(n), n - 1), (0, rng.randrange(n))):
            if k > i:
                continue
            want = reference(fd, offsets, k, i, n, end, DEED_OVERHEAD)
            assert framing.confirm_chain(fd, offsets, k, i, n, end, DEED_OVERHEAD) == want
    finally:
        os.close(fd)


def _walk_in_small_steps(tmp_path, monkeypatch, seed: int, sizes: tuple[int, int],
                        count: int, *, on_read) -> int:
    """A log of ``count`` random deeds of ``sizes`` bytes, walked whole by
    ``confirm_chain`` in steps of at most 64 deeds or 4 KiB; ``on_read(n, bufs)`` is told
    of each read (``n`` bytes asked for; the buffers read into, for a ``preadv``).
    Returns the log's end."""
    monkeypatch.setattr(framing, "_WALK_ALONE", 0)
    monkeypatch.setattr(framing, "_WALK_DEEDS", 64)
    monkeypatch.setattr(framing, "_WALK_BYTES", 4096)
    rng = random.Random(seed)
    with Book.open(tmp_path, writable=True, create=True) as b:
        b.save(1, [rng.randbytes(rng.randrange(*sizes)) for _ in range(count)])
        offsets, end = array("Q", b.index.offsets), b.index.end
    fd = os.open(tmp_path / "book.log", os.O_RDONLY)
    real, real_v = os.pread, os.preadv
    monkeypatch.setattr(os, "pread", lambda f, n, off: (on_read(n, ()), real(f, n, off))[1])
    monkeypatch.setattr(os, "preadv", lambda f, bufs, off: (
        on_read(sum(len(x) for x in bufs), bufs), real_v(f, bufs, off))[1])
    try:
        assert framing.confirm_chain(fd, offsets, 0, count - 1, count, end,
                                     DEED_OVERHEAD) == count
    finally:
        os.close(fd)
        monkeypatch.undo()
    return end


def test_a_step_of_larger_deeds_is_cut_to_the_byte_bound_not_walked_a_deed_at_a_time(
        tmp_path, monkeypatch):
    """Deeds larger than ``_WALK_BYTES / _WALK_DEEDS``: a step of ``_WALK_DEEDS`` of them
    is over the byte bound, and is cut to as many deeds as fit in it.  (It was walked one
    ``pread`` a deed, each step copying ``_WALK_DEEDS`` offsets again: 13.7 µs a deed,
    1.3 s to confirm a 100,000-event sample log of 2.4 KB deeds.)"""
    reads = []  # bytes asked for by each read, pread or preadv
    end = _walk_in_small_steps(tmp_path, monkeypatch, 5, (150, 250), 2000,
                               on_read=lambda n, bufs: reads.append(n))
    # about end / 4096 steps of about 4 KiB each; not 2,000 reads of 8 bytes
    assert len(reads) <= 2 * end // 4096 + 2 and min(reads) > 8, (len(reads), end)


def test_a_walk_reads_every_step_into_one_buffer(tmp_path, monkeypatch):
    """The walk's steps are read into one buffer, reused: a fresh 64 MiB ``bytes`` a step
    was allocated (``mmap``) and faulted in page by page each time, a third of a warm
    walk's CPU (123 ms against 78 ms for the 100,000-event sample log)."""
    buffers = []
    _walk_in_small_steps(tmp_path, monkeypatch, 7, (20, 90), 1000, on_read=lambda n, bufs: (
        buffers.extend(memoryview(x).obj for x in bufs)))
    assert len(buffers) >= 3, "the walk took several steps"
    assert len({id(x) for x in buffers}) == 1, "each step read into a buffer of its own"


def test_a_walk_whose_steps_outgrow_its_first_buffer_agrees_with_the_rule(tmp_path,
                                                                           monkeypatch):
    """Small deeds first, then larger ones: the walk's later steps need more than its
    first buffer held, so it grows (a new buffer); a step that reuses a larger buffer
    reads only its own bytes.  The walk still agrees with the per-deed rule, with the
    index true and with a lie in a deed after the growth."""
    monkeypatch.setattr(framing, "_WALK_ALONE", 0)
    monkeypatch.setattr(framing, "_WALK_DEEDS", 8)
    monkeypatch.setattr(framing, "_WALK_BYTES", 64 << 10)
    monkeypatch.setattr(framing, "_WALK_FIRST", 16)
    rng = random.Random(13)
    sizes = [10] * 8 + [2000] * 40 + [10] * 16  # grows at the second step; small again
    with Book.open(tmp_path, writable=True, create=True) as b:
        b.save(1, [rng.randbytes(n) for n in sizes])
        true, end = array("Q", b.index.offsets), b.index.end
    n = len(true)
    grown = []
    real = bytearray
    monkeypatch.setattr(framing, "bytearray", lambda size: (grown.append(size), real(size))[1],
                        raising=False)
    fd = os.open(tmp_path / "book.log", os.O_RDONLY)
    try:
        assert framing.confirm_chain(fd, true, 0, n - 1, n, end, DEED_OVERHEAD) == n
        assert len(grown) >= 2 and grown[-1] > grown[0], grown
        for j in (20, 45, 60):  # lies after the growth, and in the small deeds after it
            lying = array("Q", true)
            lying[j] += 8
            want = reference(fd, lying, 0, n - 1, n, end, DEED_OVERHEAD)
            assert want < n
            assert framing.confirm_chain(fd, lying, 0, n - 1, n, end, DEED_OVERHEAD) == want
    finally:
        os.close(fd)


def test_a_walk_of_small_deeds_goes_in_cache_sized_steps(tmp_path, monkeypatch):
    """A step reads at most 8 MiB and confirms at most 8,192 deeds, so its buffer and its
    numpy temporaries stay in a core's caches: steps of 65,536 deeds and up to 64 MiB
    (the old bounds) walked the 10-million-event ship's chain three times slower.  Here
    a 24 MB log of 600-byte deeds, which the old bounds read in one step."""
    from bookfs.formats.deeds import UIP
    from bookfs.formats.layout import HEADER_SIZE

    deed = UIP.encode(random.Random(3).randbytes(600))
    n = (24 << 20) // len(deed)
    path = tmp_path / "book.log"
    path.write_bytes(b"\0" * HEADER_SIZE + deed * n)
    offsets = array("Q", (HEADER_SIZE + k * len(deed) for k in range(n)))
    steps = []
    real = framing.pread_into
    monkeypatch.setattr(framing, "pread_into",
                        lambda fd, buf, want, at: steps.append(want) or real(fd, buf, want, at))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert framing.confirm_chain(fd, offsets, 0, n - 1, n, os.fstat(fd).st_size,
                                     DEED_OVERHEAD) == n
    finally:
        os.close(fd)
    assert len(steps) >= 3 and max(steps) <= 8 << 20
    assert min(steps[:-1]) // len(deed) <= 8192


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=200),
       step_deeds=st.integers(1, 50), step_bytes=st.integers(1, 300), data=st.data())
def test_a_walk_ahead_stays_within_one_step(sizes, step_deeds, step_bytes, data):
    """``walk_ahead(offsets, i, count)``, how far a walk asked for deed ``i`` goes, against
    the rule counted out deed by deed: on past ``i`` by as many deeds as fit in one step
    (fewer than ``_WALK_DEEDS``, the next offset known, spanning at most ``_WALK_BYTES``
    from deed ``i + 1``: each ``len_d`` is then read by the step's one ``pread``, never
    alone, one seek each), never past the last deed."""
    import pytest

    mp = pytest.MonkeyPatch()
    mp.setattr(framing, "_WALK_DEEDS", step_deeds)
    mp.setattr(framing, "_WALK_BYTES", step_bytes)
    try:
        offsets = array("Q", [16])
        for s in sizes:
            offsets.append(offsets[-1] + s)
        count = len(sizes)  # the last offset is the end of the log, not a deed
        i = data.draw(st.integers(0, count - 1))
        expected = i
        for m in range(i + 1, min(count, i + 1 + step_deeds) - 1):
            if offsets[m + 1] - offsets[i + 1] > step_bytes:
                break
            expected = m
        got = framing.walk_ahead(offsets, i, count)
        assert got == expected and i <= got <= count - 1 and got - i < step_deeds
    finally:
        mp.undo()


def test_a_walk_ahead_of_deeds_larger_than_a_step_adds_none():
    """Deeds of more than ``_WALK_BYTES`` have their ``len_d`` read one ``pread`` each, a
    seek each from the disk: a walk goes no further than the deed asked for."""
    big = framing._WALK_BYTES + 1
    offsets = array("Q", [16 + k * big for k in range(6)])
    assert [framing.walk_ahead(offsets, i, 5) for i in range(5)] == [0, 1, 2, 3, 4]
    small = array("Q", [16 + k * 100 for k in range(20001)])
    assert framing.walk_ahead(small, 0, 20000) == framing._WALK_DEEDS - 1
    assert framing.walk_ahead(small, 19990, 20000) == 19998
