"""The vere-layout engine (bookfs/vere.py) against reference-formats.md §2.

Real files only: every test writes a log under tmp_path and checks its bytes."""

from __future__ import annotations

import errno
import os
import random
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from bookfs.errors import (
    BadMagic,
    ContiguityError,
    CorruptDeed,
    FormatError,
    LockHeld,
    NoSuchEvent,
    PayloadError,
    ReadOnly,
    TooShort,
    UnsupportedLayout,
)
from bookfs.formats.eventlog import EventLog
from bookfs.formats.vere import VereBook
from bookfs.formats.detect import is_vere_layout

MAGIC = 0x424F4F4B


def hx(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", "").replace("\n", ""))


def slot(fir, las, seq, bat, sm, crc) -> bytes:
    """A slot's 48 bytes with the CRC given literally (from the spec), not computed."""
    return struct.pack("<IIQQQQII", MAGIC, 1, fir, las, seq, bat, sm, crc)


def deed(p: bytes) -> bytes:
    return struct.pack("<Q", len(p)) + p + struct.pack("<Q", len(p))


def files(path: Path) -> dict[str, bytes]:
    """Name -> bytes of every regular file in ``path`` but the writer's lock file."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())
            if p.is_file() and p.name != "book.lock"}


def quarantines(path: Path) -> list[Path]:
    return sorted(path.glob("quarantine-book.log.at-*"))


def payloads(first: int, sizes) -> list[bytes]:
    return [random.Random(first + k).randbytes(n) for k, n in enumerate(sizes)]


GOLDEN_DEEDS = hx("""
    05000000 00000000 0102030402 05000000 00000000
    05000000 00000000 0000000029 05000000 00000000
    06000000 00000000 aabbcc0d3112 06000000 00000000""")
GOLDEN_META = hx("00010000 00000000 00000000 00000000 03000000 11000000 01") + bytes(231)


def golden_log() -> bytes:
    raw = bytearray(8192)
    raw[0:48] = slot(0, 3, 2, 1, 0x5B7083BA, 0xF210DA4E)
    raw[4096:4144] = slot(0, 2, 1, 2, 0xB0FDAE19, 0xFD2C06C7)
    return bytes(raw) + GOLDEN_DEEDS


def make_golden(root: Path) -> Path:
    d = root / "0i0"
    with VereBook.open(d, writable=True, create=True) as b:
        b.save(1, [hx("01020304 02"), hx("00000000 29")])
        b.save(3, [hx("aabbcc0d 3112")])
        b.save_meta("version", struct.pack("<I", 3))
        b.save_meta("who", (0x100).to_bytes(16, "little"))
        b.save_meta("fake", b"\x01")
        b.save_meta("life", struct.pack("<I", 17))
    return d


def make_log(root: Path, batches, name="0i0") -> tuple[Path, list[int]]:
    """A vere log with ``batches`` (lists of payload sizes) saved in order.  Returns its
    directory and the file size after each save (the first entry: the fresh file)."""
    d = root / name
    ends = [8192]
    with VereBook.open(d, writable=True, create=True) as b:
        nxt = b.epoch + 1
        for sizes in batches:
            b.save(nxt, payloads(nxt, sizes))
            nxt += len(sizes)
            ends.append(os.path.getsize(d / "book.log"))
    return d, ends


def all_payloads(d: Path, batches, epoch=0) -> dict[int, bytes]:
    out, nxt = {}, epoch + 1
    for sizes in batches:
        for k, p in enumerate(payloads(nxt, sizes)):
            out[nxt + k] = p
        nxt += len(sizes)
    return out


# --- golden bytes --------------------------------------------------------------------------


def test_golden_vere_example_byte_for_byte(tmp_path):
    d = make_golden(tmp_path)
    raw = (d / "book.log").read_bytes()
    assert len(raw) == 8256
    assert raw == golden_log()
    assert raw[48:4096] == bytes(4048) and raw[4144:8192] == bytes(4048)
    assert (d / "meta.bin").read_bytes() == GOLDEN_META
    # the spec's CRCs are zlib's crc32 of the slot bodies and of the batches
    assert zlib.crc32(raw[:44]) == 0xF210DA4E and zlib.crc32(raw[4096:4140]) == 0xFD2C06C7
    assert zlib.crc32(GOLDEN_DEEDS[:42]) == 0xB0FDAE19
    assert zlib.crc32(GOLDEN_DEEDS[42:]) == 0x5B7083BA


def test_reads_a_golden_log_written_by_someone_else(tmp_path):
    d = tmp_path / "0i0"
    d.mkdir()
    (d / "book.log").write_bytes(golden_log())
    (d / "meta.bin").write_bytes(GOLDEN_META)
    with VereBook.open(d) as b:
        assert isinstance(b, EventLog)
        assert b.format == "vere-book (two-slot layout)"
        assert b.gulf() == (1, 3) and b.count == 3 and b.epoch == 0
        assert [b.read(e) for e in (1, 2, 3)] == [hx("0102030402"), hx("0000000029"),
                                                  hx("aabbcc0d3112")]
        assert b.recovery.clean and b.recovery.slot == "A"
        assert b.log_bytes == 8256
        assert b.meta() == {"who": (0x100).to_bytes(16, "little"), "version": b"\3\0\0\0",
                            "life": b"\x11\0\0\0", "fake": b"\x01"}
    assert files(d) == {"book.log": golden_log(), "meta.bin": GOLDEN_META}


def test_fresh_0i5(tmp_path):
    with VereBook.open(tmp_path / "0i5", writable=True, create=True) as b:
        assert b.gulf() == (0, 0) and b.count == 0 and b.epoch == 5 and b.las_d == 5
        with pytest.raises(ContiguityError, match="next event must be 6"):
            b.save(1, [b"abcd"])
    raw = (tmp_path / "0i5" / "book.log").read_bytes()
    fresh = slot(5, 5, 0, 0, 0, 0x49DD984C)
    assert raw == fresh + bytes(4048) + fresh + bytes(4048)
    assert (tmp_path / "0i5" / "meta.bin").read_bytes() == bytes(256)


def test_epoch_from_parameter_or_directory_name(tmp_path):
    with VereBook.open(tmp_path / "plain", writable=True, create=True, epoch=7) as b:
        assert b.epoch == 7
        b.save(8, [b"abcd"], epoch=7)
        assert b.gulf() == (8, 8)
    with VereBook.open(tmp_path / "other", writable=True, create=True) as b:
        assert b.epoch == 0
    with pytest.raises(ValueError, match="epoch 3"):
        VereBook.open(tmp_path / "0i3", writable=True, create=True, epoch=4)
    with VereBook.open(tmp_path / "0i3", writable=True, create=True, epoch=3) as b:
        assert b.epoch == 3
        with pytest.raises(ContiguityError, match="epoch base"):
            b.save(5, [b"abcd"], epoch=4)


# --- round trip --------------------------------------------------------------------------------


def test_round_trip_reopen_and_continue(tmp_path):
    batches = [[4, 100, 7], [5000], [9, 9, 9, 9], [70000, 12]]
    d, ends = make_log(tmp_path, batches, name="0i41")
    want = all_payloads(d, batches, epoch=41)
    with VereBook.open(d) as b:
        assert b.gulf() == (42, 41 + len(want)) and b.recovery.clean
        assert 41 not in b and 42 in b and 41 + len(want) in b and 42 + len(want) not in b
        for e, p in want.items():
            assert b.read(e) == p
            assert b.payload_size(e) == len(p)
            b.verify_event(e)
            assert b.read_slice(e, 1, 3) == p[1:4]
            assert b.read_slice(e, len(p), 5) == b""
            assert b.mtime_ns(e) > 0
        assert dict(b.walk()) == want
        assert list(b.walk(43, 44)) == [(43, want[43]), (44, want[44])]
        assert b.verify() == []
        assert b.log_bytes == ends[-1]
        with pytest.raises(NoSuchEvent):
            b.read(41)
        with pytest.raises(ReadOnly):
            b.save(b.last + 1, [b"abcd"])
        with pytest.raises(ReadOnly):
            b.save_meta("life", b"\0\0\0\0")
    with VereBook.open(d, writable=True) as b:
        assert b.recovery.clean
        b.save(b.last + 1, [b"wxyz", b"12345"])
        last = b.last
    with VereBook.open(d) as b:
        assert b.last == last and b.read(last) == b"12345"


def test_blob_payloads_are_streamed(tmp_path):
    class Blob:
        def __init__(self, data):
            self.data = data

        def __len__(self):
            return len(self.data)

        def chunks(self):
            for i in range(0, len(self.data), 1000):
                yield self.data[i : i + 1000]

    big = random.Random(1).randbytes(12345)
    with VereBook.open(tmp_path / "0i0", writable=True, create=True) as b:
        b.save(1, [b"abcd", Blob(big), b"efgh"])
    raw = (tmp_path / "0i0" / "book.log").read_bytes()
    assert raw[8192:] == deed(b"abcd") + deed(big) + deed(b"efgh")
    assert struct.unpack_from("<I", raw, 4096 + 40)[0] == zlib.crc32(raw[8192:])
    with VereBook.open(tmp_path / "0i0") as b:
        assert b.read(2) == big and b.recovery.clean


def test_reader_refresh_follows_a_writer(tmp_path):
    d = tmp_path / "0i0"
    with VereBook.open(d, writable=True, create=True) as w, VereBook.open(d) as r:
        assert r.refresh() == 0 and r.count == 0
        w.save(1, [b"abcd", b"efghi"])
        assert r.refresh() == 2 and r.read(2) == b"efghi"
        assert r.refresh() == 0
        # deeds written but not committed by a header are not exposed
        with open(d / "book.log", "ab") as f:
            f.write(deed(b"pending"))
        assert r.refresh() == 0 and r.count == 2
        os.truncate(d / "book.log", w.log_bytes)
        w.save(3, [b"klmn"])
        assert r.refresh() == 1 and r.read(3) == b"klmn"


def test_contiguity_and_payload_refusals_write_nothing(tmp_path):
    d, _ = make_log(tmp_path, [[5, 6]])
    before = files(d)
    with VereBook.open(d, writable=True) as b:
        for first in (1, 2, 4, 100):
            with pytest.raises(ContiguityError, match="next event must be 3"):
                b.save(first, [b"abcd"])
        with pytest.raises(PayloadError):
            b.save(3, [b"abcd", b"abc"])
        b.save(3, [])
    assert files(d) == before


def test_failed_save_leaves_the_log_and_both_slots_exactly_as_before(tmp_path, monkeypatch):
    d, _ = make_log(tmp_path, [[5, 6], [7]])
    before = files(d)
    with VereBook.open(d, writable=True) as b:
        def boom(fd):
            raise OSError(errno.EIO, "injected")
        monkeypatch.setattr(os, "fdatasync", boom)
        with pytest.raises(OSError, match="injected"):
            b.save(4, [b"abcd", b"efgh"])
        monkeypatch.undo()
        assert files(d) == before and b.gulf() == (1, 3)
        b.save(4, [b"abcd"])
    with VereBook.open(d) as b:
        assert b.gulf() == (1, 4) and b.recovery.clean


def test_writer_lock_and_lock_false(tmp_path):
    d = tmp_path / "0i0"
    with VereBook.open(d, writable=True, create=True):
        with pytest.raises(LockHeld):
            VereBook.open(d, writable=True)
        with VereBook.open(d):  # readers take no lock
            pass
    nolock = tmp_path / "0i9"
    with VereBook.open(nolock, writable=True, create=True, lock=False) as b:
        b.save(10, [b"abcd"])
    assert not (nolock / "book.lock").exists()


# --- detection and refusals --------------------------------------------------------------------


def test_is_vere_layout(tmp_path):
    d = make_golden(tmp_path)
    assert is_vere_layout(d / "book.log")
    with Book.open(tmp_path / "uip", writable=True, create=True) as b:
        b.save(1, [b"abcd" * 2000])
    assert not is_vere_layout(tmp_path / "uip" / "book.log")
    assert not is_vere_layout(tmp_path / "missing")
    # one good slot is enough
    raw = bytearray(golden_log())
    raw[0:48] = bytes(48)
    (d / "book.log").write_bytes(raw)
    assert is_vere_layout(d / "book.log")
    with pytest.raises(UnsupportedLayout, match="UIP layout"):
        VereBook.open(tmp_path / "uip")


def test_refusals_name_the_file(tmp_path):
    d = tmp_path / "0i0"
    d.mkdir()
    (d / "meta.bin").write_bytes(bytes(256))
    log = d / "book.log"
    log.write_bytes(b"\0" * 20)
    with pytest.raises(TooShort, match=str(log)):
        VereBook.open(d)
    log.write_bytes(bytes(8192))
    with pytest.raises(BadMagic, match=str(log)):
        VereBook.open(d)
    raw = bytearray(golden_log())
    raw[20] ^= 1
    raw[4096 + 20] ^= 1
    log.write_bytes(raw)
    with pytest.raises(FormatError, match="neither vere header slot is valid"):
        VereBook.open(d, writable=True)
    assert log.read_bytes() == raw


# --- recovery ----------------------------------------------------------------------------------


def test_torn_header_uses_the_other_slot_and_quarantines_the_batch(tmp_path):
    d = make_golden(tmp_path)
    raw = bytearray((d / "book.log").read_bytes())
    raw[30] ^= 0xFF  # slot A (seq 2, the newest) now fails its CRC
    (d / "book.log").write_bytes(raw)
    before = files(d)
    with VereBook.open(d) as b:  # read-only: sees the previous committed state, touches nothing
        assert b.gulf() == (1, 2) and b.recovery.slot == "B"
        assert b.recovery.bad_region == (8192 + 42, 22)
    assert files(d) == before
    with VereBook.open(d, writable=True) as b:
        rep = b.recovery
        assert b.gulf() == (1, 2) and rep.slot == "B" and not rep.clean
        assert rep.bad_slots and rep.bad_slots[0].startswith("slot A")
        assert rep.torn_tail is None and len(rep.quarantined) == 1
        qpath, off, n = rep.quarantined[0]
        assert (off, n) == (8192 + 42, 22)
        assert Path(qpath).read_bytes() == GOLDEN_DEEDS[42:]
        assert b.read(2) == hx("0000000029")
        b.save(3, [hx("aabbcc0d 3112")])  # writes slot A again, seq 2
    assert (d / "book.log").read_bytes() == golden_log()
    with VereBook.open(d) as b:
        assert b.recovery.clean and b.gulf() == (1, 3)


BATCHES = [[5, 9], [4, 13, 6]]  # the last batch: 3 deeds, 71 bytes


@pytest.mark.parametrize("header_written", [True, False])
def test_truncation_at_every_offset_of_the_last_batch(tmp_path, header_written):
    """A cut anywhere inside the last batch yields the previous committed state (the whole
    batch or none of it).  Cut bytes a header claimed, or holding a whole deed, are
    quarantined; only an incomplete first deed nobody committed is cut as a torn tail."""
    orig_dir, ends = make_log(tmp_path, BATCHES, name="orig")
    orig = (orig_dir / "book.log").read_bytes()
    if not header_written:  # as if the crash came before the header write: slot A unchanged
        fresh = VereBook.initial_log_bytes(0)
        orig = orig[:0] + fresh[:48] + orig[48:]
    want = all_payloads(orig_dir, BATCHES)
    end1 = ends[1]
    first_deed_end = end1 + 4 + 16
    for cut in range(end1, len(orig) + 1):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(orig_dir, d)
        (d / "book.log").write_bytes(orig[:cut])
        with VereBook.open(d, writable=True) as b:
            rep = b.recovery
            if cut == len(orig) and header_written:
                assert b.gulf() == (1, 5) and rep.clean
                continue
            assert b.gulf() == (1, 2), cut
            assert dict(b.walk()) == {1: want[1], 2: want[2]}
            qs = quarantines(d)
            if cut == end1:
                assert not qs and rep.torn_tail is None
            elif not header_written and cut < first_deed_end:
                assert rep.torn_tail == (end1, cut - end1) and not qs
            else:
                assert len(qs) == 1 and qs[0].read_bytes() == orig[end1:cut], cut
            b.save(3, [b"next"])
        now = (d / "book.log").read_bytes()
        assert now[8192:] == orig[8192:end1] + deed(b"next")
        with VereBook.open(d) as b:
            assert b.recovery.clean and b.gulf() == (1, 3) and b.read(3) == b"next"
        shutil.rmtree(d)


def test_bit_flip_in_the_last_batch_rolls_back_the_whole_batch(tmp_path):
    orig_dir, ends = make_log(tmp_path, BATCHES, name="orig")
    orig = (orig_dir / "book.log").read_bytes()
    want = all_payloads(orig_dir, BATCHES)
    end1 = ends[1]
    for pos in range(end1, len(orig)):
        for mask in (0x01, 0xFF):
            d = tmp_path / f"flip{pos}-{mask}"
            shutil.copytree(orig_dir, d)
            raw = bytearray(orig)
            raw[pos] ^= mask
            (d / "book.log").write_bytes(raw)
            with VereBook.open(d) as r:  # read-only: same answer, nothing changed
                assert r.gulf() == (1, 2) and r.recovery.bad_region == (end1, len(raw) - end1)
            assert (d / "book.log").read_bytes() == raw and not quarantines(d)
            with VereBook.open(d, writable=True) as b:
                rep = b.recovery
                assert b.gulf() == (1, 2), (pos, mask)
                assert rep.rolled_back == (3, 5) and rep.header_repaired == "A"
                assert [q[1:] for q in rep.quarantined] == [(end1, len(raw) - end1)]
                assert Path(rep.quarantined[0][0]).read_bytes() == raw[end1:]
                assert b.read(1) == want[1] and b.read(2) == want[2]
            now = (d / "book.log").read_bytes()
            assert len(now) == end1 and now[4096:end1] == orig[4096:end1]  # deeds, slot B
            assert now[:48] == struct.pack("<IIQQQQ", MAGIC, 1, 0, 2, 3, 2) + now[40:48]
            with VereBook.open(d, writable=True) as b:
                assert b.recovery.clean and b.gulf() == (1, 2)
                b.save(3, [b"again"])
            with VereBook.open(d) as b:
                assert b.recovery.clean and b.gulf() == (1, 3) and b.read(3) == b"again"
            shutil.rmtree(d)


def test_no_slot_checks_keeps_every_acknowledged_deed_that_frames(tmp_path):
    """Issue 10 item 5: damage in an earlier, acknowledged batch loses only the deeds from
    the first one that does not frame; the newest (unacknowledged) batch is rolled back.
    (Before, every batch a header named was rolled back: events 1..1 kept.)"""
    d, ends = make_log(tmp_path, [[5], [6, 7], [8]])
    raw = bytearray((d / "book.log").read_bytes())
    raw[ends[2] - 3] ^= 1  # event 3's let_d (batch 2, acknowledged by slot A, seq 2)
    raw[ends[3] - 12] ^= 1  # inside batch 3 (named by slot B, seq 3)
    (d / "book.log").write_bytes(raw)
    with VereBook.open(d, writable=True) as b:
        assert b.gulf() == (1, 2) and b.recovery.slot is None
        assert b.recovery.rolled_back == (3, 4)
        assert Path(b.recovery.quarantined[0][0]).read_bytes() == raw[ends[1] + 6 + 16:]
    with VereBook.open(d) as b:
        assert b.recovery.clean and b.gulf() == (1, 2)


def test_reads_check_framing_and_the_newest_batch_crc(tmp_path):
    d, ends = make_log(tmp_path, BATCHES)
    with VereBook.open(d) as b:
        log = d / "book.log"
        with open(log, "r+b") as f:
            f.seek(ends[1] + 8 + 2)  # a payload byte of event 3 (newest batch)
            f.write(b"\xee")
            f.seek(8192 + 8 + 5)  # event 1's let_d
            f.write(b"\x07")
        with pytest.raises(CorruptDeed, match="framing") as ei:
            b.read(1)
        assert ei.value.event == 1 and ei.value.offset == 8192
        with pytest.raises(CorruptDeed):
            b.verify_event(1)
        for e in (3, 4, 5):
            with pytest.raises(CorruptDeed, match="batch CRC"):
                b.read(e)
            with pytest.raises(CorruptDeed):
                b.verify_event(e)
        assert b.read(2) == all_payloads(d, BATCHES)[2]
        assert {e for e, _ in b.verify()} == {1, 3, 4, 5}


def test_read_only_open_never_modifies_damaged_logs(tmp_path):
    d, ends = make_log(tmp_path, BATCHES)
    orig = (d / "book.log").read_bytes()
    damages = {
        "torn header": lambda r: r.__setitem__(slice(0, 48), bytes(48)),
        "cut": lambda r: r.__delitem__(slice(len(r) - 10, None)),
        "flip": lambda r: r.__setitem__(ends[1] + 3, r[ends[1] + 3] ^ 0x10),
        "junk": lambda r: r.extend(b"\xff" * 100),
    }
    for name, damage in damages.items():
        raw = bytearray(orig)
        damage(raw)
        (d / "book.log").write_bytes(raw)
        before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in d.iterdir()}
        with VereBook.open(d) as b:
            assert b.gulf() in ((1, 2), (1, 5)), name
            assert not b.recovery.clean
            dict(b.walk())
        after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in d.iterdir()}
        assert after == before, name
