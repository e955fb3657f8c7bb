"""The compiled noun core (bookfs/noun/_core.pyx) against the pure reference (issue 21).

Hypothesis holds the two equal: jam byte for byte, cue of jams and of arbitrary bytes (the
same noun, or CueError from both), mug for mug, and the validating scanner's verdict,
failure offset and mug on valid, truncated, bit-flipped and padded jams, whole and fed in
chunks: over 10,000 cases in all.  Then the scanner's memory (a 50 MB jam is scanned in
far less memory than its noun), and the fallback to the pure core when the compiled one
is missing.
"""

from __future__ import annotations

import random
import os
import sys
import tracemalloc

import pytest
from compiled_fallback import check_fallback, info_both_ways
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bookfs.noun as noun_pkg
from bookfs.noun import codec as P
from bookfs.noun import scanner as S
from bookfs.noun.codec import CueError, Noun, cell, cord, from_list, noun_equal

C = pytest.importorskip("bookfs.noun._core", reason="the compiled noun core did not build")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                       HealthCheck.data_too_large])

# Nouns: atoms of every width around the 64-bit boundaries and far past them, cells, and
# shared subnouns (so that jam writes back-references to cells and to wide atoms).
atoms = st.one_of(
    st.integers(0, 16),
    st.integers(0, 2**64 + 2),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**128 - 1, 2**128]),
    st.integers(0, 2**2000),
    st.sampled_from([cord("fast"), cord("full"), 0x8000000CCE9E0D80 << 64]),
)
trees = st.recursive(atoms, lambda kids: st.tuples(kids, kids), max_leaves=30)
shared = st.builds(lambda a, b: cell(a, b, a, (b, a), b), trees, trees)
nouns = st.one_of(trees, shared)


def _outcome(f, data):
    try:
        return f(data)
    except CueError:
        return CueError


def _same_noun(a, b) -> bool:
    if a is CueError or b is CueError:
        return a is b
    return noun_equal(a, b)


def _scans_agree(data: bytes) -> None:
    """Every variant of the scan: compiled and pure give the same ScanResult, and
    ``scan_ok`` (its kept scanner reused from the call before, whatever that scanned) the
    same verdict."""
    for mug in (False, True):
        for exact in (True, False):
            got, want = C.scan(data, mug=mug, exact=exact), S.scan(data, mug=mug, exact=exact)
            assert got == want, (data.hex(), mug, exact, got, want)
    assert C.scan_ok(data) is S.scan_ok(data) is S.scan(data).ok, data.hex()


def test_compiled_core_in_use() -> None:
    """Where the extension built (setup.sh builds it), bookfs.noun uses it."""
    if os.environ.get("BOOKFS_PURE_NOUNS"):
        pytest.skip("BOOKFS_PURE_NOUNS is set")
    assert noun_pkg.CORE == "compiled", noun_pkg.CORE_REASON
    assert noun_pkg.cue is C.cue and noun_pkg.scan is C.scan and noun_pkg.jam is C.jam
    assert noun_pkg.core_description().startswith("compiled")


# --------------------------------------------------------------------------- properties


@settings(FAST, max_examples=1200)
@given(nouns)
def test_jam_cue_mug_agree(noun: Noun) -> None:
    data = P.jam(noun)
    assert C.jam(noun) == data
    assert C.cue(data) == noun
    assert C.mug(noun) == P.mug(noun)
    got = C.scan(data, mug=True)
    assert got == S.scan(data, mug=True)
    assert got.ok and got.bits is not None and (got.bits + 7) // 8 == len(data)
    assert got.mug == P.mug(noun)


@settings(FAST, max_examples=1500)
@given(st.binary(max_size=24))
def test_random_bytes_agree(data: bytes) -> None:
    """Arbitrary input: the same noun or CueError from both cues, and scan(exact=False)
    accepts exactly what cue accepts."""
    pure = _outcome(P.cue, data)
    assert _same_noun(_outcome(C.cue, data), pure)
    _scans_agree(data)
    lax = C.scan(data, exact=False)
    assert lax.ok == (pure is not CueError)
    if lax.ok:
        exact = (lax.bits + 7) // 8 == len(data) and not (
            lax.bits & 7 and data[-1] >> (lax.bits & 7))
        assert C.scan(data).ok == exact


@st.composite
def corrupted(draw) -> bytes:
    """A jam damaged one way: cut short, a bit flipped, bytes or bits after its end."""
    data = bytearray(P.jam(draw(nouns)))
    how = draw(st.sampled_from(["cut", "flip", "flips", "append", "pad-bits", "zero-byte"]))
    if how == "cut":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif how == "flip":
        bit = draw(st.integers(0, len(data) * 8 - 1))
        data[bit >> 3] ^= 1 << (bit & 7)
    elif how == "flips":
        for _ in range(draw(st.integers(2, 5))):
            bit = draw(st.integers(0, len(data) * 8 - 1))
            data[bit >> 3] ^= 1 << (bit & 7)
    elif how == "append":
        data += draw(st.binary(min_size=1, max_size=8))
    elif how == "pad-bits":
        data[-1] |= 0x80  # a bit after the end, when the jam does not fill its last byte
    else:
        data.append(0)
    return bytes(data)


@settings(FAST, max_examples=1200)
@given(corrupted())
def test_corrupted_jams_agree(data: bytes) -> None:
    assert _same_noun(_outcome(C.cue, data), _outcome(P.cue, data))
    _scans_agree(data)


@settings(FAST, max_examples=1000)
@given(st.one_of(nouns.map(P.jam), corrupted(), st.binary(max_size=16)), st.data())
def test_scanning_in_chunks_agrees(data: bytes, draw: st.DataObject) -> None:
    """The verdict does not depend on how the input is split; nor on which core."""
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=6)))
    pieces = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
    for mug in (False, True):
        want = S.scan(data, mug=mug)
        for make in (C.Scanner, S.Scanner):
            scanner = make(mug=mug)
            for piece in pieces:
                scanner.feed(piece)
            assert scanner.finish() == want, (data.hex(), cuts, mug, make)


# --------------------------------------------------------------------------- cases


@pytest.mark.parametrize("noun", [
    0, 1, 2**64 - 1, 2**64, cell(1, 2, 3), ((1, 2), 3), cord("fast"),
    cell(cord("fast"), cord("full"), cord("fast")), 2**256,
])
def test_vectors(noun: Noun) -> None:
    data = P.jam(noun)
    assert C.jam(noun) == data and C.cue(data) == noun and C.mug(noun) == P.mug(noun)


def test_deep_and_shared_nouns() -> None:
    items = list(range(100_000))
    deep = from_list(items)
    data = P.jam(deep)
    assert C.jam(deep) == data
    assert P.to_list(C.cue(data)) == items
    assert C.mug(deep) == P.mug(deep) == C.scan(data, mug=True).mug
    left: Noun = 0
    for i in range(50_000):
        left = (left, i)
    data = P.jam(left)
    assert C.jam(left) == data and noun_equal(C.cue(data), left)
    assert C.scan(data, mug=True) == S.scan(data, mug=True)
    wide: Noun = 7
    for _ in range(300):  # 2^300 leaves, 300 distinct cells
        wide = (wide, wide)
    data = P.jam(wide)
    assert C.jam(wide) == data and C.mug(C.cue(data)) == P.mug(wide)
    assert C.scan(data, mug=True).mug == P.mug(wide)


def test_big_atoms() -> None:
    atom = int.from_bytes(os.urandom(1_000_003), "little") | 1 << 8_000_023
    for noun in (atom, (5, atom), ((1, 2), (atom, atom))):
        data = P.jam(noun)
        assert C.jam(noun) == data and C.cue(data) == noun
        assert C.mug(noun) == P.mug(noun) == C.scan(data, mug=True).mug


def test_big_atoms_at_every_bit_offset() -> None:
    """The compiled cue builds a wide atom's 30-bit digits four at a time, with one copy of
    the loop for each bit offset (0-7) of the atom's first bit in its byte (and, from 8
    groups on, with AVX2 where the CPU has it), then a tail; atoms of two words take a
    path of their own: every offset, and widths around the 4-digit (120-bit) groups, the
    two-word and AVX2 thresholds and the input's end."""
    rng = random.Random(21)
    offsets = set()
    for width in (65, 90, 119, 120, 121, 127, 128, 129, 150, 239, 240, 241, 361, 959, 960,
                  961, 990, 1000, 1081, 4001):
        for pad in range(16):  # the head atom moves the wide atom's start bit by bit
            atom = rng.getrandbits(width) | 1 << (width - 1)
            noun = ((1 << pad) - 1 if pad else 0, atom)
            data = P.jam(noun)
            assert C.cue(data) == noun, (width, pad)
            assert C.cue(data + b"\xff" * 9) == noun  # bytes after the noun change nothing
            scan = S.scan(P.jam(noun[0]))
            offsets.add((3 + scan.bits + 2 * width.bit_length()) % 8)
    assert offsets == set(range(8))  # the atom's value started at every offset in a byte


def _bits_to_bytes(bits: str) -> bytes:
    """A bit string written first bit first (as jam's stream is read)."""
    return int(bits[::-1], 2).to_bytes((len(bits) + 7) // 8, "little")


def _mat(value: int, width: int) -> str:
    """``value`` as a mat ``width`` bits wide (more than it needs: leading zeros)."""
    if width == 0:
        return "1"
    c = width.bit_length()
    low = format(width, "b")[::-1][:c - 1]  # b's low c - 1 bits, first bit first
    return "0" * c + "1" + low + format(value, f"0{width}b")[::-1]


def test_non_canonical_encodings() -> None:
    """cue accepts a mat whose value has leading zeros (wider than needed): so do both
    cores and both scanners, and the mug is the value's, not the width's."""
    data = _bits_to_bytes("0" + _mat(1, 3))  # the atom 1 written 3 bits wide
    assert P.cue(data) == C.cue(data) == 1
    _scans_agree(data)
    assert C.scan(data, mug=True).mug == P.mug(1)
    wide = _bits_to_bytes("0" + _mat(2**70 + 5, 200))
    assert P.cue(wide) == C.cue(wide) == 2**70 + 5
    for value, width in ((7, 100), (2**64 - 1, 128), (2**64, 65), (2**100 + 3, 128)):
        data = _bits_to_bytes("0" + _mat(value, width))  # wide mats of two words at most
        assert P.cue(data) == C.cue(data) == value, (value, width)
    assert C.scan(wide, mug=True).mug == S.scan(wide, mug=True).mug == P.mug(2**70 + 5)
    # [5 <back-reference to bit 2 written 80 bits wide>]; with a one at bit 70: bad
    for ref, ok in ((2, True), (2 + (1 << 70), False)):
        data = _bits_to_bytes("10" + "0" + _mat(5, 3) + "11" + _mat(ref, 80))
        assert (_outcome(P.cue, data) is not CueError) == ok
        assert _same_noun(_outcome(C.cue, data), _outcome(P.cue, data))
        _scans_agree(data)
        assert C.scan(data).ok == ok


def test_scan_reasons_and_offsets() -> None:
    data = P.jam(cell(1, 2, 3))
    assert C.scan(data).ok and C.scan(data).reason is None
    r = C.scan(data[:-1])
    assert (r.ok, r.reason) == (False, "truncated")
    r = C.scan(data + b"\x00")
    assert (r.reason, r.bit, r.byte) == ("trailing", r.bits, r.bits // 8)
    r = C.scan(b"\x07")  # a reference to bit 0, where nothing is complete
    assert (r.reason, r.bit) == ("bad-reference", 0)
    r = C.scan(bytes(9))  # atom tag then 71 zero bits: a length of 2^63 bits or more
    assert (r.reason, r.bit) == ("too-large", 0)
    r = C.scan(b"")
    assert (r.reason, r.bit) == ("empty", 0)
    assert all(res.reason in S.REASONS for res in (r,))
    scanner = C.Scanner()
    scanner.feed(b"\x07")
    assert scanner.result is not None and scanner.result.reason == "bad-reference"
    assert scanner.feed(b"\x00") is False


def test_jam_and_mug_reject_what_the_reference_rejects() -> None:
    for bad in (-1, "a", [1, 2], (1, 2, 3), (1, (2, None)), 1.5):
        for f in (P.jam, C.jam):
            with pytest.raises((TypeError, ValueError)):
                f(bad)  # type: ignore[arg-type]
    for bad in (-1, "a"):
        for f in (P.mug, C.mug):
            with pytest.raises((TypeError, ValueError)):
                f(bad)  # type: ignore[arg-type]


def test_inputs_of_every_buffer_kind() -> None:
    data = P.jam(cell(cord("fast"), 2**100, cord("full")))
    for form in (data, bytearray(data), memoryview(data), memoryview(b"xx" + data)[2:]):
        assert C.cue(form) == P.cue(data)
        assert C.scan(form, mug=True) == S.scan(data, mug=True)


@settings(FAST, max_examples=300)
@given(st.lists(st.one_of(nouns.map(P.jam), corrupted(), st.binary(max_size=16),
                          st.integers(1, 9000).map(lambda n: long_list_jam(n)),
                          st.integers(1, 9000).map(lambda n: long_list_jam(n)[:-1])),
                max_size=12))
def test_scan_ok_in_any_order(jams: list[bytes]) -> None:
    """``scan_ok`` keeps one scanner's arrays from call to call: any sequence of jams,
    small and over 64 KiB (scanned without the GIL), good and bad, gets each its own
    verdict, whatever came before."""
    assert [C.scan_ok(j) for j in jams] == [S.scan(j).ok for j in jams]


def test_scan_ok_after_a_jam_too_large_to_keep_arrays_for() -> None:
    """A jam of 600,000 nodes grows the kept scanner's arrays past what is kept (1 MiB):
    they are let go, and the next scans are right."""
    big = long_list_jam(300000)
    for data in (big, big[:-1], P.jam((1, 2)), big, b"\x01", P.jam(7)):
        assert C.scan_ok(data) is S.scan(data).ok


def test_scan_ok_from_threads_at_once() -> None:
    """Threads scanning at once: while one holds the kept scanner (a jam over 64 KiB is
    scanned without the GIL), the others scan with their own."""
    from concurrent.futures import ThreadPoolExecutor

    jams = [long_list_jam(20000 + i) for i in range(8)]
    jams += [j[:-1] for j in jams]  # cut short: refused
    want = [S.scan(j).ok for j in jams]
    assert want.count(True) == 8
    with ThreadPoolExecutor(4) as pool:
        for _ in range(20):
            assert list(pool.map(C.scan_ok, jams)) == want


# --------------------------------------------------------------------------- memory


def long_list_jam(n: int) -> bytes:
    """The jam of a list of ``n`` distinct 49-bit atoms, made without building it: each
    element is exactly 64 bits (cell tag 2, atom tag 1, mat prefix 12, value 49)."""
    import numpy as np

    values = (np.uint64(1) << np.uint64(48)) | np.arange(n, dtype=np.uint64)
    words = (np.uint64(1) | np.uint64(1 << 9) | np.uint64(17 << 10)
             | (values << np.uint64(15)))
    return words.astype("<u8").tobytes() + b"\x02"  # then ~, the list's end


def test_long_list_jam_is_a_jam() -> None:
    assert long_list_jam(5) == P.jam(from_list([(1 << 48) | i for i in range(5)]))


def test_scanner_memory_does_not_hold_the_noun() -> None:
    """A 50 MB jam of a 6.25M-element list (its noun: 6.25M tuples and ints, over 500 MB
    in Python) is scanned whole, and in chunks, in a small fraction of that."""
    n = 50_000_000 // 8
    data = long_list_jam(n)
    noun_bytes = n * (sys.getsizeof((1, 2)) + sys.getsizeof(1 << 48))
    for how in ("whole", "chunks"):
        tracemalloc.start()
        try:
            if how == "whole":
                result = C.scan(data)
            else:
                scanner = C.Scanner()
                view = memoryview(data)
                for at in range(0, len(data), 1 << 20):
                    scanner.feed(view[at:at + (1 << 20)])
                result = scanner.finish()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert result.ok and result.bits == len(data) * 8 - 6, result
        assert peak < noun_bytes / 8, (how, peak, noun_bytes)


def test_streaming_skips_a_large_atom_without_holding_it() -> None:
    atom = 1 << 8 * 20_000_000  # a 20 MB atom
    data = P.jam((3, atom))
    scanner = C.Scanner()
    tracemalloc.start()
    try:
        view = memoryview(data)
        for at in range(0, len(data), 1 << 16):
            scanner.feed(view[at:at + (1 << 16)])
        result = scanner.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.ok and peak < 1 << 20, peak


# --------------------------------------------------------------------------- fallback

_FALLBACK = r"""
import sys
{hide}
import bookfs.noun as n
from bookfs.noun import codec, scanner
assert n.CORE == "pure", n.CORE
assert n.cue is codec.cue and n.jam is codec.jam and n.mug is codec.mug
assert n.scan is scanner.scan and n.Scanner is scanner.Scanner
noun = n.cell(1, 2 ** 100, n.cord("fast"))
data = n.jam(noun)
assert n.cue(data) == noun and n.scan(data, mug=True).mug == n.mug(noun)
s = n.Scanner()
s.feed(data[:3]); s.feed(data[3:])
assert s.finish().ok and not n.scan(data + b"\0").ok
print(n.core_description())
"""


@pytest.mark.parametrize("how", ["missing", "env"])
def test_fallback_to_the_pure_core(how: str) -> None:
    """Without the compiled module (not built: hidden here) or with BOOKFS_PURE_NOUNS set,
    bookfs.noun is the pure core, works, and says why."""
    check_fallback(_FALLBACK, 'bookfs.noun._core', 'BOOKFS_PURE_NOUNS', how)


def test_info_says_which_core(tmp_path) -> None:
    compiled, pure = info_both_ways(tmp_path, "BOOKFS_PURE_NOUNS")
    assert "nouns:" in compiled and "compiled" in compiled.split("nouns:")[1]
    assert "nouns:    pure Python: BOOKFS_PURE_NOUNS is set" in pure


_da_now = 0x8000000CCE9E0D80 << 64  # ~2024 as an @da's seconds half
_knots = st.one_of(st.sampled_from([cord("d"), cord("term"), cord("ames"), cord("é"), 0]),
                   st.integers(0, 2**40), st.just(0xFF), st.just(1 << 70000))
_wires = st.lists(_knots, max_size=5).map(lambda ks: from_list(ks))
_dates = st.one_of(st.integers(0, 2**200), st.just(_da_now),
                   st.integers(_da_now, _da_now + (1 << 90)), st.just(1 << 70000))
_cards = st.one_of(st.tuples(st.one_of(st.sampled_from([cord("hear"), cord("belt")]),
                                       st.integers(0, 2**64), st.just(0xFF)), atoms), atoms)


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.tuples(_dates, st.tuples(_wires, _cards)),  # event-shaped
    st.tuples(_dates, st.one_of(atoms, st.tuples(atoms, atoms))),  # not quite
    atoms, trees))
def test_event_head_agrees(noun: Noun) -> None:
    """The compiled ``event_head`` (the Spark rows' date, wire and tag) and the pure
    reference give the same head for event-shaped nouns, and three Nones alike for
    everything else: dates out of years 1..9999, wires that are not lists of UTF-8 knots,
    atoms over 2^16 bits, a card that is an atom."""
    from bookfs.noun import peek

    assert C.event_head(noun, {}) == peek.event_head(noun, {})
    texts_c, texts_p = {}, {}
    assert C.event_head(noun, texts_c) == peek.event_head(noun, texts_p)
    assert texts_c == texts_p  # the cache is filled the same way


def test_event_head_of_a_sample_event() -> None:
    from bookfs.noun import peek

    noun = (_da_now, (from_list([cord("d"), cord("term"), 1]), (cord("belt"), 7)))
    for impl in (C.event_head, peek.event_head):
        assert impl(noun, {}) == (_da_now, "/d/term/\x01", "belt")


def test_atoms_met_again_are_the_same_values() -> None:
    """The compiled cue shares the one-word atoms it made lately (a direct-mapped cache by
    value): atoms that meet in the cache's slots, met again and in turn, and the small
    ints around its floor, cue to the very values the pure core gives, every time."""
    rng = random.Random(24)
    words = [rng.getrandbits(rng.randrange(9, 65)) for _ in range(3000)]
    words += [255, 256, 257, 2**63, 2**64 - 1]
    for _ in range(3):
        for start in range(0, len(words), 50):
            noun = tuple(words[start:start + 50])
            nested = noun[0]
            for w in noun[1:]:
                nested = (nested, w)
            data = P.jam(nested)
            assert C.cue(data) == P.cue(data) == nested
