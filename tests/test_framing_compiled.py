"""The framing scan's compiled walk of a chunk (``formats/_framing.pyx``) finds what the
pure walk (``formats/framing.py``, the reference) finds: the same offsets and the same
stop, over both layouts, sound logs and damaged ones (a ``len_d`` or ``let_d`` changed,
bytes overwritten, a torn tail), chunks so small that a deed's ``let_d`` lies past the
chunk, and a bound on the deeds wanted."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats import framing
from bookfs.formats.deeds import UIP, VERE
from bookfs.formats.index import OffsetIndex
from bookfs.formats.layout import HEADER_SIZE

pytestmark = pytest.mark.skipif(framing.FRAMING != "compiled",
                                reason="the compiled framing walk did not build")

LAYOUTS = {"uip": UIP, "vere": VERE}


def _scan(monkeypatch, path: str, deeds, chunk: int, limit, compiled: bool,
          room: int = framing._OUT_ROOM, lent: bool = False):
    """``(end, offsets)`` of a framing scan of the log at ``path``: read ``chunk`` bytes at
    a time, the compiled walk handing back at most ``room`` offsets a call, with the
    thread's lent buffers (``lent``) or buffers of its own."""
    with monkeypatch.context() as m:
        m.setattr(framing, "_CHUNK", chunk)
        m.setattr(framing, "_OUT_ROOM", room)
        m.setattr(framing, "_SMALL_SCAN", 0 if lent else 1 << 62)
        if not compiled:
            m.setattr(framing, "_compiled", None)
        fd = os.open(path, os.O_RDONLY)
        try:
            index = OffsetIndex(first=1, end=HEADER_SIZE)
            end = deeds.scan(fd, index, os.fstat(fd).st_size, limit=limit)
            return end, list(index.offsets)
        finally:
            os.close(fd)


damage = st.one_of(
    st.none(),
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("bytes"), st.floats(0, 1), st.binary(min_size=1, max_size=9)),
    st.tuples(st.just("len"), st.floats(0, 1), st.integers(0, (1 << 64) - 1)),
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(sorted(LAYOUTS)),
       payloads=st.lists(st.binary(min_size=0, max_size=300), max_size=40),
       hurt=damage, chunk=st.sampled_from([24, 40, 64, 333, 4096, 4 << 20]),
       limit=st.one_of(st.none(), st.integers(0, 45)),
       room=st.sampled_from([1, 2, 3, 7, framing._OUT_ROOM]), lent=st.booleans())
def test_the_compiled_walk_finds_what_the_pure_walk_finds(monkeypatch, layout, payloads,
                                                          hurt, chunk, limit, room, lent):
    """Also whatever the room for the offsets a call of the compiled walk hands back
    (a full one resumes where it stopped), and with the thread's lent buffers or new
    ones."""
    deeds = LAYOUTS[layout]
    payloads = [p.ljust(deeds.min_len, b"\1") for p in payloads]
    data = bytearray(b"\0" * HEADER_SIZE + b"".join(deeds.encode(p) for p in payloads))
    if hurt is not None:
        at = HEADER_SIZE + int(hurt[1] * (len(data) - HEADER_SIZE))
        if hurt[0] == "cut":
            del data[at:]
        elif hurt[0] == "bytes":
            data[at:at + len(hurt[2])] = hurt[2]
        else:  # a u64 (a len_d, a let_d or payload bytes) set to any value
            data[at:at + 8] = hurt[2].to_bytes(8, "little")
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        pure = _scan(monkeypatch, f.name, deeds, chunk, limit, compiled=False)
        assert _scan(monkeypatch, f.name, deeds, chunk, limit, compiled=True, room=room,
                     lent=lent) == pure
    if hurt is None:  # a sound log: every deed found (up to the bound)
        want = len(payloads) if limit is None else min(limit, len(payloads))
        assert len(pure[1]) == want


def test_a_thread_reuses_one_read_buffer_for_its_large_scans(tmp_path, monkeypatch):
    """A log's first scan reads into its thread's buffer, made once, and not into a new
    ``bytearray`` (zeroed before the read overwrites it) per scan: what a fleet's first
    ``find``, a thousand first scans, paid a thousand times.  That buffer fits in a
    core's L2 cache (256 KiB; it was 4 MiB, and a builder's scan of an 8 MB log took a
    third longer).  A scan made while the buffer is lent (one inside another, here from
    the progress callback) reads into its own and finds the same deeds."""
    path = tmp_path / "book.log"
    payloads = [bytes([k % 251]) * 3000 for k in range(600)]  # 1.8 MB of deeds
    path.write_bytes(b"\0" * HEADER_SIZE + b"".join(UIP.encode(p) for p in payloads))
    fd = os.open(path, os.O_RDONLY)
    made = []
    real = bytearray

    def counting(*a):
        b = real(*a)
        made.append(len(b))
        return b

    monkeypatch.setattr(framing, "bytearray", counting, raising=False)
    monkeypatch.setattr(framing._scan_local, "pair", None, raising=False)  # a fresh thread's
    try:
        size = os.fstat(fd).st_size
        inner = []

        def scan(progress=None) -> list[int]:
            index = OffsetIndex(first=1, end=HEADER_SIZE)
            UIP.scan(fd, index, size, progress=progress)
            return list(index.offsets)

        first = scan()
        for _ in range(5):
            assert scan() == first
        assert len(first) == 600
        assert made == [framing._CHUNK] and framing._CHUNK <= 256 << 10  # made once
        made.clear()
        outer = scan(progress=lambda n: inner.append(scan()) if not inner else None)
        assert outer == first and inner == [first]
        assert made == [framing._CHUNK]  # the inner scan's own: the thread's was lent
    finally:
        os.close(fd)
