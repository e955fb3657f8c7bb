"""Tests for bookfs.cli.sample: deterministic, realistic sample event payloads."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from itertools import islice

import pytest

from bookfs.noun import cue, da_to_datetime, parse_patp, patp, to_list, uncord
from bookfs.noun import mug as noun_mug
from bookfs.cli.sample import (
    LARGE_EVERY,
    LARGE_PAYLOAD,
    MEDIUM_PAYLOAD,
    SAMPLE_EPOCH,
    SAMPLE_LIFE,
    SAMPLE_MAX_START_OFFSET,
    SAMPLE_MAX_STEP,
    SAMPLE_MIN_STEP,
    SMALL_PAYLOAD,
    iter_sample_payloads,
    sample_meta,
)

EVENTS = 5000
# Card tags a real ship's log holds (checked independently of the module's own list).
KNOWN_TAGS = {
    "belt", "blew", "boon", "born", "crud", "hail", "hear", "plea", "request",
    "request-local", "send", "trim", "vega", "wake", "init", "sift", "verb",
}


@pytest.fixture(scope="module")
def payloads() -> list[bytes]:
    return list(iter_sample_payloads(EVENTS, seed=0))


@pytest.fixture(scope="module")
def decoded(payloads: list[bytes]) -> list[tuple[int, object]]:
    """(mug, noun) for every payload."""
    return [(int.from_bytes(p[:4], "little"), cue(p[4:])) for p in payloads]


def _bucket(size: int) -> str:
    for name, (low, high) in (("small", SMALL_PAYLOAD), ("medium", MEDIUM_PAYLOAD),
                              ("large", LARGE_PAYLOAD)):
        if low <= size <= high:
            return name
    return "other"


def test_count_and_types(payloads: list[bytes]) -> None:
    assert len(payloads) == EVENTS
    assert all(isinstance(p, bytes) and len(p) > 4 for p in payloads)


def test_same_seed_same_bytes() -> None:
    assert list(iter_sample_payloads(300, seed=7)) == list(iter_sample_payloads(300, seed=7))


def test_different_seed_different_bytes() -> None:
    one = list(iter_sample_payloads(300, seed=1))
    two = list(iter_sample_payloads(300, seed=2))
    assert len(one) == len(two) == 300
    assert sum(a != b for a, b in zip(one, two)) > 290


def test_prefix_stable(payloads: list[bytes]) -> None:
    assert list(iter_sample_payloads(700, seed=0)) == payloads[:700]


def test_short_logs() -> None:
    assert list(iter_sample_payloads(0)) == []
    three = list(iter_sample_payloads(3))
    assert len(three) == 3 and all(p[:4] == bytes(4) for p in three)
    with pytest.raises(ValueError):
        list(iter_sample_payloads(-1))


def test_lifecycle_events(payloads: list[bytes], decoded: list[tuple[int, object]]) -> None:
    life = payloads[:SAMPLE_LIFE]
    assert all(p[:4] == b"\x00\x00\x00\x00" for p in life)
    assert decoded[0][1] == (2, ((0, 3), (0, 2)))  # the lifecycle formula
    sizes = [len(p) for p in life]
    assert max(sizes) >= 1024 * 1024
    assert sum(sizes) < 2 * 1024 * 1024
    for _, noun in decoded[1:SAMPLE_LIFE]:
        assert isinstance(noun, tuple)


def test_size_mix(payloads: list[bytes]) -> None:
    counts = Counter(_bucket(len(p)) for p in payloads[SAMPLE_LIFE:])
    total = EVENTS - SAMPLE_LIFE
    assert counts["other"] == 0
    assert counts["small"] >= 0.95 * total
    assert 0.015 * total <= counts["medium"] <= 0.04 * total
    # One large event per block of LARGE_EVERY event numbers: blocks 0 and 1 are
    # complete; block 2's event may fall before or after event 5000.
    assert counts["large"] in (2, 3)
    small = sorted(len(p) for p in payloads[SAMPLE_LIFE:] if _bucket(len(p)) == "small")
    assert small[len(small) // 2] < 512  # mostly small: the median is well under 2 KB
    assert small[-1] > 1024  # but with a tail


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_at_least_one_large_event_from_2000_events(seed: int) -> None:
    sizes = [len(p) for p in iter_sample_payloads(LARGE_EVERY, seed=seed)]
    large = [s for s in sizes[SAMPLE_LIFE:] if LARGE_PAYLOAD[0] <= s <= LARGE_PAYLOAD[1]]
    assert len(large) == 1


def test_events_are_dated_ova(decoded: list[tuple[int, object]]) -> None:
    earliest = SAMPLE_EPOCH
    latest = SAMPLE_EPOCH + SAMPLE_MAX_START_OFFSET + EVENTS * SAMPLE_MAX_STEP
    tick = dt.timedelta(microseconds=16)  # 2^-16 s, vere's clock resolution
    previous: dt.datetime | None = None
    tags: Counter[str] = Counter()
    for mug, noun in decoded[SAMPLE_LIFE:]:
        assert 0 < mug < 2**31
        assert mug == noun_mug(noun)  # issue 10 item 8: the true mug, not random bytes
        assert isinstance(noun, tuple)
        now, ovum = noun
        when = da_to_datetime(now)
        assert earliest <= when <= latest
        if previous is not None:
            assert SAMPLE_MIN_STEP - tick <= when - previous <= SAMPLE_MAX_STEP + tick
        previous = when
        wire, card = ovum
        knots = [uncord(k) for k in to_list(wire)]
        assert knots and all(k and k.isprintable() and "/" not in k for k in knots)
        tag, _data = card
        tags[uncord(tag)] += 1
    assert set(tags) <= KNOWN_TAGS
    assert {"belt", "hear", "wake", "request", "plea", "boon"} <= set(tags)
    assert tags.most_common(1)[0][1] < 0.5 * (EVENTS - SAMPLE_LIFE)


def test_wires_match_cards(decoded: list[tuple[int, object]]) -> None:
    vane_of = {"belt": "d", "wake": "b", "hear": "a", "request": "e", "plea": "a", "boon": "g"}
    for _, (_, (wire, (tag, _))) in islice(decoded, SAMPLE_LIFE, None):  # type: ignore[misc]
        name = uncord(tag)
        if name in vane_of:
            assert uncord(to_list(wire)[0]) == vane_of[name]


def test_bulk_bytes_are_in_the_card(
    payloads: list[bytes], decoded: list[tuple[int, object]]
) -> None:
    for payload, (_, noun) in zip(payloads[SAMPLE_LIFE:], decoded[SAMPLE_LIFE:]):
        if len(payload) < MEDIUM_PAYLOAD[0]:
            continue
        card = noun[1][1]  # type: ignore[index]
        stack, widest = [card], 0
        while stack:
            node = stack.pop()
            if isinstance(node, tuple):
                stack.extend(node)
            else:
                widest = max(widest, (node.bit_length() + 7) // 8)
        assert widest > 0.9 * len(payload)


def test_sample_meta() -> None:
    meta = sample_meta(0)
    assert set(meta) == {"who", "version", "fake", "life"}
    assert [len(meta[k]) for k in ("who", "version", "fake", "life")] == [16, 4, 1, 4]
    who = int.from_bytes(meta["who"], "little")
    assert 0x10000 <= who < 2**32  # a planet
    assert parse_patp(patp(who)) == who and patp(who).count("-") == 1
    assert int.from_bytes(meta["version"], "little") == 1
    assert meta["fake"] == b"\x01"  # loobean %.n: a real ship (issue 10 item 3)
    assert int.from_bytes(meta["life"], "little") == SAMPLE_LIFE
    assert sample_meta(0) == meta
    assert sample_meta(1)["who"] != meta["who"]
