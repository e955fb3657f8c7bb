"""The one deed walk per layout (``bookfs/formats/deeds.py``): every walk of both layouts
agrees with the bytes ``layout.py`` describes, sound deeds pass every check, and a damaged
byte anywhere in a deed fails the checks that cover it, with where and why.

Checked against the layouts' own definitions, not against the walk: ``encode_deed`` for the
UIP layout, and vere's ``u64 len_d | payload | u64 let_d`` spelled out here."""

from __future__ import annotations

import os
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats.deeds import UIP, VERE, BadDeed
from bookfs.formats.index import OffsetIndex
from bookfs.formats.layout import encode_deed

FAST = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
LAYOUTS = [UIP, VERE]
payloads = st.lists(st.binary(min_size=4, max_size=300), min_size=1, max_size=12)


def _vere_deed(p: bytes) -> bytes:
    n = struct.pack("<Q", len(p))
    return n + p + n


def _reference(deeds, p: bytes) -> bytes:
    return encode_deed(p) if deeds is UIP else _vere_deed(p)


class _Blob:
    """A payload that is streamed, as a staged ``new/`` file is (``book.Blob``)."""

    def __init__(self, data: bytes, step: int = 7) -> None:
        self.data, self.step = data, step

    def __len__(self) -> int:
        return len(self.data)

    def chunks(self):
        for i in range(0, len(self.data), self.step):
            yield self.data[i : i + self.step]


def _file(tmp_path, data: bytes) -> int:
    path = tmp_path / "deeds"
    path.write_bytes(data)
    return os.open(path, os.O_RDWR)


@pytest.mark.parametrize("deeds", LAYOUTS, ids=lambda d: d.name)
@FAST
@given(ps=payloads)
def test_encode_and_every_walk_agree_with_the_layout(deeds, ps, tmp_path) -> None:
    raw = b"".join(_reference(deeds, p) for p in ps)
    assert b"".join(deeds.encode(p) for p in ps) == raw
    assert [(e, bytes(p)) for e, _, p in deeds.walk(memoryview(raw), 5)] == [
        (5 + i, p) for i, p in enumerate(ps)]
    fd = _file(tmp_path, raw)
    try:
        off = 0
        for p in ps:
            assert deeds.read(fd, off, len(p)) == p
            deeds.verify(fd, off, len(p))
            assert deeds.sound(fd, off, len(p))
            assert deeds.length_at(fd, off) == len(p)
            assert deeds.spans(fd, off, off + deeds.size(len(p))) is None
            assert deeds.payload_size(off, off + deeds.size(len(p))) == len(p)
            assert deeds.payload_at(fd, off, 3, 1) == p[1:4]
            off += deeds.size(len(p))
        assert deeds.tail_before(fd, off) == raw[-deeds.tail:]
        assert deeds.skip(fd, 0, len(ps), len(raw)) == len(raw)
        ix = OffsetIndex(first=1, end=0)
        assert deeds.scan(fd, ix, len(raw)) == len(raw)
        assert list(ix.offsets) == [sum(deeds.size(len(p)) for p in ps[:i])
                                    for i in range(len(ps))]
    finally:
        os.close(fd)


@pytest.mark.parametrize("deeds", LAYOUTS, ids=lambda d: d.name)
@FAST
@given(ps=payloads, blobs=st.lists(st.booleans(), min_size=12, max_size=12),
       start=st.integers(0, 64))
def test_write_is_the_layouts_bytes_streamed_or_not(deeds, ps, blobs, start,
                                                    tmp_path) -> None:
    """``write`` lays down exactly the reference bytes, whether a payload is in memory or
    streamed, and vere's returned sum is the crc32 of every byte written."""
    fd = _file(tmp_path, b"\xee" * start)
    try:
        given_ = [_Blob(p) if b else p for p, b in zip(ps, blobs)]
        total = deeds.write(fd, given_, start)
        want = b"".join(_reference(deeds, p) for p in ps)
        assert os.pread(fd, len(want) + 1, start) == want
        assert total == (None if deeds is UIP else zlib.crc32(want))
    finally:
        os.close(fd)


class _Liar(_Blob):
    def __len__(self) -> int:
        return len(self.data) + 1  # announces a byte it never yields


@pytest.mark.parametrize("deeds", LAYOUTS, ids=lambda d: d.name)
def test_a_blob_that_changes_size_is_refused(deeds, tmp_path) -> None:
    fd = _file(tmp_path, b"")
    try:
        with pytest.raises(OSError, match="changed size"):
            deeds.write(fd, [b"abcd", _Liar(b"efghijk")], 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize("deeds", LAYOUTS, ids=lambda d: d.name)
@FAST
@given(ps=payloads, data=st.data())
def test_a_flipped_byte_fails_the_check_that_covers_it(deeds, ps, data, tmp_path) -> None:
    """A byte flipped in a deed's ``len_d``, ``let_d`` or (UIP) payload or CRC: the walk of
    the bytes and the file reads refuse that deed, saying where and which check; vere has
    no CRC, so a payload byte it cannot see is served (its batch CRC, in the header slot,
    is ``vere.py``'s)."""
    raw = bytearray(b"".join(_reference(deeds, p) for p in ps))
    k = data.draw(st.integers(0, len(ps) - 1))
    off = sum(deeds.size(len(p)) for p in ps[:k])
    n = len(ps[k])
    where = data.draw(st.sampled_from(["len", "payload", "let"] + (["crc"] if deeds.crc
                                                                    else [])))
    at = {"len": off, "payload": off + 8 + data.draw(st.integers(0, n - 1)),
          "crc": off + 8 + n, "let": off + deeds.size(n) - 8}[where]
    raw[at] ^= 1 << data.draw(st.integers(0, 7))
    fd = _file(tmp_path, bytes(raw))
    try:
        if where == "payload" and not deeds.crc:
            assert deeds.read(fd, off, n) == bytes(raw[off + 8 : off + 8 + n])
            return
        with pytest.raises(BadDeed) as e:
            deeds.read(fd, off, n)
        assert e.value.pos == off
        assert e.value.what == ("CRC" if where in ("payload", "crc") else "framing")
        assert not deeds.sound(fd, off, n)
        with pytest.raises(BadDeed):
            deeds.verify(fd, off, n)
        if where != "len":  # a damaged len_d may still frame, differently: see below
            with pytest.raises(BadDeed) as w:
                list(deeds.walk(memoryview(bytes(raw)), 1))
            assert (w.value.event, w.value.pos) == (1 + k, off)
            assert str(w.value).startswith(f"event {1 + k} at byte {off} fails its ")
        else:
            with pytest.raises(BadDeed):
                list(deeds.walk(memoryview(bytes(raw)), 1))
    finally:
        os.close(fd)


@pytest.mark.parametrize("deeds", LAYOUTS, ids=lambda d: d.name)
def test_truncated_bytes_are_refused_by_name(deeds, tmp_path) -> None:
    raw = deeds.encode(b"mug!jam") + deeds.encode(b"mug?jam")
    with pytest.raises(BadDeed, match="event 2 at byte .* framing check: a truncated deed"):
        list(deeds.walk(memoryview(raw[: len(raw) - deeds.size(7) + 3]), 1))
    with pytest.raises(BadDeed, match="event 2 .* claims 7 bytes, past the end"):
        list(deeds.walk(memoryview(raw[:-1]), 1))
    fd = _file(tmp_path, raw[:-1])
    try:
        with pytest.raises(BadDeed, match="runs past the end of the file"):
            deeds.read(fd, deeds.size(7), 7)
        with pytest.raises(BadDeed, match="past the end"):
            deeds.skip(fd, 0, 2, len(raw) - 1)
    finally:
        os.close(fd)


def test_the_sizes_are_layout_pys() -> None:
    from bookfs.formats.layout import (DEED_OVERHEAD, DEED_TAIL_SIZE, MIN_PAYLOAD,
                                       VERE_DEED_OVERHEAD, VERE_MIN_LEN)

    assert (UIP.overhead, UIP.tail, UIP.min_len, UIP.crc) == (
        DEED_OVERHEAD, DEED_TAIL_SIZE, MIN_PAYLOAD, True)
    assert (VERE.overhead, VERE.tail, VERE.min_len, VERE.crc) == (
        VERE_DEED_OVERHEAD, 8, VERE_MIN_LEN, False)
