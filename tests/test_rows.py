"""The compiled row builder (``bookfs/spark/_rows.pyx``) against the pure one
(``bookfs/spark/rows.py``, the reference), issue 22.3.

Hypothesis holds them to the same Arrow batches (every column and random projections,
batch boundaries included) and the same errors, raised after the same batches, over
random segments: valid events encoded with back-references and padded lengths anywhere in
their heads, other nouns, bytes that are not nouns, payloads shorter than a mug, ram
payloads, jams over ``CUE_BYTES`` (made small here), and damaged deeds (a bad CRC, a
length past the end, a truncated tail).  The compiled head reader (``jam_head``) is held to
``event_head(cue(jam))`` on its own.  Then the reasons the scan stays in the compiled
path, the fallback to the pure builder and what ``bookfs info`` says.
"""

from __future__ import annotations

import os
import random

import pytest
from compiled_fallback import check_fallback, info_both_ways
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.formats.layout import encode_deed
from bookfs.noun import cord, cue, event_head, from_list, jam, scan
from bookfs.noun.ram import ram_encode
from bookfs.spark import decoding as D
from bookfs.spark import rows as R

try:
    import bookfs.spark._rows as C
except ImportError:  # not built: the comparisons are skipped, the fallback is tested
    C = None
#: The tests that compare the compiled builder with the pure one.
compiled = pytest.mark.skipif(C is None, reason="the compiled row builder did not build")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                       HealthCheck.data_too_large,
                                                       HealthCheck.filter_too_much])

# --------------------------------------------------------------------------- nouns

_DA = 0x8000000CCE9E0D80 << 64  # ~1970 as an @da: its seconds half is the Unix epoch
_YEAR_1 = (0x8000000CCE9E0D80 - 62135596800) << 64
_YEAR_9999 = (0x8000000CCE9E0D80 + 253402300799) << 64 | ((1 << 64) - 1)



def _wide(bits: int):
    """The atom 2^bits (made lazily: hypothesis cannot print an atom this wide)."""
    return st.builds(lambda: 1 << bits)


atoms = st.one_of(st.integers(0, 16), st.integers(0, 2**64 + 2), st.integers(0, 2**300),
                  st.sampled_from([cord("hear"), cord("belt"), 2**128]), _wide(65536))
trees = st.recursive(atoms, lambda kids: st.tuples(kids, kids), max_leaves=12)
knots = st.one_of(st.sampled_from([cord("d"), cord("term"), cord("ames"), cord("é"),
                                   cord("a/b"), 0, 0xFF, 0xC3]),
                  _wide(65535), _wide(65536), st.integers(0, 2**40))
wires = st.one_of(st.lists(knots, max_size=5).map(from_list),
                  st.lists(knots, max_size=3).map(lambda ks: from_list(ks) if not ks else
                                                  (ks[0], from_list(ks[1:]) or 5)))
dates = st.one_of(st.integers(_DA, _DA + (1 << 90)), st.just(_YEAR_1), st.just(_YEAR_1 - 1),
                  st.just(_YEAR_9999), st.just(_YEAR_9999 + 1), st.integers(0, 2**200),
                  _wide(65537))
cards = st.one_of(st.tuples(st.one_of(st.sampled_from([cord("hear"), cord("wake"), 0xFF,
                                                       cord("ü")]),
                                      _wide(65536), st.integers(0, 2**64)), trees), atoms)
events = st.one_of(st.tuples(dates, st.tuples(wires, cards)),  # event-shaped
                   st.tuples(dates, st.one_of(atoms, st.tuples(atoms, atoms))),
                   atoms, trees)


class _Bits:
    """Bits written least significant first, as jam writes them."""

    def __init__(self) -> None:
        self.value, self.n = 0, 0

    def put(self, value: int, width: int) -> None:
        self.value |= value << self.n
        self.n += width

    def mat(self, a: int, pad: int = 0) -> None:
        """jam's length-prefixed atom, its width ``pad`` bits more than ``a`` needs."""
        b = a.bit_length() + pad
        if not b:
            self.put(1, 1)
            return
        c = b.bit_length()
        self.put(0, c)
        self.put(1, 1)
        self.put(b & ((1 << (c - 1)) - 1), c - 1)
        self.put(a, b)

    def bytes(self) -> bytes:
        return self.value.to_bytes((self.n + 7) >> 3, "little")


def encode(noun, rnd: random.Random, refs: float = 0.5, pads: float = 0.2) -> bytes:
    """A jam of ``noun`` that cues to it but is not jam's own: a repeated atom or cell is
    a back-reference with probability ``refs`` (to any earlier copy), and an atom's or a
    reference's length carries leading zeros with probability ``pads``."""
    out = _Bits()
    seen: dict = {}

    def pad() -> int:
        return rnd.randrange(1, 70) if rnd.random() < pads else 0

    def go(x) -> None:
        pos = out.n
        key = ("a", x) if isinstance(x, int) else ("c", x)
        if key in seen and rnd.random() < refs:
            out.put(3, 2)
            out.mat(rnd.choice(seen[key]), pad())
            return
        if isinstance(x, int):
            out.put(0, 1)
            out.mat(x, pad())
        else:
            out.put(1, 2)
            go(x[0])
            go(x[1])
        seen.setdefault(key, []).append(pos)

    go(noun)
    return out.bytes()


# --------------------------------------------------------------------------- the head


@compiled
@settings(FAST, max_examples=1500)
@given(events, st.integers(0, 2**32), st.sampled_from([0.0, 0.5, 1.0]),
       st.sampled_from([0.0, 0.3]))
def test_jam_head_is_event_head_of_the_cued_noun(noun, seed, refs, pads) -> None:
    """Read from the bits of a jam the scanner accepts (jam's own, or one with
    back-references and padded lengths wherever the noun repeats), the head is
    ``event_head`` of the cued noun: dates at years 1 and 9999 and just past them, wires
    of knots that are not UTF-8 or over 2^16 bits or not null-terminated, cards that are
    atoms."""
    for data in (jam(noun), encode(noun, random.Random(seed), refs, pads)):
        assert scan(data).ok
        assert C.jam_head(data) == event_head(cue(data), {}), data.hex()


@compiled
def test_jam_head_of_a_sample_event() -> None:
    noun = (_DA + 5, (from_list([cord("d"), cord("term"), 1, 0]), (cord("belt"), 7)))
    assert C.jam_head(jam(noun)) == (_DA + 5, "/d/term/\x01/", "belt")
    assert C.jam_head(jam((_DA, (0, (cord("born"), 0))))) == (_DA, "/", "born")


def test_the_scan_stays_because_cue_is_not_its_verdict() -> None:
    """Why the compiled path still runs the scanner (its module docstring): ``cue``
    accepts bits after the noun, which make a payload that is not an event's, and says
    nothing of where the noun ended.  Where both fail, they fail alike."""
    from bookfs.noun import CueError

    data = jam((_DA, (0, (cord("born"), 0))))
    for extra in (b"\x00", b"\x01", b"\xff\xff"):
        assert cue(data + extra) == cue(data)
        assert scan(data + extra).reason == "trailing"
    end = scan(data).bits
    assert end % 8  # this noun's last byte has padding: set a bit of it
    last = data[:-1] + bytes([data[-1] | 0x80])
    assert cue(last) == cue(data) and scan(last).reason == "trailing"
    for cut in range(1, len(data)):
        with pytest.raises(CueError) as e:
            cue(data[:cut])
        assert str(e.value) == scan(data[:cut]).message


# --------------------------------------------------------------------------- builders

_RAM = st.builds(lambda n: ram_encode(n), events)


@st.composite
def payloads(draw):
    """A payload: mug + an event or other noun (encoded jam's way or not), ram, damage,
    or bytes that are no noun (some shorter than a mug)."""
    mug = draw(st.binary(min_size=4, max_size=4))
    kind = draw(st.sampled_from(["event", "event", "event", "noun", "ram", "bytes",
                                 "flip", "cut", "extra"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "ram":
        return mug + draw(_RAM)
    noun = draw(events if kind != "noun" else trees)
    body = encode(noun, random.Random(draw(st.integers(0, 2**32))),
                  draw(st.sampled_from([0.0, 0.5, 1.0])), draw(st.sampled_from([0.0, 0.2])))
    if kind == "flip":
        at = draw(st.integers(0, len(body) * 8 - 1))
        body = bytearray(body)
        body[at >> 3] ^= 1 << (at & 7)
        body = bytes(body)
    elif kind == "cut":
        body = body[:draw(st.integers(0, len(body)))]
    elif kind == "extra":
        body += draw(st.binary(min_size=1, max_size=3))
    return mug + body


#: What a segment's or a payload's bytes come in: pyarrow's views (_binary_views) are of
#: signed bytes, format "b".
_holders = st.sampled_from([bytes, bytearray, memoryview, lambda b: memoryview(b).cast("b")])


@st.composite
def segments(draw):
    """``(segments, since, until)``: one or two segments of consecutive events, maybe a
    damaged deed or a cut tail, and bounds around them."""
    first = draw(st.integers(1, 10**6))
    parts, at = [], first
    for _ in range(draw(st.integers(1, 2))):
        loads = draw(st.lists(payloads(), min_size=0, max_size=8))
        raw = bytearray(b"".join(encode_deed(p) for p in loads))
        damage = draw(st.sampled_from(["none", "none", "none", "crc", "len", "cut", "let"]))
        if raw and damage == "crc":
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << draw(st.integers(0, 7))
        elif raw and damage == "len":
            raw[draw(st.integers(0, 7))] ^= 0xFF
        elif raw and damage == "cut":
            del raw[draw(st.integers(0, len(raw) - 1)):]
        elif loads and damage == "let":
            raw[-1] ^= 0x01
        name = draw(st.sampled_from([None, at, max(1, at - 3)]))
        seg = draw(_holders)(bytes(raw))
        parts.append((at, seg) if name is None else (at, seg, name))
        at += len(loads)
    since = draw(st.integers(first - 2, at + 1))
    until = draw(st.one_of(st.integers(first - 2, at + 1), st.just(2**70)))
    return parts, since, until


wants = st.one_of(st.none(), st.sets(st.sampled_from(D.COLUMNS)))


def _run(make):
    """The batches a builder yields, and the error it ends with (type and text)."""
    got = []
    try:
        for b in make():
            got.append(b)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return got, (type(e), str(e))
    return got, None


def _same(a, b) -> None:
    (pure, perr), (comp, cerr) = a, b
    assert perr == cerr
    assert len(pure) == len(comp)
    for x, y in zip(pure, comp):
        assert x.schema == y.schema
        assert x.equals(y), (x.to_pylist(), y.to_pylist())
        y.validate(full=True)


def _stamp(event: int) -> int:
    return event * 1000 + 7  # committed_at of an undated event: any function of it


@compiled
@settings(FAST, max_examples=1200)
@given(segments(), wants, st.integers(1, 6), st.sampled_from([1, 200, 10**9]),
       st.sampled_from([D.CUE_BYTES, 12, 40]))
def test_compiled_segments_are_the_pure_ones(segs, want, rows, size, cue_bytes) -> None:
    """Every column or a projection, the same batches (where a batch ends too) and the
    same ValueError after them for a damaged deed; jams over ``CUE_BYTES`` (made small
    here) only have their head read, as the pure path does."""
    parts, since, until = segs
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D, "CUE_BYTES", cue_bytes)
        _same(_run(lambda: R._pure_segment_batches(parts, since, until, _stamp, want, rows,
                                                   size)),
              _run(lambda: C.segment_batches(parts, since, until, _stamp, want, rows,
                                             size)))


class _Size:
    """events/'s stand-in for a payload that is not read (bookfs.spark.partitions)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


@compiled
@settings(FAST, max_examples=600)
@given(st.lists(st.tuples(payloads(), st.one_of(st.none(), st.integers(-2**62, 2**62)),
                          _holders), max_size=8),
       wants, st.integers(1, 5), st.booleans())
def test_compiled_event_files_are_the_pure_ones(items, want, rows, stamped) -> None:
    """The ``events/`` path (items with their own committed_at, bytes or views, or only
    a size when nothing needs the bytes), and the segments' ``stamp`` rule, alike."""
    unread = want is not None and not (want & {"mug", "jam", *D.DECODED}) and not stamped
    made = [(i + 1, _Size(len(p)) if unread else hold(p), when)
            for i, (p, when, hold) in enumerate(items)]
    stamp = _stamp if stamped else None
    _same(_run(lambda: R._pure_batches(made, want, stamp, rows)),
          _run(lambda: C.batches(made, want, stamp, rows)))


@compiled
def test_the_sample_log_reads_alike(tmp_path) -> None:
    """A sample log's segment (lifecycle events, one over 1 MB, every card tag), every
    column and two projections: the same batches from both builders."""
    from bookfs.cli.sample import write_sample

    write_sample(str(tmp_path / "log"), 300, 7)
    with open(tmp_path / "log" / "book.log", "rb") as f:
        seg = memoryview(f.read())[16:]
    for want in (None, {"event", "size"}, {"event", "card", "error", "committed_at"}):
        pure = list(R._pure_segment_batches([(1, seg)], 1, 300, _stamp, want))
        comp = list(C.segment_batches([(1, seg)], 1, 300, _stamp, want))
        _same((pure, None), (comp, None))
    assert sum(b.num_rows for b in comp) == 300


@compiled
def test_compiled_builder_in_use() -> None:
    """Where the extension built (setup.sh builds it), the rows use it."""
    import bookfs.spark as bs

    assert R.ROWS == bs.ROWS == "compiled", R.ROWS_REASON
    assert R.ROWS_REASON is None and bs.rows_description().startswith("compiled")


_FALLBACK = r"""
import sys
{hide}
from bookfs.spark import rows as R
assert R.ROWS == "pure" and R._impl is None, R.ROWS
assert [b.num_rows for b in R._segment_batches([(1, b"")], 1, 1, None)] == []
print(R.rows_description())
"""


@pytest.mark.parametrize("how", ["missing", "env"])
def test_fallback_to_the_pure_builder(how: str) -> None:
    """Without the compiled module (not built: hidden here) or with BOOKFS_PURE_ROWS set,
    the rows are the pure builder's, and say why."""
    check_fallback(_FALLBACK, 'bookfs.spark._rows', 'BOOKFS_PURE_ROWS', how)


def test_info_says_which_row_builder(tmp_path) -> None:
    default, pure = info_both_ways(tmp_path, "BOOKFS_PURE_ROWS")
    assert (f"rows:     {R.rows_description()}" in default and
            ("compiled (bookfs/spark/_rows.pyx)" in default) == (C is not None))
    assert "rows:     pure Python: BOOKFS_PURE_ROWS is set" in pure
    assert "nouns:    compiled" in pure or "nouns:    pure" in pure  # aligned as before


def test_a_segments_read_stats_only_the_events_without_a_date(tmp_path, monkeypatch):
    """``committed_at`` of a ``segments/`` row is its event's date (the event file's
    mtime, bookfs/fs/dates.py), so a read stats only the events that have none (the
    boot's lifecycle events).  Since mtimes became dates, the step function of mtimes
    along the log had a step per event, and a read stat'ed every event through FUSE (on a
    fresh mount the daemon decoded each to answer: 100 s of warm-up at 1M events)."""
    from mounting import mounted, run_bookfs

    from bookfs.spark import partitions as P

    log = tmp_path / "log"
    run_bookfs("sample", str(log), "--events", "3000")
    with mounted(log, tmp_path / "mnt", "-o", "ro") as mnt:
        stats = []
        real_stat = os.stat

        def counting_stat(path, *args, **kw):
            if f"{os.sep}events{os.sep}" in os.fspath(path):
                stats.append(path)
            return real_stat(path, *args, **kw)

        monkeypatch.setattr(os, "stat", counting_stat)
        parts, hi = P.plan(P.Mount(str(mnt)), None, None, 1000, 128 << 20)
        rows = [b for p in parts for b in P.read_partition(p, ["event", "committed_at", "date"])]
        monkeypatch.undo()
        assert hi == 3000 and sum(b.num_rows for b in rows) == 3000
        undated = sum(b.column("date").null_count for b in rows)
        assert 0 < undated <= 10 and len(stats) <= undated, (len(stats), undated)
        for b in rows:  # a dated row's committed_at is its date, to the millisecond
            for date, at in zip(b.column("date").to_pylist(), b.column("committed_at").to_pylist()):
                if date is not None:
                    assert at == date.replace(microsecond=date.microsecond // 1000 * 1000)
