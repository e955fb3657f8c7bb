"""The streaming ram scanner (``bookfs/noun/ramscan.py``) against the ram decoder.

``RamScanner`` must accept exactly what ``ram_decode(data, bob_dir, exact=True)`` accepts
and refuse everything else with the same message, however the input is split into
chunks, while holding neither the encoding nor its atoms.  The class of inputs is
covered three ways: every one-bit flip and truncation of vere's own vectors (the damage
vere's decoder was run on), hypothesis nouns with random damage and random chunking, and
bob files present, missing, empty and wrong.  Before it, ``new/`` and ``bookfs append``
held a whole ram payload in memory until the close (``test_a_large_ram_payload_is_checked_
in_bounded_memory`` fails there).
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.noun.codec import CueError
from bookfs.noun.payload import PayloadCheck, check_payload
from bookfs.noun.ram import BobError, BobRef, bob_file_mug, bob_path, ram_decode, ram_encode
from bookfs.noun.ramscan import RamScanner, ram_check

DATA = json.loads((Path(__file__).parent / "vectors" / "ram" / "vectors.json").read_text())


def decoder_verdict(data: bytes, bob_dir=None) -> str | None:
    try:
        ram_decode(data, bob_dir, exact=True)
    except CueError as e:
        return f"{type(e).__name__}: {e}"
    return None


def scanner_verdict(data: bytes, cuts=(), bob_dir=None) -> str | None:
    scanner = RamScanner(bob_dir)
    at = 0
    for cut in sorted(set(c for c in cuts if 0 < c < len(data))) + [len(data)]:
        scanner.feed(data[at:cut])
        at = cut
    err = scanner.finish()
    return None if err is None else f"{type(err).__name__}: {err}"


def damaged_vectors():
    """vere's vectors whole, with every one-bit flip past the header, every truncation,
    and a byte appended."""
    for v in DATA["vectors"]:
        ram = bytes.fromhex(v["ram"])
        yield ram
        yield ram + b"\x00"
        step = 1 if len(ram) < 300 else 37
        for n in range(0, len(ram), step):
            yield ram[:n]
        for bit in range(0, 8 * len(ram), step):
            b = bytearray(ram)
            b[bit >> 3] ^= 1 << (bit & 7)
            yield bytes(b)


def test_every_flip_and_truncation_of_veres_vectors_gets_the_decoders_verdict():
    n = refused = 0
    for data in damaged_vectors():
        want = decoder_verdict(data)
        assert scanner_verdict(data) == want, data.hex()
        # and fed one byte at a time
        assert scanner_verdict(data, range(len(data))) == want, data.hex()
        n += 1
        refused += want is not None
    assert n > 3000 and refused > 1000


atoms = st.one_of(st.integers(0, 20), st.integers(0, 2**70), st.integers(0, 2**900))
leaves = st.one_of(atoms, st.builds(BobRef, st.integers(1, 2**31 - 1), st.integers(1, 9)))
nouns = st.recursive(leaves, lambda t: st.one_of(
    st.tuples(t, t), t.map(lambda x: (x, x)), st.tuples(t, t).map(lambda p: (p, (p[1], p)))),
    max_leaves=30)


@st.composite
def damaged(draw):
    data = bytearray(ram_encode(draw(nouns)))
    kind = draw(st.sampled_from(["whole", "flip", "truncate", "append", "splice"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 3))):
            bit = draw(st.integers(0, 8 * len(data) - 1))
            data[bit >> 3] ^= 1 << (bit & 7)
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif kind == "append":
        data += draw(st.binary(min_size=1, max_size=9))
    elif kind == "splice":
        at = draw(st.integers(5, len(data)))
        data[at:at + draw(st.integers(0, 4))] = draw(st.binary(max_size=6))
    return bytes(data)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged(), st.lists(st.integers(0, 400), max_size=8))
def test_any_input_any_chunking_gets_the_decoders_verdict(data, cuts):
    assert scanner_verdict(data, cuts) == decoder_verdict(data)


@pytest.fixture
def bobs(tmp_path):
    """A ``.urb/bob`` directory: a good file, an empty one and one with the wrong content."""
    root = tmp_path / "bob"
    good = b"\x07" * 5000
    files = {"good": (bob_file_mug(good), 1, good), "empty": (11, 1, b""),
             "wrong": (bob_file_mug(good), 2, b"\x08" * 10)}
    for mug, seq, content in files.values():
        path = Path(bob_path(root, mug, seq))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return str(root), {k: BobRef(m, s) for k, (m, s, _) in files.items()}


@pytest.mark.parametrize("which", ["good", "empty", "wrong", "missing"])
def test_bob_files_present_missing_empty_and_wrong(bobs, which):
    root, refs = bobs
    ref = refs.get(which, BobRef(12345, 3))
    data = ram_encode((1, (ref, ref)))
    want = decoder_verdict(data, root)
    assert scanner_verdict(data, (), root) == want
    assert scanner_verdict(data, range(len(data)), root) == want
    if which in ("good", "missing"):
        assert want is None
    else:
        assert want.startswith("BobError"), want
        assert isinstance(ram_check(data, root), BobError)
    # without a bob directory the reference is only a reference
    assert scanner_verdict(data) is None


def test_a_large_ram_payload_is_checked_in_bounded_memory():
    """A 64 MiB atom in the ram encoding, fed in 1 MiB slices as ``new/`` feeds it: the
    check holds about a slice, not the payload, and gives the whole input's verdict."""
    atom = int.from_bytes(b"\x5a" * (64 << 20), "little")
    payload = b"\x01\x02\x03\x04" + ram_encode((atom, 7))
    del atom
    view = memoryview(payload)
    for tail in (b"", b"\x00"):
        data = payload + tail if tail else payload
        view = memoryview(data)
        tracemalloc.start()
        try:
            check = PayloadCheck()
            for at in range(0, len(view), 1 << 20):
                check.feed(view[at:at + (1 << 20)])
            problem = check.finish()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20, f"the check held {peak} bytes"
        assert (problem is None) == (not tail)
        assert problem == check_payload(data)
        if tail:
            assert "the input goes on" in problem.why
