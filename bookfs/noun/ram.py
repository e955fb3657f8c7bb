"""vere's second event encoding, *ram*, in pure Python: detect, decode, encode.

vere's branch ``ml/bob`` (urbit/vere PR #985; ``pkg/noun/serial.c`` at commit 125ac225,
``u3s_ram_xeno`` and ``u3s_tap_xeno``) writes an event's payload as
``[4-byte mug]["RAM\\0"][0x01][ram bits]`` instead of ``[mug][jam]``.  The ram bits are
jam's with a fixed 2-bit tag, read least significant bit first:

======  =====================================================================
``00``  atom: ``mat(value)`` follows
``01``  bob: ``mat(mug)`` then ``mat(seq)``, a reference to the atom stored in the
        file ``.urb/bob/<mug>/<seq>`` (decimal names) beside the log
``10``  cell: head, then tail
``11``  back-reference: ``mat(bit position)`` of an earlier atom, bob or cell,
        counted from the first bit after the 5-byte header
======  =====================================================================

``mat`` is jam's length-prefixed atom (:func:`bookfs.noun.codec._mat`).  The byte
layout, with a vector worked by hand, is in ``docs/format.md`` ("The ram encoding"); golden vectors made by vere's
own code are ``tests/vectors/ram/vectors.json``.

A bob atom decodes to the file's bytes as a little-endian atom when ``bob_dir`` (the
``.urb/bob`` directory) holds its file, and to a :class:`BobRef` when it does not: never
to a wrong atom.  A file whose content does not hash to the mug in its name raises
:class:`BobError`.

The decoder is stricter than vere's ``u3s_tap_xeno`` in three ways, all for input vere's
encoder never writes: an atom whose bits run past the end of the input is an error (vere
reads the missing bits as zeros); a bob's mug or seq of 2^32 or more is an error (vere
truncates it to 32 bits); and with ``exact=True``, bytes after the noun are an error
(vere ignores them).  Note also that vere, when ``u3s_tap_xeno`` refuses a payload,
falls back to ``cue``, which reads ``"RAM\\0..."`` as the atom 0 (``0x52`` starts with
the two bits of jam's atom 0) and ignores the rest: a corrupt ram event would replay as
``0``.  bookfs treats the header as binding and reports the error.
"""

from __future__ import annotations

import mmap
import os
from typing import Union

from bookfs.noun.codec import _MISSING, CueError, _attach, _cells_children_first, _mat, _mum

__all__ = [
    "RAM_MAGIC",
    "RAM_VERSION",
    "RAM_HEADER",
    "BobRef",
    "BobError",
    "RamNoun",
    "is_ram",
    "ram_decode",
    "ram_encode",
    "ram_mug",
    "bob_file_mug",
    "bob_path",
    "check_bob_file",
]

RAM_MAGIC = b"RAM\x00"  #: U3S_RAM_MAGIC
RAM_VERSION = 0x01  #: U3S_RAM_VERSION
RAM_HEADER = RAM_MAGIC + bytes([RAM_VERSION])  #: the 5 bytes every ram encoding starts with

# U3S_RAM_TAG_*: the 2-bit tag's value, its first bit being the least significant
TAG_ATOM, TAG_BOB, TAG_CELL, TAG_BACK = 0, 1, 2, 3

_U32 = 1 << 32


class BobRef:
    """A bob atom whose file was not read: the atom stored in ``.urb/bob/<mug>/<seq>``.

    Two references are equal when their mug and seq are (vere's own rule for two bob
    atoms).  ``str()`` says plainly what it is, for ``show`` and ``pretty/``.
    """

    __slots__ = ("mug", "seq")

    def __init__(self, mug: int, seq: int) -> None:
        self.mug = mug
        self.seq = seq

    def path(self, bob_dir: str | os.PathLike[str]) -> str:
        """Where the file would be, under the ``.urb/bob`` directory ``bob_dir``."""
        return bob_path(bob_dir, self.mug, self.seq)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BobRef) and (self.mug, self.seq) == (other.mug, other.seq)

    def __hash__(self) -> int:
        return hash(("BobRef", self.mug, self.seq))

    def __repr__(self) -> str:
        return f"BobRef(mug={self.mug}, seq={self.seq})"

    def __str__(self) -> str:
        return (f"<bob atom stored outside the log in .urb/bob/{self.mug}/{self.seq}; "
                f"that file is not present>")


#: what :func:`ram_decode` returns: a noun whose atoms may be :class:`BobRef`\\ s
RamNoun = Union[int, BobRef, tuple["RamNoun", "RamNoun"]]


class BobError(CueError):
    """A bob file is present but cannot be the atom the event refers to (unreadable,
    empty, or its content's mug is not the one in its name)."""


def bob_path(bob_dir: str | os.PathLike[str], mug: int, seq: int) -> str:
    """``<bob_dir>/<mug>/<seq>``, the names in decimal (vere's ``u3_blob_path``)."""
    return os.path.join(os.fspath(bob_dir), str(mug), str(seq))


def bob_file_mug(data: bytes | memoryview) -> int:
    """The mug vere names a bob file by (``_blob_mug`` in ``pkg/vere/blob.c``).

    Up to 4 GiB it is ``u3r_mug_bytes``: murmur3 of *all* the file's bytes, trailing
    zeros included, seed ``0xcafebabe`` (retrying with the next seed while the 31-bit
    fold is 0, else ``0x7fff``).  That equals the atom's :func:`~bookfs.noun.mug`
    unless the file ends in zero bytes.  Past 4 GiB the first 2^32-1 bytes' mug is
    mixed with the high length bits and the last window's mug, as vere does (not
    exercised by the tests).
    """
    from bookfs.noun import murmur3_buffer

    mv = memoryview(data)
    n = len(mv)

    def mug_bytes(chunk: memoryview) -> int:
        for i in range(8):
            h = murmur3_buffer(chunk, 0xCAFEBABE + i)
            ham = (h >> 31) ^ (h & 0x7FFFFFFF)
            if ham:
                return ham
        return 0x7FFF

    win = min(n, 0xFFFFFFFF)
    m = mug_bytes(mv[:win])
    high = n >> 32
    if high:  # u3r_mug_both(a, b) is the mug of the cell of two mugs
        m = _mum(0xDEADBEEF, 0xFFFE, m | (high << 32))
        off = n - 0xFFFFFFFF
        m = _mum(0xDEADBEEF, 0xFFFE, m | (mug_bytes(mv[off:]) << 32))
    return m


def is_ram(payload_after_mug: bytes | bytearray | memoryview) -> bool:
    """True if an event payload (after its 4-byte mug) is in the ram encoding, i.e.
    starts with ``"RAM\\0"`` and version 1.

    This never mistakes a jam for ram: a jam whose first byte is ``0x52`` (``'R'``)
    encodes the atom 0 in its first two bits and has bytes after it, which jam never
    writes.
    """
    return len(payload_after_mug) >= 5 and bytes(payload_after_mug[:5]) == RAM_HEADER


# ---------------------------------------------------------------------------
# decode (u3s_tap_xeno)
# ---------------------------------------------------------------------------


def ram_decode(data: bytes | bytearray | memoryview, bob_dir: str | os.PathLike[str] | None
               = None, *, exact: bool = False) -> RamNoun:
    """Decode a ram encoding (header included, the event's mug not) into a noun.

    Atoms are ints and cells 2-tuples, as in :mod:`bookfs.noun.codec`.  A bob atom is
    read from ``bob_dir``/``<mug>``/``<seq>`` when ``bob_dir`` (the ``.urb/bob``
    directory) is given and the file exists; otherwise it decodes to a
    :class:`BobRef`.  A present file that is unreadable, empty, or whose content's
    mug (:func:`bob_file_mug`) is not its name's raises :class:`BobError`.

    Raises :class:`~bookfs.noun.codec.CueError` naming the bit offset (counted from
    the first bit after the header, the origin back-references use; the message also
    gives the byte, counted from the ``R`` of the header) for: a missing or wrong header, input that ends before the
    noun does (including an atom whose bits run past the end), a length prefix wider
    than vere reads, a back-reference to a position where no atom, bob or completed
    cell started, or a bob mug or seq that is not a 32-bit number.  Bits after the
    noun are ignored, as vere ignores them, unless ``exact``: then no byte may follow
    the one holding the noun's last bit, and that byte's unused bits must be zero
    (what vere's encoder writes).
    """
    buf = bytes(data)
    if len(buf) < 5 or buf[:4] != RAM_MAGIC:
        raise CueError(f"not a ram encoding: it does not start with {RAM_MAGIC!r}")
    if buf[4] != RAM_VERSION:
        raise CueError(f"ram version {buf[4]} at byte 4: only version {RAM_VERSION} exists")
    body = memoryview(buf)[5:]
    total = len(body) * 8
    from_bytes = int.from_bytes

    def where(pos: int) -> str:
        return f"bit {pos} (byte {5 + (pos >> 3)} of the ram encoding)"

    def read(pos: int, width: int) -> int:
        return (from_bytes(body[pos >> 3:(pos + width + 7) >> 3], "little") >> (pos & 7)) \
            & ((1 << width) - 1)

    def window(pos: int) -> tuple[int, int]:
        """Up to 72 bits from ``pos`` and how many of them are input (not past the end)."""
        shift = pos & 7
        return (from_bytes(body[pos >> 3:(pos >> 3) + 9], "little") >> shift,
                min(72 - shift, total - pos))

    def rub(pos: int, what: str, limit: int | None = None, win: int = -1,
            win_bits: int = 0) -> tuple[int, int]:
        """``mat`` at ``pos`` -> (value, next position); ``limit``: most value bits.
        ``win``/``win_bits``: the input's bits from ``pos``, if the caller has them."""
        if win < 0:
            win, win_bits = window(pos)
        # c: the zero bits before the first 1 (ur_bsr_log); vere refuses c >= 64
        low = win & 0xFFFFFFFFFFFFFFFF
        if not low:
            if win_bits >= 64:
                raise CueError(f"ram: the length of the {what} at {where(pos)} has 64 or "
                               "more leading zeros (vere reads at most 63)")
            raise CueError(f"ram: the length of the {what} at {where(pos)} runs past "
                           f"the end of the input ({total} bits)")
        c = (low & -low).bit_length() - 1
        if c == 0:
            return 0, pos + 1
        if c == 1:
            b = 1
        elif 2 * c <= win_bits:
            b = (1 << (c - 1)) | ((win >> (c + 1)) & ((1 << (c - 1)) - 1))
        elif pos + 2 * c > total:
            raise CueError(f"ram: the length of the {what} at {where(pos)} runs past "
                           f"the end of the input ({total} bits)")
        else:
            b = (1 << (c - 1)) | read(pos + c + 1, c - 1)
        if limit is not None and b > limit:
            raise CueError(f"ram: the {what} at {where(pos)} is {b} bits wide; vere reads "
                           f"at most {limit}")
        end = pos + 2 * c + b
        if end > total:
            raise CueError(f"ram: the {what} at {where(pos)} claims {b} bits, past the end "
                           f"of the input ({total} bits)")
        if 2 * c + b <= win_bits:
            return (win >> (2 * c)) & ((1 << b) - 1), end
        return read(pos + 2 * c, b), end

    bobs: dict[tuple[int, int], RamNoun] = {}

    def bob(mug: int, seq: int) -> RamNoun:
        got = bobs.get((mug, seq))
        if got is None:
            got = bobs[(mug, seq)] = _load_bob(bob_dir, mug, seq)
        return got

    memo: dict[int, RamNoun] = {}
    cell_pos: list[int] = []
    cell_head: list[object] = []
    pos = 0
    while True:
        if pos + 2 > total:
            raise CueError(f"ram: truncated input: a tag expected at {where(pos)}, the "
                           f"input has {total} bits")
        win, win_bits = window(pos)
        tag = win & 3
        if tag == TAG_CELL:
            cell_pos.append(pos)
            cell_head.append(_MISSING)
            pos += 2
            continue
        if tag == TAG_ATOM:
            value, nxt = rub(pos + 2, "atom", None, win >> 2, win_bits - 2)
            node: object = value
            memo[pos] = value
        elif tag == TAG_BACK:
            ref, nxt = rub(pos + 2, "back-reference", 62, win >> 2, win_bits - 2)
            node = memo.get(ref, _MISSING)
            if node is _MISSING:
                raise CueError(f"ram: back-reference at {where(pos)} to bit {ref}, where no "
                               "atom, bob or completed cell starts")
        else:  # TAG_BOB
            mug, p = rub(pos + 2, "bob mug", 62, win >> 2, win_bits - 2)
            seq, nxt = rub(p, "bob seq", 62)
            if mug >= _U32 or seq >= _U32:
                raise CueError(f"ram: bob at {where(pos)} has mug {mug} and seq {seq}; "
                               "both must be below 2^32")
            node = bob(mug, seq)
            memo[pos] = node  # type: ignore[assignment]
        pos = nxt
        node = _attach(node, cell_pos, cell_head, memo)  # type: ignore[arg-type]
        if node is not _MISSING:
            break
    if exact:
        end_byte = (pos + 7) >> 3
        if len(body) > end_byte or (pos & 7 and read(pos, 8 - (pos & 7))):
            raise CueError(f"ram: the noun ends at {where(pos)} but the input goes on to "
                           f"bit {total}")
    return node  # type: ignore[return-value]


def check_bob_file(bob_dir, mug: int, seq: int) -> bool:
    """Whether the bob file of ``mug`` and ``seq`` is present under ``bob_dir``: True if it
    is and holds the atom (not empty, its content's :func:`bob_file_mug` is ``mug``), False
    if there is no such file.  Raises :class:`BobError` for a present file that is not the
    atom, or cannot be read.  The file is mapped, never read into memory, so a check costs
    no memory whatever its size (the compiled core hashes the mapping in place)."""
    path = bob_path(bob_dir, mug, seq)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise BobError(f"bob file {path} cannot be read: {e}") from e
    try:
        size = os.fstat(fd).st_size
        got = None
        if size:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
                got = bob_file_mug(mapped)
    except OSError as e:
        raise BobError(f"bob file {path} cannot be read: {e}") from e
    finally:
        os.close(fd)
    if got is None:
        raise BobError(f"bob file {path} is empty (vere never writes an empty bob)")
    if got != mug:
        raise BobError(f"bob file {path}: its content's mug is {got}, not the {mug} in its "
                       "name: it is not the atom the event refers to")
    return True


def _load_bob(bob_dir, mug: int, seq: int) -> RamNoun:
    """The bob atom, materialised when its file is present (and checked), else its
    :class:`BobRef`."""
    if bob_dir is None or not check_bob_file(bob_dir, mug, seq):
        return BobRef(mug, seq)
    path = bob_path(bob_dir, mug, seq)
    try:
        with open(path, "rb") as f:
            return int.from_bytes(f.read(), "little")
    except OSError as e:
        raise BobError(f"bob file {path} cannot be read: {e}") from e


# ---------------------------------------------------------------------------
# encode (u3s_ram_xeno)
# ---------------------------------------------------------------------------


def _leaf_key(leaf: object) -> object:
    """The key vere's hash table files a leaf under: an atom by its value, a bob by its
    (mug, seq)."""
    if type(leaf) is BobRef:
        return ("bob", leaf.mug, leaf.seq)
    if not isinstance(leaf, int) or leaf < 0:
        raise TypeError(f"not a noun: {leaf!r}")
    return leaf


def _cell_keys(noun: object) -> dict[int, object]:
    """Map ``id(cell)`` to a key shared exactly by equal cells (children first), like
    :func:`bookfs.noun.codec._canonical_cells` but with :class:`BobRef` leaves."""
    keys: dict[int, object] = {}
    if type(noun) is not tuple:
        return keys
    interned: dict[tuple, int] = {}
    stack: list[tuple[tuple, bool]] = [(noun, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            if id(node) in keys:
                continue
            if len(node) != 2:
                raise TypeError(f"cells must be 2-tuples, got a {len(node)}-tuple")
            keys[id(node)] = None
            stack.append((node, True))
            for child in node:
                if type(child) is tuple and id(child) not in keys:
                    stack.append((child, False))
            continue
        pair = tuple(keys[id(c)] if type(c) is tuple else ("leaf", _leaf_key(c))
                     for c in node)
        key = interned.get(pair)
        if key is None:
            key = interned[pair] = len(interned)
        keys[id(node)] = ("cell", key)
    return keys


def ram_encode(noun: RamNoun, bob_dir: str | os.PathLike[str] | None = None) -> bytes:
    """Encode a noun as vere's ``u3s_ram_xeno`` does, header included.

    Byte for byte vere's output (the golden vectors test it): nouns are walked head
    first; a repeated cell is always a back-reference; a repeated atom is one only when
    it is wider in bits than the position it refers to, as in jam.  :class:`BobRef`
    leaves are written as bobs.  Two vere rules need a bob's file, which is read from
    ``bob_dir`` when given and present: a repeated bob is a back-reference when its
    content is wider than the position (without the file a bob counts as wider than
    any position, true of every real bob, which is over 32 MiB); and a bob whose
    content equals an *earlier* atom (same mug, same value) is written as a
    back-reference to that atom, while an atom never refers back to an equal bob.
    Cells holding bobs are equal only when their bobs are the same (mug, seq).
    """
    bob_values: dict[tuple[int, int], int] = {}
    if bob_dir is not None:
        stack = [noun]
        seen: set[int] = set()
        while stack:
            x = stack.pop()
            if type(x) is tuple:
                if id(x) not in seen:
                    seen.add(id(x))
                    stack.extend(x)
            elif type(x) is BobRef and (x.mug, x.seq) not in bob_values:
                got = _load_bob(bob_dir, x.mug, x.seq)
                if type(got) is int:
                    bob_values[(x.mug, x.seq)] = got
    cell_keys = _cell_keys(noun)
    seen_at: dict[object, int] = {}  # leaf or cell key -> bit position first written
    out = bytearray(RAM_HEADER)
    acc = nbits = pos = 0
    stack = [noun]
    while stack:
        node = stack.pop()
        if type(node) is tuple:
            key = cell_keys[id(node)]
            at = seen_at.get(key)
            if at is None:
                seen_at[key] = pos
                stack.append(node[1])
                stack.append(node[0])
                bits, width = TAG_CELL, 2
            else:
                bits, width = _mat(at)
                bits, width = TAG_BACK | (bits << 2), width + 2
        else:
            key = ("leaf", _leaf_key(node))
            at = seen_at.get(key)
            if type(node) is BobRef:
                value = bob_values.get((node.mug, node.seq))
                met = value.bit_length() if value is not None else None
                # vere finds an earlier *atom* equal to a bob's content (same mug,
                # equal bytes), though an atom never finds an earlier equal bob
                if at is None and value is not None \
                        and _mum(0xCAFEBABE, 0x7FFF, value) == node.mug:
                    at = seen_at.get(("leaf", value))
            else:
                met = node.bit_length()
            if at is not None and (met is None or met > at.bit_length()):
                bits, width = _mat(at)
                bits, width = TAG_BACK | (bits << 2), width + 2
            else:
                if at is None:
                    seen_at[key] = pos
                if type(node) is BobRef:
                    mb, mw = _mat(node.mug)
                    sb, sw = _mat(node.seq)
                    bits, width = TAG_BOB | (mb << 2) | (sb << (2 + mw)), 2 + mw + sw
                else:
                    bits, width = _mat(node)
                    bits, width = TAG_ATOM | (bits << 2), width + 2
        acc |= bits << nbits
        nbits += width
        pos += width
        if nbits >= 512:
            nbytes = nbits >> 3
            out += (acc & ((1 << (nbytes << 3)) - 1)).to_bytes(nbytes, "little")
            acc >>= nbytes << 3
            nbits &= 7
    out += acc.to_bytes((nbits + 7) >> 3, "little")
    return bytes(out)


# ---------------------------------------------------------------------------
# mug
# ---------------------------------------------------------------------------


def ram_mug(noun: RamNoun) -> int:
    """``u3r_mug`` of a noun that may hold :class:`BobRef`\\ s: a bob's mug is the one
    in its reference (vere stores it on the bob atom), so the mug needs no bob file.
    Equal to :func:`bookfs.noun.mug` of the materialised noun whenever every bob file
    is free of trailing zero bytes (see :func:`bob_file_mug`)."""

    def leaf(x: object) -> int:
        if type(x) is BobRef:
            return x.mug
        if not isinstance(x, int) or x < 0:
            raise TypeError(f"not a noun: {x!r}")
        return _mum(0xCAFEBABE, 0x7FFF, x)

    if type(noun) is not tuple:
        return leaf(noun)
    memo: dict[int, int] = {}
    for node in _cells_children_first(noun, memo, exact_tuples=True):  # type: ignore[arg-type]
        head, tail = node
        h = memo[id(head)] if type(head) is tuple else leaf(head)
        t = memo[id(tail)] if type(tail) is tuple else leaf(tail)
        memo[id(node)] = _mum(0xDEADBEEF, 0xFFFE, h | (t << 32))
    return memo[id(noun)]
