"""The Book engine against the UIP (seeds/book-uip.md) and reference-formats.md §1.

Real files only: every test writes a log under tmp_path and checks its bytes."""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats.book import Book
from bookfs.errors import (
    BadMagic,
    BadMetaFile,
    BadMetaKey,
    BadMetaSize,
    BadVersion,
    BookError,
    ContiguityError,
    CorruptDeed,
    NoSuchEvent,
    PathEscape,
    PayloadError,
    PayloadTooLarge,
    ReadOnly,
    TooShort,
    UnsupportedLayout,
)

GOLDEN_LOG = bytes.fromhex(
    "4b4f4f42 01000000 01000000 00000000"
    "05000000 00000000 01020304 02 db0e160d 05000000 00000000"
    "06000000 00000000 aabbcc0d 3112 eb8d4ef7 06000000 00000000".replace(" ", "")
)
FRESH_LOG = bytes.fromhex("4b4f4f42 01000000 00000000 00000000".replace(" ", ""))


def files(path: Path) -> dict[str, bytes]:
    """Name -> bytes of every regular file in ``path``."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def write_log(path: Path, raw: bytes, meta: bytes = bytes(256)) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "book.log").write_bytes(raw)
    (path / "meta.bin").write_bytes(meta)
    return path


def deed(payload: bytes) -> bytes:
    n = len(payload)
    head = struct.pack("<Q", n)
    return head + payload + struct.pack("<IQ", zlib.crc32(head + payload), n)


def header(fir: int, magic: int = 0x424F4F4B, version: int = 1) -> bytes:
    return struct.pack("<IIQ", magic, version, fir)


# --- golden bytes --------------------------------------------------------------------------


def test_fresh_log_and_meta_bytes(tmp_path):
    with Book.open(tmp_path / "b", writable=True, create=True) as book:
        assert book.gulf() == (0, 0)
    assert (tmp_path / "b" / "book.log").read_bytes() == FRESH_LOG
    assert (tmp_path / "b" / "meta.bin").read_bytes() == bytes(256)


def test_golden_uip_example_byte_for_byte(tmp_path):
    d = tmp_path / "b"
    with Book.open(d, writable=True, create=True) as book:
        book.save(1, [bytes.fromhex("0102030402"), bytes.fromhex("aabbcc0d3112")])
        assert book.gulf() == (1, 2)
    raw = (d / "book.log").read_bytes()
    assert raw == GOLDEN_LOG
    assert raw[:4] == b"KOOB"  # the magic is little-endian on disk
    assert len(raw) == 16 + (5 + 20) + (6 + 20)
    with Book.open(d) as book:
        assert book.read(1) == bytes.fromhex("0102030402")
        assert book.read(2) == bytes.fromhex("aabbcc0d3112")


def test_reads_a_golden_log_written_by_someone_else(tmp_path):
    d = write_log(tmp_path / "b", GOLDEN_LOG)
    with Book.open(d) as book:
        assert book.gulf() == (1, 2)
        assert list(book.walk()) == [(1, bytes.fromhex("0102030402")),
                                     (2, bytes.fromhex("aabbcc0d3112"))]
        assert book.recovery.clean


def test_meta_bin_layout(tmp_path):
    d = tmp_path / "b"
    who = bytes(range(1, 17))
    with Book.open(d, writable=True, create=True) as book:
        book.save_meta("who", who)
        book.save_meta("version", struct.pack("<I", 3))
        book.save_meta("life", struct.pack("<I", 0x11223344))
        book.save_meta("fake", b"\x01")
    raw = (d / "meta.bin").read_bytes()
    assert len(raw) == 256
    assert raw[0:16] == who
    assert raw[16:20] == bytes.fromhex("03000000")
    assert raw[20:24] == bytes.fromhex("44332211")
    assert raw[24:25] == b"\x01"
    assert raw[25:] == bytes(231)
    # and the same bytes come back by key, also from a read-only open
    with Book.open(d) as book:
        assert book.read_meta("who") == who
        assert book.read_meta("version") == b"\x03\x00\x00\x00"
        assert book.read_meta("life") == bytes.fromhex("44332211")
        assert book.read_meta("fake") == b"\x01"
        assert book.meta() == {"who": who, "version": b"\x03\0\0\0",
                               "life": bytes.fromhex("44332211"), "fake": b"\x01"}


def test_files_created_0644_regardless_of_umask(tmp_path):
    old = os.umask(0o077)
    try:
        d = tmp_path / "b"
        with Book.open(d, writable=True, create=True) as book:
            book.save(1, [b"abcd"])
        for name in ("book.log", "meta.bin", "book.lock"):
            mode = stat.S_IMODE(os.stat(d / name).st_mode)
            assert mode == 0o644, f"{name}: {mode:o}"
    finally:
        os.umask(old)


# --- round trips ---------------------------------------------------------------------------


def test_empty_log(tmp_path):
    d = tmp_path / "b"
    with Book.open(d, writable=True, create=True) as book:
        assert book.gulf() == (0, 0)
        assert book.count == 0
        assert list(book.walk()) == []
        assert 1 not in book
        with pytest.raises(NoSuchEvent):
            book.read(1)
    with Book.open(d) as book:
        assert book.gulf() == (0, 0)
        assert list(book.walk()) == []


def test_save_read_walk_batches_and_reopen(tmp_path, payload):
    d = tmp_path / "b"
    sizes = [4, 4, 5, 100, 7, 4096, 33, 4, 100_000, 12]
    want = [payload(e, s) for e, s in enumerate(sizes, 1)]
    with Book.open(d, writable=True, create=True) as book:
        book.save(1, want[:1])
        book.save(2, want[1:4])
        book.save(5, iter(want[4:9]))  # any iterable
        book.save(10, want[9:])
        book.save(11, [])  # nothing to do
        assert book.gulf() == (1, 10)
        assert [book.read(e) for e in range(1, 11)] == want
        assert list(book.walk()) == list(enumerate(want, 1))
        assert book.log_bytes == os.path.getsize(d / "book.log")
    raw = (d / "book.log").read_bytes()
    assert len(raw) == 16 + sum(s + 20 for s in sizes)
    for writable in (False, True):
        with Book.open(d, writable=writable) as book:
            assert book.gulf() == (1, 10)
            assert book.count == 10
            assert list(book.walk()) == list(enumerate(want, 1))
            assert list(book.walk(3, 5)) == [(3, want[2]), (4, want[3]), (5, want[4])]
            assert list(book.walk(5, 4)) == []
            for e, s in enumerate(sizes, 1):
                assert book.payload_size(e) == s
                book.verify_event(e)
                assert book.read_slice(e, 0, 1 << 30) == want[e - 1]
                assert book.read_slice(e, 2, 3) == want[e - 1][2:5]
                assert book.read_slice(e, s, 10) == b""
            assert book.verify() == []
            with pytest.raises(NoSuchEvent):
                book.read(11)
            with pytest.raises(NoSuchEvent):
                book.read(0)
            with pytest.raises(NoSuchEvent):
                list(book.walk(0, 3))
            with pytest.raises(NoSuchEvent):
                list(book.walk(9, 11))
    assert (d / "book.log").read_bytes() == raw  # opening never rewrote anything


def test_mtime_follows_append_order(make_book):
    d = make_book([4, 5], [6])
    with Book.open(d) as book:
        times = [book.mtime_ns(e) for e in (1, 2, 3)]
    assert all(t > 0 for t in times)
    assert times == sorted(times)


def test_epoch_first_event_must_be_epoch_plus_one(tmp_path):
    d = tmp_path / "b"
    with Book.open(d, writable=True, create=True) as book:
        before = files(d)
        for bad in (1, 5, 7, 0):
            with pytest.raises(ContiguityError) as ei:
                book.save(bad, [b"abcd"], epoch=5)
            assert "6" in str(ei.value) and str(d / "book.log") in str(ei.value)
        assert files(d) == before
        book.save(6, [b"abcd", b"efgh"], epoch=5)
        assert book.gulf() == (6, 7)
        # once the log has events, the next is last + 1, whatever epoch says
        with pytest.raises(ContiguityError):
            book.save(1, [b"abcd"], epoch=0)
        book.save(8, [b"ijkl"], epoch=0)
    raw = (d / "book.log").read_bytes()
    assert struct.unpack_from("<Q", raw, 8)[0] == 6  # fir_d
    with Book.open(d) as book:
        assert book.gulf() == (6, 8)
        assert book.read(6) == b"abcd" and book.read(8) == b"ijkl"


@pytest.mark.parametrize("first", [0, 1, 3, 4, 6, 100])
def test_contiguity_violation_writes_nothing(make_book, first):
    d = make_book([4, 5, 6], [7])  # events 1..4
    before = files(d)
    with Book.open(d, writable=True) as book:
        with pytest.raises(ContiguityError) as ei:
            book.save(first, [b"abcd", b"efgh"])
        assert "must be 5" in str(ei.value)
        assert book.gulf() == (1, 4)
        book_bytes = (d / "book.log").read_bytes()
        assert book_bytes == before["book.log"]
        book.save(5, [b"abcd"])  # the book still works
        assert book.gulf() == (1, 5)


@pytest.mark.parametrize("bad", [b"", b"a", b"abc"])
def test_short_payload_is_refused_and_nothing_written(make_book, bad):
    d = make_book([4, 5])
    before = files(d)
    with Book.open(d, writable=True) as book:
        with pytest.raises(PayloadError) as ei:
            book.save(3, [b"good", bad, b"also good"])
        assert ei.value.errno == errno.EINVAL
        assert f"{len(bad)} bytes" in str(ei.value) and "event 4" in str(ei.value)
        assert (d / "book.log").read_bytes() == before["book.log"]
        assert book.gulf() == (1, 2)
    assert files(d) == before


def test_oversized_payload_is_refused_without_writing(tmp_path, make_book):
    """A payload over 2^32 bytes (a sparse file mapped, so nothing is really allocated)."""
    d = make_book([4])
    before = (d / "book.log").read_bytes()
    big = tmp_path / "sparse"
    with open(big, "wb") as f:
        f.truncate((1 << 32) + 1)
    with open(big, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        with Book.open(d, writable=True) as book:
            with pytest.raises(PayloadTooLarge) as ei:
                book.save(2, [b"abcd", mm])
            assert ei.value.errno == errno.EFBIG
    assert (d / "book.log").read_bytes() == before


def test_meta_keys_errors_and_reopen(tmp_path):
    d = tmp_path / "b"
    sizes = {"who": 16, "version": 4, "life": 4, "fake": 1}
    with Book.open(d, writable=True, create=True) as book:
        for key, size in sizes.items():
            assert book.read_meta(key) == bytes(size)
        for key, size in sizes.items():
            value = bytes((size * 7 + i) & 0xFF for i in range(size))
            book.save_meta(key, value)
            assert book.read_meta(key) == value
        before = (d / "meta.bin").read_bytes()
        with pytest.raises(BadMetaKey) as ei:
            book.read_meta("nope")
        assert "nope" in str(ei.value) and ei.value.errno == errno.ENOENT
        with pytest.raises(BadMetaKey):
            book.save_meta("nope", b"\x00")
        for key, size in sizes.items():
            for wrong in (size - 1, size + 1, 0):
                with pytest.raises(BadMetaSize) as ei:
                    book.save_meta(key, bytes(wrong))
                assert ei.value.errno == errno.EINVAL
                assert f"exactly {size} bytes" in str(ei.value)
        assert (d / "meta.bin").read_bytes() == before
    with Book.open(d) as book:
        for key, size in sizes.items():
            assert book.read_meta(key) == bytes((size * 7 + i) & 0xFF for i in range(size))
        with pytest.raises(ReadOnly):
            book.save_meta("fake", b"\x01")
        with pytest.raises(ReadOnly):
            book.save(1, [b"abcd"])
    assert (d / "meta.bin").read_bytes() == before


def test_open_arguments(tmp_path):
    with pytest.raises(ValueError):
        Book.open(tmp_path / "x", create=True)
    with pytest.raises(BookError):
        Book.open(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BookError) as ei:
        Book.open(tmp_path / "empty")
    assert "book.log" in str(ei.value)


# --- every UIP rejection -------------------------------------------------------------------


@pytest.mark.parametrize("writable", [False, True])
def test_bad_magic(tmp_path, writable):
    d = write_log(tmp_path / "b", header(1, magic=0x12345678) + deed(b"abcd"))
    before = files(d)
    with pytest.raises(BadMagic) as ei:
        Book.open(d, writable=writable)
    msg = str(ei.value)
    assert str(d / "book.log") in msg and "0x12345678" in msg
    assert ei.value.errno == errno.EINVAL
    assert {k: v for k, v in files(d).items() if k != "book.lock"} == before


@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("version", [0, 2, 0xFFFFFFFF])
def test_bad_version(tmp_path, writable, version):
    d = write_log(tmp_path / "b", header(1, version=version) + deed(b"abcd"))
    before = files(d)
    with pytest.raises(BadVersion) as ei:
        Book.open(d, writable=writable)
    msg = str(ei.value)
    assert str(d / "book.log") in msg and f"version {version}" in msg
    assert {k: v for k, v in files(d).items() if k != "book.lock"} == before


@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("size", [0, 1, 4, 15])
def test_log_under_16_bytes(tmp_path, writable, size):
    d = write_log(tmp_path / "b", FRESH_LOG[:size])
    with pytest.raises(TooShort) as ei:
        Book.open(d, writable=writable)
    msg = str(ei.value)
    assert str(d / "book.log") in msg and f"{size} bytes" in msg
    assert (d / "book.log").read_bytes() == FRESH_LOG[:size]


@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("size", [0, 255, 257, 4096])
def test_meta_bin_of_wrong_size(tmp_path, writable, size):
    d = write_log(tmp_path / "b", GOLDEN_LOG, meta=b"\x07" * size)
    with pytest.raises(BadMetaFile) as ei:
        Book.open(d, writable=writable)
    msg = str(ei.value)
    assert str(d / "meta.bin") in msg and f"{size} bytes" in msg
    assert (d / "meta.bin").read_bytes() == b"\x07" * size
    assert (d / "book.log").read_bytes() == GOLDEN_LOG


# --- layouts that are recognised and refused -----------------------------------------------


def vere_slot(fir, las, seq, bat, sum_):
    body = struct.pack("<IIQQQQI", 0x424F4F4B, 1, fir, las, seq, bat, sum_)
    return body + struct.pack("<I", zlib.crc32(body))


def vere_golden() -> bytes:
    """reference-formats.md §2's golden example, built from its description."""
    d1, d2, d3 = (struct.pack("<Q", len(p)) + p + struct.pack("<Q", len(p))
                  for p in (bytes.fromhex("0102030402"), bytes.fromhex("0000000029"),
                            bytes.fromhex("aabbcc0d3112")))
    a = vere_slot(0, 3, 2, 1, zlib.crc32(d3))
    b = vere_slot(0, 2, 1, 2, zlib.crc32(d1 + d2))
    assert zlib.crc32(d3) == 0x5B7083BA and zlib.crc32(d1 + d2) == 0xB0FDAE19
    assert a[44:] == struct.pack("<I", 0xF210DA4E) and b[44:] == struct.pack("<I", 0xFD2C06C7)
    raw = a.ljust(4096, b"\0") + b.ljust(4096, b"\0") + d1 + d2 + d3
    assert len(raw) == 8256
    return raw


@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("damage", ["none", "slot A torn"])
def test_vere_layout_is_refused(tmp_path, writable, damage):
    raw = bytearray(vere_golden())
    if damage == "slot A torn":
        raw[40] ^= 0xFF  # slot A's crc no longer matches; slot B still identifies the file
    meta = bytes.fromhex("00010000000000000000000000000000 03000000 11000000 01".replace(" ", ""))
    d = write_log(tmp_path / "b", bytes(raw), meta.ljust(256, b"\0"))
    before = files(d)
    with pytest.raises(UnsupportedLayout) as ei:
        Book.open(d, writable=writable)
    assert str(d / "book.log") in str(ei.value) and "vere" in str(ei.value)
    assert {k: v for k, v in files(d).items() if k != "book.lock"} == before


def padded_deed(payload: bytes, pad: bytes = b"\xde\xad\xbe\xef") -> bytes:
    """January 2026: the 12-byte head and tail as 16-byte C structs (4 pad bytes each)."""
    n = len(payload)
    crc = zlib.crc32(struct.pack("<Q", n) + payload)
    return (struct.pack("<QI", n, int.from_bytes(payload[:4], "little")) + pad + payload[4:]
            + struct.pack("<I", crc) + pad + struct.pack("<Q", n))


@pytest.mark.parametrize("writable", [False, True])
def test_padded_january_2026_layout_is_refused(tmp_path, writable):
    deeds = [padded_deed(p) for p in (bytes.fromhex("0102030402"), b"abcdefgh", b"wxyz")]
    assert [len(x) for x in deeds] == [5 + 28, 8 + 28, 4 + 28]
    d = write_log(tmp_path / "b", header(1) + b"".join(deeds))
    before = files(d)
    with pytest.raises(UnsupportedLayout) as ei:
        Book.open(d, writable=writable)
    assert str(d / "book.log") in str(ei.value) and "padded" in str(ei.value)
    assert {k: v for k, v in files(d).items() if k != "book.lock"} == before


# --- hostile input -------------------------------------------------------------------------


@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("len_d", [1 << 40, (1 << 32) + 1, 1 << 31, (1 << 64) - 1])
def test_huge_or_past_eof_len_is_a_bad_region_without_allocation(tmp_path, writable, len_d):
    good = [b"abcd", b"0123456789"]
    hostile = struct.pack("<QI", len_d, 0x11223344) + bytes(range(200))
    raw = header(1) + b"".join(deed(p) for p in good) + hostile
    d = write_log(tmp_path / "b", raw)
    bad_at = len(raw) - len(hostile)
    tracemalloc.start()
    try:
        book = Book.open(d, writable=writable)
        try:
            assert book.gulf() == (1, 2)
            assert list(book.walk()) == [(1, good[0]), (2, good[1])]
            assert 3 not in book
            rep = book.recovery
            assert not rep.clean
            if writable:
                spans = [(o, n) for _, o, n in rep.quarantined]
                if rep.torn_tail:
                    spans.append(rep.torn_tail)
                assert spans == [(bad_at, len(hostile))]
                for qpath, o, n in rep.quarantined:
                    assert Path(qpath).read_bytes() == raw[o : o + n]
            else:
                assert rep.bad_region == (bad_at, len(hostile))
        finally:
            book.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak} bytes for a {len(raw)}-byte log"
    if writable:
        assert (d / "book.log").read_bytes() == raw[:bad_at]
    else:
        assert (d / "book.log").read_bytes() == raw


def test_reader_of_a_log_cut_under_it_gets_corrupt_deed_not_a_crash(make_book, payload):
    d = make_book([10, 20, 30])
    with Book.open(d) as book:
        assert book.read(3) == payload(3, 30)
        with open(d / "book.log", "r+b") as f:  # someone cuts the log under the reader
            f.truncate(os.path.getsize(d / "book.log") - 7)
        with pytest.raises(CorruptDeed) as ei:
            book.read(3)
        assert ei.value.event == 3
        with pytest.raises(CorruptDeed):
            book.verify_event(3)
        assert book.read(2) == payload(2, 20)


@pytest.mark.parametrize("writable", [False, True])
@pytest.mark.parametrize("name", ["book.log", "meta.bin"])
def test_symlink_out_of_the_directory_is_path_escape(tmp_path, make_book, writable, name):
    d = make_book([4, 5])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (d / name).rename(elsewhere / name)
    (d / name).symlink_to(elsewhere / name)
    before = (elsewhere / name).read_bytes()
    with pytest.raises(PathEscape) as ei:
        Book.open(d, writable=writable)
    assert str(d / name) in str(ei.value) and str(elsewhere) in str(ei.value)
    assert (elsewhere / name).read_bytes() == before


def test_symlink_inside_the_directory_is_fine(make_book, payload):
    d = make_book([4, 5])
    (d / "book.log").rename(d / "real.log")
    (d / "book.log").symlink_to("real.log")
    with Book.open(d) as book:
        assert book.read(2) == payload(2, 5)


# --- a failed write leaves the log exactly as before ---------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs (needs root); skipped where mounting is not allowed (see the
    RLIMIT_FSIZE test below, which covers the same path without privileges)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        chunk = b"\xaa" * 4096
        while True:
            try:
                if os.write(fd, chunk) == 0:
                    break
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
        chunk = b"\xaa"
        while True:  # the last few bytes
            try:
                os.write(fd, chunk)
            except OSError:
                break
    finally:
        os.close(fd)


@pytest.mark.parametrize("empty", [False, True])
def test_enospc_leaves_the_log_exactly_as_before(small_fs, payload, empty):
    d = small_fs / "b"
    with Book.open(d, writable=True, create=True) as book:
        if not empty:
            book.save(1, [payload(1, 100), payload(2, 5000)])
        first = 1 if empty else 3
        fill(small_fs / "filler")
        before = files(d)
        big = [payload(first, 30_000), payload(first + 1, 20_000)]
        with pytest.raises(OSError) as ei:
            book.save(first, big)
        assert ei.value.errno == errno.ENOSPC
        assert files(d) == before  # the log (and its fir_d) exactly as before
        assert book.gulf() == ((0, 0) if empty else (1, 2))
        os.unlink(small_fs / "filler")
        book.save(first, big)  # the book still works
        assert book.read(first) == big[0] and book.read(first + 1) == big[1]
    with Book.open(d, writable=True) as book:
        assert book.recovery.clean
        assert book.gulf() == (1, first + 1)
        assert book.verify() == []


RLIMIT_CHILD = textwrap.dedent(
    """
    import errno, json, os, resource, signal, sys
    from bookfs.formats.book import Book
    d, empty = sys.argv[1], sys.argv[2] == "1"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    book = Book.open(d, writable=True, create=True)
    if not empty:
        book.save(1, [b"abcd" * 25, b"efgh" * 1000])
    first = book.last + 1
    log = os.path.join(d, "book.log")
    before = open(log, "rb").read()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 1000, hard))
    try:
        book.save(first, [b"x" * 30000, b"y" * 20000])
        err = None
    except OSError as e:
        err = e.errno
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    same = open(log, "rb").read() == before
    gulf = book.gulf()
    book.save(first, [b"x" * 30000, b"y" * 20000])
    book.close()
    print(json.dumps({"err": err, "same": same, "gulf": list(gulf), "first": first}))
    """
)


@pytest.mark.parametrize("empty", [False, True])
def test_file_size_limit_leaves_the_log_exactly_as_before(tmp_path, empty):
    d = tmp_path / "b"
    r = subprocess.run([sys.executable, "-c", RLIMIT_CHILD, str(d), "1" if empty else "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["err"] == errno.EFBIG
    assert out["same"] is True
    assert out["gulf"] == ([0, 0] if empty else [1, 2])
    first = out["first"]
    with Book.open(d, writable=True) as book:
        assert book.recovery.clean
        assert book.gulf() == (1, first + 1)
        assert book.read(first) == b"x" * 30000
        assert book.verify() == []


# --- property: any sequence of saves round-trips through close/reopen ---------------------

payloads_st = st.one_of(
    st.binary(min_size=4, max_size=4),  # a bare mug: the empty jam
    st.binary(min_size=4, max_size=64),
    st.binary(min_size=65, max_size=3000),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    batches=st.lists(st.lists(payloads_st, min_size=1, max_size=6), min_size=1, max_size=8),
    epoch=st.integers(0, 2**40),
    reopen_between=st.booleans(),
)
def test_random_event_sequences_round_trip(batches, epoch, reopen_between):
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "b")
        want = [p for batch in batches for p in batch]
        book = Book.open(d, writable=True, create=True)
        try:
            nxt = epoch + 1
            for batch in batches:
                book.save(nxt, batch, epoch=epoch)
                nxt += len(batch)
                if reopen_between:
                    book.close()
                    book = Book.open(d, writable=True)
                    assert book.recovery.clean
        finally:
            book.close()
        raw = open(os.path.join(d, "book.log"), "rb").read()
        assert len(raw) == 16 + sum(len(p) + 20 for p in want)
        assert struct.unpack_from("<Q", raw, 8)[0] == epoch + 1
        for writable, cache in ((False, True), (True, True), (False, False)):
            with Book.open(d, writable=writable, use_index_cache=cache) as book:
                assert book.gulf() == (epoch + 1, epoch + len(want))
                assert [p for _, p in book.walk()] == want
                assert [book.payload_size(e) for e in range(epoch + 1, nxt)] == [
                    len(p) for p in want]
                assert book.recovery.clean
        assert open(os.path.join(d, "book.log"), "rb").read() == raw


def test_read_payloads_unchecked_matches_reads(tmp_path):
    from bookfs.formats.vere import VereBook

    pays = [bytes([i % 251]) * (4 + (i * 13) % 300) for i in range(1, 60)]
    for opener, d in ((Book.open, tmp_path / "uip"), (VereBook.open, tmp_path / "0i0")):
        with opener(d, writable=True, create=True) as b:
            b.save(1, pays[:30])
            b.save(31, pays[30:])
            got = b.read_payloads_unchecked(5, 45)
            assert [bytes(v) for v in got] == pays[4:45]
            assert [bytes(v) for v in b.read_payloads_unchecked(59, 59)] == [pays[58]]
