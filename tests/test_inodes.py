"""Inode numbering: collision-free for every event number the format allows (u64).

The finding (issue 9, item 5): event inodes were ``2^32 + N`` and segment inodes
``2^40 + k``, so on a log whose first event is ``2^40 - 2^32`` the event file served the
raw segment.  Here hypothesis draws logs anywhere in the u64 range and checks that every
inode the mount can hand out is distinct and maps back to what it names.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bookfs.fs import inodes as I

U64 = (1 << 64) - 1
MAX_SPAN = 1 << 61  # every deed takes >= 8 bytes: no log spans more events than this

special_kinds = [
    ("root and fixed", lambda k: [I.ROOT, I.EVENTS, I.META, I.NEW, I.INFO, I.SEGMENTS,
                                  I.EPOCHS, *I.META_INODES.values()]),
    ("epoch", lambda k: [I.epoch_inode(k, kind) for kind in
                         (I.EPOCH_DIR, I.EPOCH_EVENTS, I.EPOCH_INFO)]),
    ("segment", lambda k: [I.segment_inode(k)]),
    ("staging", lambda k: [I.staging_inode(k)]),
]


@st.composite
def logs(draw):
    first = draw(st.integers(1, U64))
    span = draw(st.integers(0, min(MAX_SPAN, U64 - first)))
    return first, first + span


@settings(max_examples=2000)
@given(logs(), st.data())
def test_event_inodes_round_trip_and_never_meet_other_inodes(log, data):
    first, last = log
    events = {first, last, data.draw(st.integers(first, last))}
    events |= {e for e in (first + 1, last - 1, 2**40 - 2**32, 2**48, 2**63) if first <= e <= last}
    inodes = {}
    for e in events:
        ino = I.event_inode(e)
        assert 0 < ino <= U64 and I.is_event(ino)
        assert not (I.is_staging(ino) or I.is_segment(ino) or I.is_epoch(ino))
        assert I.inode_event(ino, first) == e
        assert inodes.setdefault(ino, e) == e, "two events share an inode"
    k = data.draw(st.integers(0, (1 << 40) - 1))
    for _, make in special_kinds:
        for ino in make(k):
            assert 0 < ino < I.EVENT_BIT and not I.is_event(ino)


@given(st.integers(0, (1 << 47) - 1), st.integers(0, (1 << 24) - 1))
def test_special_ranges_are_disjoint(k, epoch):
    seg, staged = I.segment_inode(k), I.staging_inode(k)
    assert I.is_segment(seg) and not I.is_staging(seg) and not I.is_epoch(seg)
    assert I.is_staging(staged) and not I.is_segment(staged)
    for kind in (I.EPOCH_DIR, I.EPOCH_EVENTS, I.EPOCH_INFO):
        ino = I.epoch_inode(epoch, kind)
        assert I.is_epoch(ino) and I.inode_epoch(ino) == (epoch, kind)


def test_names_and_numbers():
    assert I.event_name(42) == b"000000000042"
    assert I.parse_number(b"000000000042") == I.parse_number(b"42") == 42
    assert I.parse_number(str(U64).encode()) == U64
    assert I.parse_number(str(U64 + 1).encode()) is None
    assert I.parse_number(b"") is None and I.parse_number(b"4x") is None


@settings(max_examples=2000)
@given(logs(), st.data())
def test_pretty_inodes_round_trip_and_never_meet_other_inodes(log, data):
    """``pretty/<N>`` inodes (2^62 + N mod 2^62) map back to N within any log, are
    distinct, and never meet event, staging, segment, epoch or fixed inodes."""
    first, last = log
    events = {first, last, data.draw(st.integers(first, last))}
    events |= {e for e in (first + 1, last - 1, 2**62, 2**62 + 1, 2**63) if first <= e <= last}
    seen = {}
    for e in events:
        ino = I.pretty_inode(e)
        assert I.PRETTY_BASE <= ino < I.EVENT_BIT and I.is_pretty(ino)
        assert not (I.is_event(ino) or I.is_staging(ino) or I.is_segment(ino)
                    or I.is_epoch(ino))
        assert I.inode_pretty(ino, first) == e
        assert seen.setdefault(ino, e) == e, "two events share a pretty inode"
        assert not I.is_pretty(I.event_inode(e))
    k = data.draw(st.integers(0, (1 << 40) - 1))
    for _, make in special_kinds:
        for ino in make(k):
            assert not I.is_pretty(ino)
    assert not I.is_pretty(I.staging_inode(I.PRETTY_BASE - I.STAGING_BASE - 1))
    assert I.PRETTY not in (I.ROOT, I.EVENTS, I.META, I.NEW, I.INFO, I.SEGMENTS, I.EPOCHS)


@given(st.integers(0, I.SIZES_BIT - 1), st.integers(0, I.SLOTS - 1), st.booleans(),
       st.integers(0, I.SIZES_BIT - 1), st.integers(0, I.SLOTS - 1), st.booleans())
def test_a_segment_and_its_sizes_file_have_inodes_of_their_own(k, slot, sizes, k2, slot2,
                                                                sizes2):
    """``segments/K`` and ``segments/K.sizes`` share the segment range and its generation
    slots; each round-trips to its segment index, slot and kind, and no two meet."""
    ino = I.segment_inode(k, slot, sizes)
    assert I.is_segment(ino) and not I.is_staging(ino) and not I.is_epoch(ino)
    assert (I.inode_segment(ino), I.slot_of(ino), I.is_sizes(ino)) == (k, slot, sizes)
    if (k, slot, sizes) != (k2, slot2, sizes2):
        assert I.segment_inode(k2, slot2, sizes2) != ino
