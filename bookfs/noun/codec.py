"""Urbit nouns in pure Python: building and reading them, jam/cue and mug.

A *noun* is either an *atom*, a non-negative Python ``int``, or a *cell*, a Python
2-tuple ``(head, tail)`` whose members are nouns.  Lists are right-nested and
null-terminated: the Hoon list ``~[1 2 3]`` is ``(1, (2, (3, 0)))``.

Everything here is pure (no I/O) and iterative: jam, cue, mug, equality and list
conversion never recurse in Python, so very deep nouns (a list of a million elements
is a noun a million levels deep) are fine.  Note that Python's own ``==`` and
``hash`` on deeply nested tuples *do* recurse; use :func:`noun_equal` to compare
nouns that may be deep.

The encodings follow ``reference-formats.md`` section 4 (jam/cue bit layout, mug) and
the Hoon standard library (``++mug``, ``++muk``) bit for bit.  The auras bookfs reads
(@da, @p) are :mod:`bookfs.noun.aura`; an event's head read without cueing the event is
:mod:`bookfs.noun.peek`.

This module is the reference implementation of the codec: a compiled core (issue 21)
is to be checked against it, as :func:`murmur3_32_fast` is against :func:`murmur3_32`.
Callers take the codec from :mod:`bookfs.noun`, which is where such a core would be
chosen.
"""

from __future__ import annotations

import struct
from typing import Iterable, Iterator, TypeAlias, Union

__all__ = [
    "Noun",
    "Cell",
    "CueError",
    "cell",
    "from_list",
    "to_list",
    "cord",
    "uncord",
    "tape",
    "untape",
    "path",
    "unpath",
    "is_atom",
    "is_cell",
    "noun_equal",
    "jam",
    "cue",
    "murmur3_32",
    "murmur3_32_fast",
    "muk",
    "mug",
]

Noun: TypeAlias = Union[int, tuple["Noun", "Noun"]]
Cell: TypeAlias = tuple[Noun, Noun]

_MISSING = object()


# ---------------------------------------------------------------------------
# Construction and inspection
# ---------------------------------------------------------------------------


def is_atom(noun: Noun) -> bool:
    """True if ``noun`` is an atom (a non-negative int)."""
    return isinstance(noun, int) and noun >= 0


def is_cell(noun: Noun) -> bool:
    """True if ``noun`` is a cell (a 2-tuple)."""
    return isinstance(noun, tuple)


def cell(*items: Noun) -> Noun:
    """Build a right-nested cell: ``cell(1, 2, 3) == (1, (2, 3))`` (Hoon ``[1 2 3]``).

    At least two items are required.
    """
    if len(items) < 2:
        raise ValueError("cell() needs at least two items")
    out = items[-1]
    for item in reversed(items[:-1]):
        out = (item, out)
    return out


def from_list(items: Iterable[Noun]) -> Noun:
    """Build a null-terminated list: ``from_list([1, 2]) == (1, (2, 0))``."""
    out: Noun = 0
    for item in reversed(list(items)):
        out = (item, out)
    return out


def to_list(noun: Noun) -> list[Noun]:
    """The elements of a null-terminated list noun; ``ValueError`` if it is not one."""
    out: list[Noun] = []
    while isinstance(noun, tuple):
        out.append(noun[0])
        noun = noun[1]
    if noun != 0:
        raise ValueError(f"not a null-terminated list (ends in atom {noun})")
    return out


def _atom_bytes(atom: int) -> bytes:
    """``atom`` as little-endian bytes without trailing zeros (``b''`` for 0)."""
    return atom.to_bytes((atom.bit_length() + 7) >> 3, "little")


def cord(text: str) -> int:
    """A cord: the atom whose little-endian bytes are ``text`` in UTF-8."""
    return int.from_bytes(text.encode("utf-8"), "little")


def uncord(atom: int) -> str:
    """The text of a cord (inverse of :func:`cord`); ``UnicodeDecodeError`` if not UTF-8."""
    return _atom_bytes(atom).decode("utf-8")


def tape(text: str) -> Noun:
    """A tape: a list of the UTF-8 bytes of ``text``, one atom per byte."""
    return from_list(text.encode("utf-8"))


def untape(noun: Noun) -> str:
    """The text of a tape (inverse of :func:`tape`)."""
    items = to_list(noun)
    if not all(isinstance(b, int) and b < 256 for b in items):
        raise ValueError("not a tape: elements must be bytes")
    return bytes(items).decode("utf-8")  # type: ignore[arg-type]


def path(text: str) -> Noun:
    """A path (list of knots) from its text form: ``path("/d/term/1")``."""
    if not text.startswith("/"):
        raise ValueError(f"path must start with '/': {text!r}")
    parts = [p for p in text.split("/")[1:] if p]
    return from_list(cord(p) for p in parts)


def unpath(noun: Noun) -> str:
    """The text form of a path noun: ``unpath(path("/d/term/1")) == "/d/term/1"``."""
    knots = to_list(noun)
    if not all(isinstance(k, int) for k in knots):
        raise ValueError("not a path: elements must be atoms")
    return "/" + "/".join(uncord(k) for k in knots)  # type: ignore[arg-type]


def noun_equal(a: Noun, b: Noun) -> bool:
    """Structural equality of two nouns, without recursion (safe for deep nouns).

    Each pair of cell objects is compared once, so nouns with shared subnouns (as
    :func:`cue` produces for back-references) compare in time linear in their
    object count rather than their (possibly exponential) tree size.
    """
    stack = [(a, b)]
    visited: set[tuple[int, int]] = set()
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        x_cell = isinstance(x, tuple)
        if x_cell != isinstance(y, tuple):
            return False
        if not x_cell:
            if x != y:
                return False
            continue
        pair = (id(x), id(y))
        if pair in visited:
            continue
        visited.add(pair)
        stack.append((x[1], y[1]))  # type: ignore[index]
        stack.append((x[0], y[0]))  # type: ignore[index]
    return True


def _check_atom(noun: object) -> None:
    if not isinstance(noun, int):
        raise TypeError(f"not a noun: {type(noun).__name__}")
    if noun < 0:
        raise ValueError(f"atoms must be non-negative, got {noun}")


# ---------------------------------------------------------------------------
# jam
# ---------------------------------------------------------------------------


def _canonical_cells(noun: Noun) -> dict[int, int]:
    """Give every cell of ``noun`` a key shared exactly by the cells equal to it.

    Returns a map from ``id(cell)`` to a negative int key.  Cells are hash-consed
    children first: a cell's key is determined by its head's and tail's keys, where
    an atom's key is the atom itself (non-negative, so never confused with a cell
    key).  Each distinct Python object is visited once, so nouns with shared
    subnouns (DAGs, possibly exponentially large as trees) cost their object count.
    """
    keys: dict[int, int] = {}  # id(cell) -> key; 0 while the cell is in progress
    if type(noun) is not tuple:
        return keys
    interned: dict[tuple[int, int], int] = {}
    # Depth-first, children before parents; each entry is (cell, children_done).
    stack: list[tuple[Cell, bool]] = [(noun, False)]  # type: ignore[list-item]
    pop, push = stack.pop, stack.append
    while stack:
        node, children_done = pop()
        if not children_done:
            if id(node) in keys:
                continue
            if len(node) != 2:
                raise TypeError(f"cells must be 2-tuples, got a {len(node)}-tuple")
            keys[id(node)] = 0
            push((node, True))
            for child in node:
                if type(child) is tuple:
                    if id(child) not in keys:
                        push((child, False))
                else:
                    _check_atom(child)
            continue
        head, tail = node
        pair = (
            keys[id(head)] if type(head) is tuple else head,
            keys[id(tail)] if type(tail) is tuple else tail,
        )
        key = interned.get(pair)
        if key is None:
            key = interned[pair] = -1 - len(interned)
        keys[id(node)] = key
    return keys


def _mat(atom: int) -> tuple[int, int]:
    """``mat(atom)`` as (bits, bit width): for ``atom > 0``, with ``b = met0(atom)`` and
    ``c = met0(b)``: ``c`` zero bits, a one bit, the low ``c - 1`` bits of ``b``, then
    the ``b`` bits of ``atom``; ``mat(0)`` is the single bit 1."""
    if atom == 0:
        return 1, 1
    b = atom.bit_length()
    c = b.bit_length()
    return (1 << c) | ((b & ((1 << (c - 1)) - 1)) << (c + 1)) | (atom << (2 * c)), 2 * c + b


_FLUSH_BITS = 512  # flush whole bytes once the accumulator holds this many bits


def jam(noun: Noun) -> bytes:
    """Serialise a noun (``++jam``), returning the jam atom's little-endian bytes.

    Repeated cells (equal by value) are always written as back-references; a repeated
    atom is written as a reference only when it is wider in bits than the reference
    position.  ``jam(0) == b'\\x02'``.
    """
    if type(noun) is not tuple:
        _check_atom(noun)
    cell_keys = _canonical_cells(noun)
    seen: dict[int, int] = {}  # atom value or cell key -> bit position first written
    # Output: whole bytes go to ``out``; the last < _FLUSH_BITS bits wait in ``acc``,
    # so appending costs O(field width), never O(output size).
    out = bytearray()
    acc = nbits = pos = 0
    stack: list[Noun] = [noun]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        if type(node) is tuple:
            key = cell_keys[id(node)]
            where = seen.get(key)
            if where is None:
                seen[key] = pos
                push(node[1])
                push(node[0])
                bits, width = 1, 2  # tag bits 1, 0
            else:
                bits, width = _mat(where)
                bits, width = 3 | (bits << 2), width + 2  # tag bits 1, 1
        else:
            where = seen.get(node)
            if where is not None and node.bit_length() > where.bit_length():
                bits, width = _mat(where)
                bits, width = 3 | (bits << 2), width + 2
            else:
                if where is None:
                    seen[node] = pos
                bits, width = _mat(node)
                bits, width = bits << 1, width + 1  # tag bit 0
        acc |= bits << nbits
        nbits += width
        pos += width
        if nbits >= _FLUSH_BITS:
            nbytes = nbits >> 3
            out += (acc & ((1 << (nbytes << 3)) - 1)).to_bytes(nbytes, "little")
            acc >>= nbytes << 3
            nbits &= 7
    out += acc.to_bytes((nbits + 7) >> 3, "little")
    return bytes(out)  # the last bit written is always a 1: no trailing zero bytes


# ---------------------------------------------------------------------------
# cue
# ---------------------------------------------------------------------------


class CueError(ValueError):
    """Raised by :func:`cue` for input that is not a valid jam."""


def cue(data: bytes | bytearray | memoryview) -> Noun:
    """Deserialise jam bytes into a noun (``++cue``).

    Raises :class:`CueError` for empty input, input that ends before the noun does, a
    mat length prefix that runs past the end, or a back-reference to a position where
    no noun started.  Bits after the end of the noun are ignored.
    """
    buf = bytes(data)
    if not buf:
        raise CueError("cannot cue empty input")
    total = len(buf) * 8
    from_bytes = int.from_bytes
    memo: dict[int, Noun] = {}
    # Pending cells: parallel stacks of the cell's tag position and its head (or
    # _MISSING while the head is still being decoded).
    cell_pos: list[int] = []
    cell_head: list[object] = []

    def read(pos: int, width: int) -> int:
        start = pos >> 3
        chunk = from_bytes(buf[start:(pos + width + 7) >> 3], "little")
        return (chunk >> (pos & 7)) & ((1 << width) - 1)

    def rub(pos: int, win: int, win_bits: int) -> tuple[int, int]:
        """Decode ``mat`` at bit ``pos``; ``win`` holds ``win_bits`` bits from ``pos``."""
        if win & 1:
            return 0, pos + 1
        low = win & ((1 << win_bits) - 1)
        if low == 0:
            raise CueError(f"mat length prefix at bit {pos} runs past the end of the input")
        c = (low & -low).bit_length() - 1
        start = pos + 2 * c
        if 2 * c <= win_bits:
            b = (1 << (c - 1)) | ((win >> (c + 1)) & ((1 << (c - 1)) - 1))
        elif start > total:
            raise CueError(f"mat length at bit {pos} runs past the end of the input")
        else:  # a length field wider than the window: atoms of 2^31 bits or more
            b = (1 << (c - 1)) | read(pos + c + 1, c - 1)
        end = start + b
        if end > total:
            raise CueError(
                f"mat at bit {pos} claims {b} bits, past the end of the input ({total} bits)"
            )
        if 2 * c + b <= win_bits:
            return (win >> (2 * c)) & ((1 << b) - 1), end
        return read(start, b), end

    pos = 0
    while True:
        if pos >= total:
            raise CueError(f"truncated input: noun expected at bit {pos}, input has {total} bits")
        start = pos >> 3
        shift = pos & 7
        win = from_bytes(buf[start:start + 9], "little") >> shift
        win_bits = 72 - shift
        if not win & 1:
            value, nxt = rub(pos + 1, win >> 1, win_bits - 1)
            memo[pos] = value
            node: object = value
            pos = nxt
        elif not win & 2:
            cell_pos.append(pos)
            cell_head.append(_MISSING)
            pos += 2
            continue
        else:
            ref, nxt = rub(pos + 2, win >> 2, win_bits - 2)
            node = memo.get(ref, _MISSING)
            if node is _MISSING:
                raise CueError(f"back-reference at bit {pos} to unknown position {ref}")
            pos = nxt
        node = _attach(node, cell_pos, cell_head, memo)
        if node is not _MISSING:
            return node  # type: ignore[return-value]


def _attach(node: object, cell_pos: list[int], cell_head: list[object],
            memo: dict[int, object]) -> object:
    """A node is complete: it becomes the head of the innermost pending cell, or its
    tail, which completes that cell (and maybe the cells around it; each one completed
    goes into ``memo`` under its tag position, from ``cell_pos``).  ``cell_head`` holds
    each pending cell's head, or ``_MISSING`` while it is still being decoded.  Returns
    ``_MISSING`` while a cell is pending, else the whole noun.  Shared by :func:`cue` and
    :func:`bookfs.noun.ram.ram_decode`."""
    while cell_pos:
        if cell_head[-1] is _MISSING:
            cell_head[-1] = node
            return _MISSING
        node = (cell_head.pop(), node)
        memo[cell_pos.pop()] = node
    return node


# ---------------------------------------------------------------------------
# murmur3 and mug
# ---------------------------------------------------------------------------

_M32 = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int) -> int:
    """MurmurHash3_x86_32 of ``data`` with ``seed`` (pure Python)."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & _M32
    n = len(data)
    body = n & ~3
    for (k,) in struct.iter_unpack("<I", data[:body]):
        k = (k * c1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= (k * c2) & _M32
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    if n & 3:
        k = (int.from_bytes(data[body:], "little") * c1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= (k * c2) & _M32
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


try:  # the C MurmurHash3 (same function, ~100x faster); the pure version is the oracle
    from mmh3 import hash as _mmh3_hash
except ImportError:  # pragma: no cover - mmh3 is a dependency
    _mmh3_hash = None


def murmur3_32_fast(data: bytes, seed: int) -> int:
    """:func:`murmur3_32` computed by ``mmh3`` when it is installed (tests compare the
    two), else by the pure-Python version."""
    if _mmh3_hash is None:  # pragma: no cover
        return murmur3_32(data, seed)
    return _mmh3_hash(data, seed & _M32, signed=False)


def muk(seed: int, length: int, key: int) -> int:
    """Hoon ``++muk``: murmur3 of the low ``length`` bytes of ``key`` (LE)."""
    if key.bit_length() > 8 * length:
        raise ValueError(f"key does not fit in {length} bytes")
    return murmur3_32(key.to_bytes(length, "little"), seed)


def _mum(seed: int, fallback: int, key: int) -> int:
    """Hoon ``++mum`` inside ``++mug``: 31-bit murmur3, retrying with seed+1 on 0."""
    data = _atom_bytes(key)
    for i in range(8):
        h = murmur3_32_fast(data, seed + i)
        ham = (h >> 31) ^ (h & 0x7FFFFFFF)
        if ham:
            return ham
    return fallback


def mug(noun: Noun) -> int:
    """The 31-bit hash of a noun (Hoon ``++mug``), always in ``1 .. 0x7fffffff``.

    Atom: murmur3 of its LE bytes, seed ``0xcafebabe`` (fallback ``0x7fff``).  Cell:
    murmur3 of ``mug(head)`` as 4 LE bytes then ``mug(tail)`` as minimal LE bytes,
    i.e. of the atom ``(cat 5 mug-head mug-tail)``, seed ``0xdeadbeef`` (fallback
    ``0xfffe``, as in hoon.hoon and vere; reference-formats.md says ``0x7fff`` for
    both, which only matters in the astronomically rare all-zero case).  Checked
    against the vectors of urbit's ``tests/sys/hoon/hashes.hoon``.
    """
    if not isinstance(noun, tuple):
        _check_atom(noun)
        return _mum(0xCAFEBABE, 0x7FFF, noun)
    memo: dict[int, int] = {}  # id(cell) -> mug

    def leaf(x: Noun) -> int:
        return memo[id(x)] if isinstance(x, tuple) else _mum(0xCAFEBABE, 0x7FFF, x)

    for node in _cells_children_first(noun, memo):
        head, tail = node
        memo[id(node)] = _mum(0xDEADBEEF, 0xFFFE, leaf(head) | (leaf(tail) << 32))
    return memo[id(noun)]


def _cells_children_first(noun: Cell, done: dict[int, int],
                          exact_tuples: bool = False) -> Iterator[Cell]:
    """Walk the cells of the cell ``noun`` without recursion, each distinct cell object
    once, yielding each after its head's and tail's cells.  ``done`` holds the ids of
    the cells handled: the caller enters each cell yielded before the walk goes on.  A
    child is a cell when it is a tuple (``exact_tuples``: a tuple and not a subclass of
    one).  Shared by :func:`mug` and :func:`bookfs.noun.ram.ram_mug`."""
    stack: list[tuple[Noun, bool]] = [(noun, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in done:
            continue
        head, tail = node  # type: ignore[misc]
        if not children_done:
            stack.append((node, True))
            for child in (tail, head):
                if (type(child) is tuple if exact_tuples else isinstance(child, tuple)) \
                        and id(child) not in done:
                    stack.append((child, False))
            continue
        yield node  # type: ignore[misc]
