"""One decision on what an event's payload is (:mod:`bookfs.noun.payload`), whichever way
the bytes arrive: whole (:func:`check_payload`, the Spark rows), fed in chunks of any
size as a file is written (:class:`PayloadCheck`, the mount's ``new/``), read back in
slices by ``pread`` (:func:`payload_problem`: ``verify --nouns``, ``show``, ``pretty/``,
``report``), or from a file (:func:`check_payload_file`, ``bookfs append``).  These used to
be two implementations with two wordings; every path must give the same verdict, the same
byte and the same reason, for valid payloads of both encodings and for damaged ones."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.noun import jam, scan
from bookfs.noun import payload as P
from bookfs.noun.ram import ram_encode

atoms = st.one_of(st.integers(0, 300), st.integers(0, 2**200))
nouns = st.recursive(atoms, lambda kids: st.tuples(kids, kids), max_leaves=20)


@st.composite
def payloads(draw):
    """A payload as vere writes it (mug, then jam or ram), maybe damaged: cut short, a
    byte changed, or bytes added at the end."""
    noun = draw(nouns)
    body = ram_encode(noun) if draw(st.booleans()) else jam(noun)
    data = bytearray(draw(st.binary(min_size=4, max_size=4)) + body)
    damage = draw(st.sampled_from(["none", "cut", "flip", "extra"]))
    if damage == "cut":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif damage == "flip":
        i = draw(st.integers(0, len(data) - 1))
        data[i] ^= draw(st.integers(1, 255))
    elif damage == "extra":
        data += draw(st.binary(min_size=1, max_size=9))
    return bytes(data)


def by_paths(data: bytes, cuts: list[int], slice_bytes: int, tmp_path) -> list:
    check = P.PayloadCheck()
    prev = 0
    for c in sorted(set(min(c, len(data)) for c in cuts)) + [len(data)]:
        if not check.feed(data[prev:c]):
            break
        prev = c
    file = tmp_path / "payload"
    file.write_bytes(data)
    old, P.SLICE = P.SLICE, slice_bytes  # force the sliced path of payload_problem too
    try:
        sliced = P.payload_problem(len(data), lambda off, n: data[off:off + n])
    finally:
        P.SLICE = old
    return [P.check_payload(data), check.finish(),
            P.payload_problem(len(data), lambda off, n: data[off:off + n]), sliced,
            P.check_payload_file(str(file), chunk=max(1, slice_bytes))]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads(), st.lists(st.integers(0, 400), max_size=6), st.integers(1, 64))
def test_every_path_gives_the_same_verdict(tmp_path, data, cuts, slice_bytes):
    verdicts = by_paths(data, cuts, slice_bytes, tmp_path)
    assert all(v == verdicts[0] for v in verdicts), verdicts
    got = verdicts[0]
    if got is not None:  # a byte within the payload, one line each
        assert got.offset is None or 0 <= got.offset <= len(data)
        assert "\n" not in got.why and "\n" not in got.refusal


@given(nouns, st.binary(min_size=4, max_size=4))
def test_valid_payloads_of_both_encodings_pass(noun, mug):
    for body in (jam(noun), ram_encode(noun)):
        assert P.check_payload(mug + body) is None


def test_the_reasons_name_the_byte_and_the_encoding(tmp_path):
    good = jam((1, 2))
    cut = b"\0\0\0\0" + good[:-1]
    res = scan(good[:-1], exact=True)
    p = P.check_payload(cut)
    assert p.offset == 4 + res.byte
    assert p.why.startswith("jam: ") and p.refusal.startswith(
        f"not a mug and a jam: parsing failed at byte {p.offset} (bit {res.bit} of the jam")
    ram = b"\0\0\0\0" + ram_encode((1, 2))[:-1]
    p = P.check_payload(ram)
    assert p.refusal.startswith("not a mug and a ram encoding: parsing failed at byte ")
    assert P.check_payload(b"ab").refusal == (
        "2 bytes, expected at least 4 (a 4-byte mug, then the jam)")
    assert P.not_a_noun(7, P.check_payload(cut)).startswith(
        f"event 7 is not a noun: parsing failed at byte {4 + res.byte} of its payload: jam: ")
