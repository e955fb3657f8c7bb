"""The CRC-32 bookfs uses, checked against an independent oracle (crcmod).

The UIP says "the standard CRC32 algorithm (as provided by zlib)": polynomial 0x04C11DB7,
bit-reflected, register preset to 0xFFFFFFFF, result XORed with 0xFFFFFFFF.  crcmod wants
the polynomial with its x^32 term (0x104C11DB7), ``rev=True`` for the reflection, and its
``initCrc`` is the *externally visible* starting CRC, i.e. the preset already XORed with
``xorOut``: 0xFFFFFFFF ^ 0xFFFFFFFF = 0.  So zlib's crc32 is
``mkCrcFun(0x104C11DB7, initCrc=0, rev=True, xorOut=0xFFFFFFFF)`` (crcmod's "crc-32"), and
its second argument chains exactly like zlib's ``value``.
"""

from __future__ import annotations

import struct
import zlib

import crcmod
import crcmod.predefined
from hypothesis import given, settings
from hypothesis import strategies as st

from bookfs.formats import layout
from bookfs.formats.book import Book

ORACLE = crcmod.mkCrcFun(0x104C11DB7, initCrc=0, rev=True, xorOut=0xFFFFFFFF)


def test_oracle_is_the_standard_crc32():
    assert ORACLE(b"123456789") == 0xCBF43926  # the catalogue check value of CRC-32
    assert ORACLE(b"") == 0
    assert ORACLE(b"123456789") == crcmod.predefined.mkCrcFun("crc-32")(b"123456789")
    for data in (b"", b"a", b"\x00" * 17, bytes(range(256)) * 3):
        assert ORACLE(data) == zlib.crc32(data)


def test_layout_crc32_matches_oracle_on_fixed_inputs():
    samples = [b"", b"\x00", b"\xff", b"123456789", bytes(range(256)), b"\x00" * 4096,
               b"\xff" * 100_001]
    for data in samples:
        assert layout.crc32(data) == ORACLE(data)
        for cut in (0, len(data) // 3, len(data)):
            # chaining (the value argument) behaves like zlib's and crcmod's
            assert layout.crc32(data[cut:], layout.crc32(data[:cut])) == ORACLE(data)
            assert ORACLE(data[cut:], ORACLE(data[:cut])) == ORACLE(data)


def test_golden_crcs_of_reference_formats():
    """reference-formats.md §1: the two golden deeds' CRCs."""
    for payload, want in ((bytes.fromhex("0102030402"), 0x0D160EDB),
                          (bytes.fromhex("aabbcc0d3112"), 0xF74E8DEB)):
        covered = struct.pack("<Q", len(payload)) + payload
        assert ORACLE(covered) == want
        assert layout.crc32(covered) == want


def _deeds(raw: bytes):
    """Independent parser: yield (offset, len_d, covered bytes, stored crc, let_d)."""
    off = 16
    while off < len(raw):
        (n,) = struct.unpack_from("<Q", raw, off)
        covered = raw[off : off + 8 + n]
        crc, let = struct.unpack_from("<IQ", raw, off + 8 + n)
        yield off, n, covered, crc, let
        off += n + 20
    assert off == len(raw)


def test_every_deed_crc_in_a_log_matches_oracle(make_book, payload):
    sizes = [4, 5, 6, 7, 8, 9, 63, 64, 65, 1000, 4096, 70_000]
    path = make_book(sizes[:5], sizes[5:9], sizes[9:])
    raw = (path / "book.log").read_bytes()
    deeds = list(_deeds(raw))
    assert len(deeds) == len(sizes)
    for k, (off, n, covered, crc, let) in enumerate(deeds):
        assert n == sizes[k] == let
        assert covered[8:] == payload(k + 1, sizes[k])
        assert crc == ORACLE(covered), f"deed {k + 1} at {off}"
    with Book.open(path) as book:
        assert book.verify() == []


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=3000), st.integers(0, 2**32 - 1))
def test_layout_crc32_matches_oracle_random(data, start):
    assert layout.crc32(data) == ORACLE(data)
    assert layout.crc32(data, start) == ORACLE(data, start)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=4, max_size=2000))
def test_encode_deed_crc_matches_oracle_random(payload):
    deed = layout.encode_deed(payload)
    n = len(payload)
    assert len(deed) == n + 20 == layout.deed_size(n)
    assert deed[:8] == struct.pack("<Q", n)
    assert deed[8 : 8 + n] == payload
    crc, let = struct.unpack_from("<IQ", deed, 8 + n)
    assert let == n
    assert crc == ORACLE(deed[: 8 + n])
    head, tail = layout.deed_parts(payload)
    assert head + payload + tail == deed
