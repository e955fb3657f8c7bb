"""vere's ram encoding (issue 21, item 4): bookfs/noun/ram.py against vere's own code.

``tests/vectors/ram/vectors.json`` was written by ``tests/vectors/ram/make_vectors.sh``: a
C driver built against urbit/vere 125ac225's ``pkg/noun/serial.c``.  For each noun it
holds vere's jam, ram and mug; for a few, vere's own decoder's verdict (``u3s_tap_xeno``)
on every one-bit flip and every truncation of the ram bytes.

Held here: every vector decodes to its noun, equal to the cue of its jam, with vere's
mug; ``ram_encode`` reproduces vere's bytes exactly; a bob atom decodes to its file's
atom when the file is present and to a :class:`BobRef` when it is not, never to another
atom; damaged input raises ``CueError`` whenever vere's decoder refuses it, and otherwise
decodes to exactly what vere's decoder makes of it (ram has no checksum: a flip that
leaves a valid encoding is a different noun, for vere as for bookfs).  The one place
bookfs refuses what vere reads: an atom whose bits run past the end of the input (vere
reads the missing bits as zeros).
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookfs.noun import cue as core_cue
from bookfs.noun import mug as core_mug
from bookfs.noun import codec
from bookfs.noun.codec import CueError, noun_equal
from bookfs.noun.ram import (RAM_HEADER, BobError, BobRef, bob_file_mug, bob_path, is_ram,
                             ram_decode, ram_encode, ram_mug)

VECTORS = Path(__file__).parent / "vectors" / "ram" / "vectors.json"
DATA = json.loads(VECTORS.read_text())
BY_NAME = {v["name"]: v for v in DATA["vectors"]}

# The vere quirks the vectors record, each explained where it is tested.
ATOM_THEN_BOB = "[atom-equal-to-bob bob]"
TRAILING_ZERO_BOB = "[7 bob-with-trailing-zero-bytes]"


def _int(text: str) -> int:
    if len(text) < 4000:
        return int(text)
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return int(text)
    finally:
        sys.set_int_max_str_digits(old)


def parse(x):
    """The driver's text form: atoms as decimal strings, cells as [head, tail], bob
    atoms (in ``noun_ref``) as {"bob": [mug, seq]}."""
    if isinstance(x, str):
        return _int(x)
    if isinstance(x, dict):
        return BobRef(*x["bob"])
    return (parse(x[0]), parse(x[1]))


def same(a, b) -> bool:
    """Equality of nouns that may hold BobRefs (small nouns only: recursive)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return same(a[0], b[0]) and same(a[1], b[1])
    return type(a) is type(b) and a == b


def ram_of(v) -> bytes:
    return bytes.fromhex(v["ram"])


@pytest.fixture(scope="module")
def bob_dir(tmp_path_factory) -> str:
    """An ``.urb/bob`` directory holding every bob file the vectors refer to."""
    root = tmp_path_factory.mktemp("pier") / ".urb" / "bob"
    for v in DATA["vectors"]:
        for b in v.get("bobs", ()):
            path = Path(bob_path(root, b["mug"], b["seq"]))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes.fromhex(b["hex"]))
    return str(root)


def test_vectors_come_from_vere():
    assert DATA["vere_commit"] == "125ac225d09d94e7d2c1d7bee9e0369e6013dfb3"
    assert len(DATA["vectors"]) >= 30
    names = set(BY_NAME)
    for needed in ("atom 0", "atom 1", "atom 2^64", "atom 3000 bytes", "[7 7]",
                   "[[1 2] [1 2]] equal cells", "~[1 2 3 4 5]", "[bob bob bob]",
                   "[2^64 2^64] same atom"):
        assert needed in names
    # back-references (tag 11) and bobs (tag 01) really occur in the vectors
    tags = collections.Counter()
    for v in DATA["vectors"]:
        tags.update(_tags(ram_of(v)))
    assert tags["back"] >= 10 and tags["bob"] >= 5


def _tags(data: bytes) -> list[str]:
    """The tags of a valid ram encoding, in the order they are written."""
    body = int.from_bytes(data[5:], "little")
    out = []
    pos, pending = 0, 1  # nouns still to read: a cell adds two, anything else ends one
    while pending:
        pending -= 1
        tag = (body >> pos) & 3
        pos += 2
        if tag == 2:
            out.append("cell")
            pending += 2
            continue
        out.append({0: "atom", 1: "bob", 3: "back"}[tag])
        for _ in range(2 if tag == 1 else 1):
            pos = _skip_mat(body, pos)
    assert pos == body.bit_length()  # the walk ends on the last bit written
    return out


def _skip_mat(body: int, pos: int) -> int:
    c = 0
    while not (body >> (pos + c)) & 1:
        c += 1
    if c == 0:
        return pos + 1
    b = 1 if c == 1 else (1 << (c - 1)) | ((body >> (pos + c + 1)) & ((1 << (c - 1)) - 1))
    return pos + c + 1 + (c - 1 if c > 1 else 0) + b


# ---------------------------------------------------------------------------
# every vector
# ---------------------------------------------------------------------------

vector_ids = [v["name"] for v in DATA["vectors"]]


@pytest.mark.parametrize("name", vector_ids)
def test_vector_decodes_to_its_noun(name, bob_dir):
    v = BY_NAME[name]
    noun = parse(v["noun"])
    got = ram_decode(ram_of(v), bob_dir, exact=True)
    assert noun_equal(got, noun)
    # ... which is the cue of vere's jam of the same noun
    assert noun_equal(got, codec.cue(bytes.fromhex(v["jam"])))
    assert noun_equal(got, core_cue(bytes.fromhex(v["jam"])))
    assert is_ram(ram_of(v)) and not is_ram(bytes.fromhex(v["jam"]))


@pytest.mark.parametrize("name", vector_ids)
def test_vector_without_bob_files(name):
    """No bob directory: every bob atom is a BobRef, never an atom."""
    v = BY_NAME[name]
    got = ram_decode(ram_of(v))
    if name == ATOM_THEN_BOB:
        # vere wrote the bob as a back-reference to the equal atom before it (its hash
        # table finds an atom equal to a bob's content): the bob is gone from the bytes,
        # and the noun decodes to [atom atom], which is the materialised noun.
        assert noun_equal(got, parse(v["noun"]))
        assert not v["tap_ok"]  # vere's own u3r_sing calls its round trip unequal
    else:
        assert same(got, parse(v.get("noun_ref", v["noun"])))
        assert v["tap_ok"]


@pytest.mark.parametrize("name", vector_ids)
def test_vector_mug(name):
    v = BY_NAME[name]
    assert ram_mug(parse(v.get("noun_ref", v["noun"]))) == v["mug"]
    assert ram_mug(ram_decode(ram_of(v))) == v["mug"]
    if name == TRAILING_ZERO_BOB:
        # vere names a bob file (and mugs the bob atom) by the mug of all the file's
        # bytes; the atom drops trailing zero bytes, so the two mugs differ
        assert codec.mug(parse(v["noun"])) != v["mug"]
        assert core_mug(parse(v["noun"])) != v["mug"]
    else:
        assert codec.mug(parse(v["noun"])) == v["mug"]
        assert core_mug(parse(v["noun"])) == v["mug"]


@pytest.mark.parametrize("name", vector_ids)
def test_encode_is_veres_bytes(name, bob_dir):
    v = BY_NAME[name]
    ref = parse(v.get("noun_ref", v["noun"]))
    assert ram_encode(ref, bob_dir) == ram_of(v)
    if name != ATOM_THEN_BOB:  # needs the bob's content to see it equals the atom
        assert ram_encode(ref) == ram_of(v)
    if "bobs" not in v:
        assert ram_encode(parse(v["noun"])) == ram_of(v)


def test_bob_files_are_named_by_their_content_mug():
    for v in DATA["vectors"]:
        for b in v.get("bobs", ()):
            assert bob_file_mug(bytes.fromhex(b["hex"])) == b["mug"]


# ---------------------------------------------------------------------------
# bob atoms
# ---------------------------------------------------------------------------


def test_bob_with_and_without_its_file(bob_dir, tmp_path):
    v = BY_NAME["[42 bob 99]"]
    (b1,) = [b for b in v["bobs"] if b["seq"] == 1 and b["mug"] == v["noun_ref"][1][0]["bob"][0]]
    content = int.from_bytes(bytes.fromhex(b1["hex"]), "little")

    assert ram_decode(ram_of(v), bob_dir) == (42, (content, 99))

    ref = BobRef(b1["mug"], 1)
    assert ram_decode(ram_of(v)) == (42, (ref, 99))
    empty = tmp_path / "bob"
    empty.mkdir()
    assert ram_decode(ram_of(v), empty) == (42, (ref, 99))  # the file is missing
    text = str(ref)
    assert f".urb/bob/{b1['mug']}/1" in text and "not present" in text
    assert repr(ref) == f"BobRef(mug={b1['mug']}, seq=1)"
    assert ref.path(bob_dir) == os.path.join(bob_dir, str(b1["mug"]), "1")


def test_a_bob_file_that_is_not_the_atom_is_refused(tmp_path):
    v = BY_NAME["bob alone"]
    mug = v["noun_ref"]["bob"][0]
    path = Path(bob_path(tmp_path, mug, 1))
    path.parent.mkdir()
    path.write_bytes(b"some other content")
    with pytest.raises(BobError, match="not the atom the event refers to"):
        ram_decode(ram_of(v), tmp_path)
    path.write_bytes(b"")
    with pytest.raises(BobError, match="empty"):
        ram_decode(ram_of(v), tmp_path)
    assert issubclass(BobError, CueError)


def test_repeated_bob_is_read_once_and_shared(bob_dir):
    got = ram_decode(ram_of(BY_NAME["[bob bob bob]"]), bob_dir)
    assert got[0] is got[1][0] is got[1][1]
    refs = ram_decode(ram_of(BY_NAME["[bob bob bob]"]))
    assert type(refs[0]) is BobRef and refs[0] is refs[1][0]


# ---------------------------------------------------------------------------
# damage: vere's own decoder as the oracle
# ---------------------------------------------------------------------------


def _damaged():
    for m in DATA["mutations"]:
        ram = ram_of(BY_NAME[m["name"]])
        for i, verdict in enumerate(m["flips"]):
            b = bytearray(ram)
            bit = 40 + i
            b[bit >> 3] ^= 1 << (bit & 7)
            yield m["name"], f"flip {i}", bytes(b), verdict
        for i, verdict in enumerate(m["truncations"]):
            yield m["name"], f"truncated to {5 + i} bytes", ram[:5 + i], verdict


def test_damage_is_refused_or_decoded_as_vere_decodes_it():
    """For every one-bit flip and truncation vere's driver tried: when vere's
    ``u3s_tap_xeno`` refuses it (returns u3_none, or crashes: its unwinding after a
    failure in the first token reads an uninitialised frame pointer, as
    ``u3s_cue_xeno``'s does) bookfs raises CueError; when vere decodes it, bookfs
    decodes the same noun, or refuses an atom that runs past the end of the input
    (vere reads the missing bits as zeros).  Nothing else."""
    seen = collections.Counter()
    for name, what, data, verdict in _damaged():
        try:
            got, err = ram_decode(data), None
        except CueError as e:
            got, err = None, str(e)
        if verdict is None or verdict == "crash":
            assert err is not None, f"{name}, {what}: vere refuses it, bookfs read {got!r}"
            seen["both refuse"] += 1
        elif err is not None:
            assert "past the end" in err, f"{name}, {what}: vere reads it, bookfs: {err}"
            seen["bookfs stricter: past the end"] += 1
        else:
            assert same(got, parse(verdict)), f"{name}, {what}: {got!r} != vere's {verdict}"
            seen["same noun as vere"] += 1
    assert seen["both refuse"] > 200 and seen["same noun as vere"] > 500
    assert seen["bookfs stricter: past the end"] < 30


@pytest.mark.parametrize("name", vector_ids)
def test_every_truncation_is_refused(name):
    """The last bit written is a 1 in the last byte, so any shorter input ends inside
    the noun: always CueError (vere, reading zeros past the end, may not notice)."""
    data = ram_of(BY_NAME[name])
    step = 1 if len(data) < 400 else 97
    for n in list(range(0, len(data), step)) + [len(data) - 1]:
        with pytest.raises(CueError):
            ram_decode(data[:n])


def _reference_decode(data: bytes):
    """ram read straight from the layout in docs/format.md ("The ram encoding"), one bit at a time: an
    independent implementation to hold ram_decode to on arbitrary damage."""
    if data[:5] != RAM_HEADER:
        raise CueError("header")
    bits = "".join(format(b, "08b")[::-1] for b in data[5:])
    n = len(bits)
    memo = {}

    def take(i, w):
        if i + w > n:
            raise CueError("past the end")
        return int(bits[i:i + w][::-1] or "0", 2)

    def rub(i, limit=None):
        c = 0
        while take(i + c, 1) == 0:
            c += 1
            if c >= 64:
                raise CueError("64 zeros")
        i += c + 1
        if c == 0:
            return 0, i
        b = 1 if c == 1 else (1 << (c - 1)) | take(i, c - 1)
        i += max(c - 1, 0)
        if limit is not None and b > limit:
            raise CueError("too wide")
        return take(i, b), i + b

    def node(i):
        tag = take(i, 2)
        if tag == 2:
            h, j = node(i + 2)
            t, k = node(j)
            memo[i] = (h, t)
            return memo[i], k
        if tag == 0:
            v, j = rub(i + 2)
            memo[i] = v
            return v, j
        if tag == 3:
            r, j = rub(i + 2, 62)
            if r not in memo:
                raise CueError("bad back-reference")
            return memo[r], j
        m, j = rub(i + 2, 62)
        s, k = rub(j, 62)
        if m >= 1 << 32 or s >= 1 << 32:
            raise CueError("bob id")
        memo[i] = BobRef(m, s)
        return memo[i], k

    return node(0)[0]


@pytest.mark.parametrize("name", [v["name"] for v in DATA["vectors"] if len(v["ram"]) <= 200])
def test_every_bit_flip_matches_the_reference_reading(name):
    """Every one-bit flip of every small vector (header and padding included): ram_decode
    and the bit-at-a-time reading agree, both refusing or both giving the same noun.  A
    flip that decodes is a valid encoding of another noun: ram carries no checksum."""
    data = ram_of(BY_NAME[name])
    for bit in range(8 * len(data)):
        b = bytearray(data)
        b[bit >> 3] ^= 1 << (bit & 7)
        try:
            want = _reference_decode(bytes(b))
        except CueError:
            with pytest.raises(CueError):
                ram_decode(bytes(b))
            continue
        assert same(ram_decode(bytes(b)), want), f"bit {bit}"


# ---------------------------------------------------------------------------
# hand-made streams: each limit vere's decoder has
# ---------------------------------------------------------------------------


class Bits:
    def __init__(self):
        self.value = self.width = 0

    def put(self, value: int, width: int) -> "Bits":
        self.value |= value << self.width
        self.width += width
        return self

    def mat(self, atom: int) -> "Bits":
        return self.put(*codec._mat(atom))

    def bytes(self) -> bytes:
        return RAM_HEADER + self.value.to_bytes((self.width + 7) >> 3, "little")


def test_header_and_version():
    assert ram_decode(Bits().put(0, 2).mat(5).bytes()) == 5
    assert not is_ram(b"RAM\x00") and not is_ram(b"RAM\x00\x02\x01")
    with pytest.raises(CueError, match="version 2"):
        ram_decode(b"RAM\x00\x02\x14")
    with pytest.raises(CueError, match="not a ram encoding"):
        ram_decode(b"\x02")
    with pytest.raises(CueError, match="tag expected at bit 0"):
        ram_decode(RAM_HEADER)


def test_width_limits():
    # a back-reference or bob field wider than 62 bits: vere refuses (ur_cue_meme)
    with pytest.raises(CueError, match="at most 62"):
        ram_decode(Bits().put(3, 2).mat(1 << 62).bytes())
    with pytest.raises(CueError, match="at most 62"):
        ram_decode(Bits().put(1, 2).mat(1 << 62).mat(1).bytes())
    # a bob id of 2^32 or more (vere would truncate it to 32 bits)
    with pytest.raises(CueError, match="below 2\\^32"):
        ram_decode(Bits().put(1, 2).mat(1 << 32).mat(1).bytes())
    # 64 zero bits before a length: vere refuses
    with pytest.raises(CueError, match="64 or more"):
        ram_decode(Bits().put(0, 2).put(0, 64).put(1, 1).put(0, 200).bytes())
    # a back-reference to the cell it is inside (not complete yet), and to nowhere
    with pytest.raises(CueError, match="back-reference at bit 2"):
        ram_decode(Bits().put(2, 2).put(3, 2).mat(0).put(0, 2).mat(1).bytes())
    with pytest.raises(CueError, match="to bit 1,"):
        ram_decode(Bits().put(2, 2).put(0, 2).mat(1).put(3, 2).mat(1).bytes())


def test_exact_refuses_what_follows_the_noun():
    data = ram_of(BY_NAME["[1 2 3]"])
    assert ram_decode(data + b"\x00", exact=False) == (1, (2, 3))
    with pytest.raises(CueError, match="goes on"):
        ram_decode(data + b"\x00", exact=True)
    end = int.from_bytes(data[5:], "little").bit_length()  # the noun's last bit is a 1
    assert end % 8, "this vector has padding bits in its last byte"
    padded = bytearray(data)
    padded[5 + (end >> 3)] |= 1 << (end & 7)  # set the first padding bit
    assert ram_decode(bytes(padded)) == (1, (2, 3))
    with pytest.raises(CueError, match="goes on"):
        ram_decode(bytes(padded), exact=True)


# ---------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------

atoms = st.one_of(st.integers(0, 20), st.integers(0, 2**70), st.integers(0, 2**600))
leaves = st.one_of(atoms, st.builds(BobRef, st.integers(1, 2**31 - 1), st.integers(1, 9)))


def _share(tree):
    """Nouns with repeated subtrees, so that back-references are written."""
    return st.one_of(tree, tree.map(lambda x: (x, x)), st.tuples(tree, tree).map(
        lambda p: (p, (p[1], p))))


nouns = st.recursive(leaves, lambda t: _share(st.tuples(t, t)), max_leaves=40)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nouns)
def test_round_trip(noun):
    data = ram_encode(noun)
    assert data[:5] == RAM_HEADER and data[-1] != 0
    assert same(ram_decode(data, exact=True), noun)
    assert ram_mug(noun) == ram_mug(ram_decode(data))


def test_deep_list_without_recursion():
    items = list(range(200_000))
    noun = codec.from_list(items)
    data = ram_encode(noun)
    assert codec.to_list(ram_decode(data, exact=True)) == items
