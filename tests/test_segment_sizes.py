"""``segments/<K>.sizes``: the payload size of each of segment K's events, a little-endian
u64 each, from the mount's offset index (issue 34.5: Spark's ``event``/``size`` read it
instead of every payload byte).  Driven through real mounts with real syscalls: its bytes
against ``stat`` of ``events/``, the names it answers to, its growth with the log, and a
damaged payload that keeps its size (as ``ls -l events/`` shows it) while its bytes fail."""

from __future__ import annotations

import errno
import os
import struct

import pytest

from bookfs.formats.book import Book
from mount_fixtures import build_sample, err_of, module_cache, payload, wait_for  # noqa: F401
from tests.mounting import mounted

EVENTS = 600
SMALL_SEGMENTS = "segment_mb=0.02"  # ~20 KiB segments: the sample makes dozens


def words(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) % 8 == 0 and os.stat(path).st_size == len(data)
    return list(struct.unpack(f"<{len(data) // 8}Q", data))


def sizes_by_stat(mnt, first: int, count: int) -> list[int]:
    return [os.stat(f"{mnt}/events/{e:012d}").st_size for e in range(first, first + count)]


@pytest.fixture(scope="module")
def src(tmp_path_factory, module_cache):
    return build_sample(tmp_path_factory.mktemp("sizes") / "log", EVENTS)


@pytest.mark.parametrize("path_kind", ["no-open", "stock"])
def test_each_segments_sizes_are_its_events_sizes(src, tmp_path, monkeypatch, path_kind):
    """Read by inode (the patched pyfuse3's no-open path) and through handles (stock)."""
    if path_kind == "stock":
        monkeypatch.setenv("BOOKFS_STOCK_PYFUSE3", "1")  # the daemon opens with handles
    with mounted(src, tmp_path / "mnt", "-o", f"ro,{SMALL_SEGMENTS}") as m:
        firsts = sorted(int(n) for n in os.listdir(f"{m}/segments"))
        assert len(firsts) > 10
        assert all(n.isdigit() for n in os.listdir(f"{m}/segments"))  # listed: segments only
        seen = []
        for first, nxt in zip(firsts, firsts[1:] + [EVENTS + 1]):
            got = words(f"{m}/segments/{first:012d}.sizes")
            assert got == sizes_by_stat(m, first, nxt - first), first
            seen += got
        assert len(seen) == EVENTS
        # a part of it, at an offset inside a word
        with open(f"{m}/segments/{firsts[3]:012d}.sizes", "rb") as f:
            whole = f.read()
            assert os.pread(f.fileno(), 13, 5) == whole[5:18]
        # its other spelling, and a name that is no segment's
        assert words(f"{m}/segments/{firsts[3]}.sizes") == words(
            f"{m}/segments/{firsts[3]:012d}.sizes")
        inside = next(e for e in range(1, EVENTS) if e not in firsts)  # no segment's first
        assert err_of(os.stat, f"{m}/segments/{inside:012d}.sizes") == errno.ENOENT
        assert err_of(os.stat, f"{m}/segments/.sizes") == errno.ENOENT
        assert err_of(open, f"{m}/segments/{firsts[0]:012d}.sizes", "wb") == errno.EROFS


def test_the_last_segments_sizes_grow_with_the_log(tmp_path):
    src = build_sample(tmp_path / "log", 50)
    with mounted(src, tmp_path / "mnt", "-o", SMALL_SEGMENTS) as m:
        last = max(int(n) for n in os.listdir(f"{m}/segments"))
        path = f"{m}/segments/{last:012d}.sizes"
        before = words(path)
        for n, size in ((51, 300), (52, 9)):
            with open(f"{m}/new/{n}", "wb") as f:
                f.write(payload(n, size))
        assert wait_for(lambda: len(words(path)) == len(before) + 2)
        assert words(path) == before + [300, 9]


def test_a_damaged_payload_keeps_its_size_and_fails_its_read(tmp_path):
    """One payload byte flipped: the listing and ``.sizes`` still give its size (no payload
    byte is read for them), while the event and its segment answer EIO."""
    src = build_sample(tmp_path / "log", 200)
    with Book.open(src) as book:
        offset = book.index.offsets[120 - book.first] + 8 + 10
        size = len(book.read(120))
    with open(src / "book.log", "r+b") as f:
        byte = os.pread(f.fileno(), 1, offset)
        os.pwrite(f.fileno(), bytes([byte[0] ^ 0xFF]), offset)
    with mounted(src, tmp_path / "mnt", "-o", f"ro,{SMALL_SEGMENTS}") as m:
        first = max(k for k in map(int, os.listdir(f"{m}/segments")) if k <= 120)
        assert words(f"{m}/segments/{first:012d}.sizes")[120 - first] == size
        assert err_of(lambda: open(f"{m}/events/{120:012d}", "rb").read()) == errno.EIO
        assert err_of(lambda: open(f"{m}/segments/{first:012d}", "rb").read()) == errno.EIO


def test_a_fleet_ship_answers_its_segments_sizes(src, tmp_path):
    """A fleet mount's ship is the same mount below its own root: its segments' sizes
    files are there too, under the fleet's own inode numbers."""
    import shutil

    fleet = tmp_path / "fleet"
    fleet.mkdir()
    shutil.copytree(src, fleet / "a")
    with mounted(fleet, tmp_path / "mnt", "--fleet", "-o", SMALL_SEGMENTS) as m:
        (ship,) = os.listdir(m)
        firsts = sorted(int(n) for n in os.listdir(f"{m}/{ship}/segments"))
        for first, nxt in zip(firsts, firsts[1:] + [EVENTS + 1]):
            got = words(f"{m}/{ship}/segments/{first:012d}.sizes")
            assert got == sizes_by_stat(f"{m}/{ship}", first, nxt - first), first


@pytest.fixture(scope="module")
def small_book(tmp_path_factory):
    """A 300-event sample log, open, with its payload sizes."""
    path = build_sample(tmp_path_factory.mktemp("sizes-prop") / "log", 300)
    with Book.open(path) as book:
        yield book, {e: len(book.read(e)) for e in range(book.first, book.last + 1)}


def test_any_slice_of_any_segments_sizes_is_the_slice_of_its_words(small_book):
    """``Segments.sizes(seg, offset, size)`` for any span, segment, offset and size: the
    same bytes as the whole file's words sliced there (a property test over reads that
    start and end inside words, past the end, and of nothing)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from bookfs.formats.segments import Segments

    book, sizes = small_book

    @settings(max_examples=300, deadline=None)
    @given(st.integers(64, 1 << 16), st.data())
    def check(span, data):
        segs = list(Segments(book, span))
        seg = data.draw(st.sampled_from(segs))
        whole = b"".join(sizes[e].to_bytes(8, "little") for e in range(seg.first, seg.last + 1))
        assert seg.sizes_size == len(whole)
        offset = data.draw(st.integers(0, len(whole) + 20))
        size = data.draw(st.integers(0, len(whole) + 20))
        assert Segments(book, span).sizes(seg, offset, size) == whole[offset:offset + size]

    check()
