"""Urbit nouns in pure Python: jam/cue, mug, @da and @p.

A *noun* is either an *atom*, a non-negative Python ``int``, or a *cell*, a Python
2-tuple ``(head, tail)`` whose members are nouns.  Lists are right-nested and
null-terminated: the Hoon list ``~[1 2 3]`` is ``(1, (2, (3, 0)))``.

Everything here is pure (no I/O) and iterative: jam, cue, mug, equality and list
conversion never recurse in Python, so very deep nouns (a list of a million elements
is a noun a million levels deep) are fine.  Note that Python's own ``==`` and
``hash`` on deeply nested tuples *do* recurse; use :func:`noun_equal` to compare
nouns that may be deep.

The encodings follow ``reference-formats.md`` section 4 (jam/cue bit layout, mug) and
the Hoon standard library (``++mug``, ``++muk``, ``++ob``, ``++co``) bit for bit.
"""

from __future__ import annotations

import datetime as _dt
import struct
from typing import Callable, Iterable, TypeAlias, Union

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
    "DA_UNIX_EPOCH",
    "da_to_datetime",
    "datetime_to_da",
    "format_da",
    "parse_da",
    "PREFIXES",
    "SUFFIXES",
    "fein",
    "fynd",
    "patp",
    "parse_patp",
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
        # A noun is complete: attach it to the pending cells.
        while cell_pos:
            if cell_head[-1] is _MISSING:
                cell_head[-1] = node
                break
            node = (cell_head.pop(), node)
            memo[cell_pos.pop()] = node  # type: ignore[assignment]
        else:
            return node  # type: ignore[return-value]


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

    stack: list[tuple[Noun, bool]] = [(noun, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in memo:
            continue
        head, tail = node  # type: ignore[misc]
        if not children_done:
            stack.append((node, True))
            for child in (tail, head):
                if isinstance(child, tuple) and id(child) not in memo:
                    stack.append((child, False))
            continue
        memo[id(node)] = _mum(0xDEADBEEF, 0xFFFE, leaf(head) | (leaf(tail) << 32))
    return memo[id(noun)]


# ---------------------------------------------------------------------------
# @da
# ---------------------------------------------------------------------------

DA_UNIX_EPOCH = 0x8000000CCE9E0D80
"""The high 64 bits of the @da for the Unix epoch (1970-01-01T00:00:00Z)."""

_UNIX_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_FRAC_ONE = 1 << 64


def da_to_datetime(da: int) -> _dt.datetime:
    """An @da as an aware UTC datetime, with the fraction truncated to microseconds.

    ``ValueError`` if the date is outside ``datetime``'s range (years 1..9999).
    """
    _check_atom(da)
    seconds = (da >> 64) - DA_UNIX_EPOCH
    micros = ((da & (_FRAC_ONE - 1)) * 1_000_000) >> 64
    try:
        return _UNIX_EPOCH + _dt.timedelta(seconds=seconds, microseconds=micros)
    except OverflowError as exc:
        raise ValueError(f"@da {da:#x} is outside datetime's range") from exc


def datetime_to_da(when: _dt.datetime) -> int:
    """An aware datetime as an @da.

    The microseconds become the smallest 2^-64 fraction that reads back as the same
    microsecond, so ``da_to_datetime(datetime_to_da(t)) == t`` exactly.  Naive
    datetimes are rejected with ``ValueError``.
    """
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("datetime_to_da needs an aware datetime")
    delta = when - _UNIX_EPOCH
    seconds = delta.days * 86400 + delta.seconds
    fraction = -((-delta.microseconds << 64) // 1_000_000)  # ceiling division
    return ((seconds + DA_UNIX_EPOCH) << 64) | fraction


def format_da(da: int) -> str:
    """The Urbit text form of an @da, e.g. ``~2024.1.1..12.00.00..8000``.

    The time part is omitted at midnight with no fraction; the fraction is printed as
    dot-separated 16-bit hex words, most significant first, trailing zero words
    dropped.  Only years 1..9999 are supported.
    """
    _check_atom(da)
    fraction = da & (_FRAC_ONE - 1)
    try:
        when = _UNIX_EPOCH + _dt.timedelta(seconds=(da >> 64) - DA_UNIX_EPOCH)
    except OverflowError as exc:
        raise ValueError(f"@da {da:#x} is outside the supported years") from exc
    text = f"~{when.year}.{when.month}.{when.day}"
    if when.hour or when.minute or when.second or fraction:
        text += f"..{when.hour:02d}.{when.minute:02d}.{when.second:02d}"
    if fraction:
        words = [(fraction >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
        while words[-1] == 0:
            words.pop()
        text += ".." + ".".join(f"{w:04x}" for w in words)
    return text


def parse_da(text: str) -> int:
    """Parse the text form produced by :func:`format_da` (``~Y.M.D[..H.M.S[..ffff...]]``)."""
    if not text.startswith("~"):
        raise ValueError(f"@da must start with '~': {text!r}")
    parts = text[1:].split("..")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"malformed @da: {text!r}")
    try:
        year, month, day = (int(x) for x in parts[0].split("."))
        hour = minute = second = 0
        if len(parts) > 1:
            hour, minute, second = (int(x) for x in parts[1].split("."))
        fraction = 0
        if len(parts) > 2:
            words = parts[2].split(".")
            if not 1 <= len(words) <= 4 or any(len(w) != 4 for w in words):
                raise ValueError("fraction words must be 4 hex digits, at most 4 of them")
            for i, word in enumerate(words):
                fraction |= int(word, 16) << (48 - 16 * i)
        when = _dt.datetime(year, month, day, hour, minute, second, tzinfo=_dt.timezone.utc)
    except ValueError as exc:
        raise ValueError(f"malformed @da {text!r}: {exc}") from exc
    return datetime_to_da(when) | fraction


# ---------------------------------------------------------------------------
# @p (hoon.hoon ++ob and ++co, as in urbit-ob)
# ---------------------------------------------------------------------------


def _syllables(table: str) -> tuple[str, ...]:
    syls = tuple(table[i:i + 3] for i in range(0, len(table), 3))
    assert len(syls) == 256 and len(set(syls)) == 256
    return syls


PREFIXES = _syllables(
    "dozmarbinwansamlitsighidfidlissogdirwacsabwissib"
    "rigsoldopmodfoglidhopdardorlorhodfolrintogsilmir"
    "holpaslacrovlivdalsatlibtabhanticpidtorbolfosdot"
    "losdilforpilramtirwintadbicdifrocwidbisdasmidlop"
    "rilnardapmolsanlocnovsitnidtipsicropwitnatpanmin"
    "ritpodmottamtolsavposnapnopsomfinfonbanmorworsip"
    "ronnorbotwicsocwatdolmagpicdavbidbaltimtasmallig"
    "sivtagpadsaldivdactansidfabtarmonranniswolmispal"
    "lasdismaprabtobrollatlonnodnavfignomnibpagsopral"
    "bilhaddocridmocpacravripfaltodtiltinhapmicfanpat"
    "taclabmogsimsonpinlomrictapfirhasbosbatpochactid"
    "havsaplindibhosdabbitbarracparloddosbortochilmac"
    "tomdigfilfasmithobharmighinradmashalraglagfadtop"
    "mophabnilnosmilfopfamdatnoldinhatnacrisfotribhoc"
    "nimlarfitwalrapsarnalmoslandondanladdovrivbacpol"
    "laptalpitnambonrostonfodponsovnocsorlavmatmipfip"
)
"""The 256 @p prefix syllables (the high byte of each 16-bit word)."""

SUFFIXES = _syllables(
    "zodnecbudwessevpersutletfulpensytdurwepserwylsun"
    "rypsyxdyrnuphebpeglupdepdysputlughecryttyvsydnex"
    "lunmeplutseppesdelsulpedtemledtulmetwenbynhexfeb"
    "pyldulhetmevruttylwydtepbesdexsefwycburderneppur"
    "rysrebdennutsubpetrulsynregtydsupsemwynrecmegnet"
    "secmulnymtevwebsummutnyxrextebfushepbenmuswyxsym"
    "selrucdecwexsyrwetdylmynmesdetbetbeltuxtugmyrpel"
    "syptermebsetdutdegtexsurfeltudnuxruxrenwytnubmed"
    "lytdusnebrumtynseglyxpunresredfunrevrefmectedrus"
    "bexlebduxrynnumpyxrygryxfeptyrtustyclegnemfermer"
    "tenlusnussyltecmexpubrymtucfyllepdebbermughuttun"
    "bylsudpemdevlurdefbusbeprunmelpexdytbyttyplevmyl"
    "wedducfurfexnulluclennerlexrupnedlecrydlydfenwel"
    "nydhusrelrudneshesfetdesretdunlernyrsebhulryllud"
    "remlysfynwerrycsugnysnyllyndyndemluxfedsedbecmun"
    "lyrtesmudnytbyrsenwegfyrmurtelreptegpecnelnevfes"
)
"""The 256 @p suffix syllables (the low byte of each 16-bit word)."""

_PREFIX_INDEX = {s: i for i, s in enumerate(PREFIXES)}
_SUFFIX_INDEX = {s: i for i, s in enumerate(SUFFIXES)}

# Seeds of the Feistel round function (hoon.hoon ++raku:ob).
_RAKU = (0xB76D5EED, 0xEE281300, 0x85BCAE01, 0x4B387AF7)

Prf: TypeAlias = Callable[[int, int], int]


def _eff(j: int, r: int) -> int:
    """The round function ``F_j(r)`` (``++eff:ob``): murmur3 of 2 bytes of ``r``."""
    return muk(_RAKU[j], 2, r)


def _fe(r: int, a: int, b: int, prf: Prf, m: int) -> int:
    """One pass of the generalised Feistel cipher (Black & Rogaway 2002, "fe").

    As in hoon.hoon, for an even number of rounds the halves are recombined as
    ``a * left + right``, except when ``right == a`` (urbit/arvo#1105: a legacy
    bug made some inputs collide; the fix keeps every other output unchanged).
    """
    left, right = m % a, m // a
    for j in range(1, r + 1):
        tmp = (left + prf(j - 1, right)) % (a if j % 2 else b)
        left, right = right, tmp
    if r % 2 or right == a:
        return a * right + left
    return a * left + right


def _fen(r: int, a: int, b: int, prf: Prf, m: int) -> int:
    """Inverse of :func:`_fe` (B&R's "fe^-1", with the same legacy adjustment)."""
    ahh, ale = (m // a, m % a) if r % 2 else (m % a, m // a)
    left, right = (ahh, ale) if ale == a else (ale, ahh)
    for j in range(r, 0, -1):
        mod = a if j % 2 else b
        tmp = (right + mod - prf(j - 1, left) % mod) % mod
        left, right = tmp, left
    return a * right + left


def _fee(r: int, a: int, b: int, k: int, prf: Prf, m: int) -> int:
    """B&R's "Fe": a permutation of ``[0, k)`` by cycle-walking :func:`_fe`."""
    c = _fe(r, a, b, prf, m)
    return c if c < k else _fe(r, a, b, prf, c)


def _feen(r: int, a: int, b: int, k: int, prf: Prf, m: int) -> int:
    """Inverse of :func:`_fee`."""
    c = _fen(r, a, b, prf, m)
    return c if c < k else _fen(r, a, b, prf, c)


def _feis(m: int) -> int:
    """``++feis:ob``: the 4-round cipher on ``[0, 0xffff * 0x10000)``."""
    return _fee(4, 0xFFFF, 0x10000, 0xFFFF * 0x10000, _eff, m)


def _tail(m: int) -> int:
    """``++tail:ob``: inverse of :func:`_feis`."""
    return _feen(4, 0xFFFF, 0x10000, 0xFFFF * 0x10000, _eff, m)


def _scramble(cipher: Callable[[int], int], n: int) -> int:
    """Apply ``cipher`` to the planet part of ``n`` (shared by fein and fynd)."""
    if 0x10000 <= n <= 0xFFFFFFFF:
        return 0x10000 + cipher(n - 0x10000)
    if 0x100000000 <= n <= 0xFFFFFFFFFFFFFFFF:
        return (n & 0xFFFFFFFF00000000) | _scramble(cipher, n & 0xFFFFFFFF)
    return n


def fein(n: int) -> int:
    """Conceal the structure of a ship number (``++fein:ob``): permutes planets, and
    the low 32 bits of moons; galaxies, stars and comets are unchanged."""
    _check_atom(n)
    return _scramble(_feis, n)


def fynd(n: int) -> int:
    """Inverse of :func:`fein` (``++fynd:ob``)."""
    _check_atom(n)
    return _scramble(_tail, n)


def patp(n: int) -> str:
    """The @p text of a ship number: ``patp(0) == "~zod"``, ``patp(256) == "~marzod"``.

    Works for any atom (galaxies, stars, planets, moons, comets and beyond); 16-bit
    words are joined by ``-``, and every fourth word boundary by ``--``.
    """
    sxz = fein(n)
    if sxz < 0x100:
        return "~" + SUFFIXES[sxz]
    words: list[str] = []
    i = 0
    while sxz:
        word = sxz & 0xFFFF
        if i:
            words.append("--" if i % 4 == 0 else "-")
        words.append(PREFIXES[word >> 8] + SUFFIXES[word & 0xFF])
        sxz >>= 16
        i += 1
    return "~" + "".join(reversed(words))


def parse_patp(text: str) -> int:
    """The ship number of an @p (inverse of :func:`patp`).

    Only the canonical form is accepted (as :func:`patp` renders it); anything else
    raises ``ValueError``.
    """
    if not isinstance(text, str) or not text.startswith("~"):
        raise ValueError(f"@p must start with '~': {text!r}")
    body = text[1:].replace("-", "")
    if not body or len(body) % 3:
        raise ValueError(f"malformed @p: {text!r}")
    syls = [body[i:i + 3] for i in range(0, len(body), 3)]
    try:
        if len(syls) == 1:
            value = _SUFFIX_INDEX[syls[0]]
        elif len(syls) % 2:
            raise ValueError("odd number of syllables")
        else:
            value = 0
            for i in range(0, len(syls), 2):
                value = (value << 16) | (_PREFIX_INDEX[syls[i]] << 8) | _SUFFIX_INDEX[syls[i + 1]]
    except (KeyError, ValueError) as exc:
        raise ValueError(f"malformed @p {text!r}: {exc}") from exc
    n = fynd(value)
    if patp(n) != text:
        raise ValueError(f"non-canonical @p {text!r} (canonical: {patp(n)})")
    return n


# ---------------------------------------------------------------------------
# prefix decoding (for readers that only want an event's head)
# ---------------------------------------------------------------------------

_PEEK_MAX_ATOM_BITS = 1 << 16  # a date, a knot or a tag is far smaller than this
_PEEK_MAX_NODES = 4096  # wire nodes decoded at most


class _Peek:
    """Just enough of :func:`cue` to decode the first few nouns of a jam, on demand."""

    __slots__ = ("buf", "total", "memo", "budget")

    def __init__(self, buf: bytes):
        self.buf, self.total, self.memo, self.budget = buf, len(buf) * 8, {}, _PEEK_MAX_NODES

    def bits(self, pos: int, width: int) -> int:
        if pos + width > self.total:
            raise CueError("truncated")
        chunk = int.from_bytes(self.buf[pos >> 3:(pos + width + 7) >> 3], "little")
        return (chunk >> (pos & 7)) & ((1 << width) - 1)

    def mat(self, pos: int) -> tuple[int, int]:
        if self.bits(pos, 1):
            return 0, pos + 1
        window = self.bits(pos, min(64, self.total - pos))  # c zeros, then a 1
        if not window:
            raise CueError("mat length prefix too long or past the end")
        c = (window & -window).bit_length() - 1
        if c > 32:
            raise CueError("atom too large to peek")
        b = (1 << (c - 1)) | self.bits(pos + c + 1, c - 1) if c > 1 else 1
        if b > _PEEK_MAX_ATOM_BITS:
            raise CueError("atom too large to peek")
        return self.bits(pos + 2 * c, b), pos + 2 * c + b

    def tag(self, pos: int) -> int:
        """0 atom, 1 cell, 2 back-reference."""
        first = self.bits(pos, 1)
        return 0 if not first else (2 if self.bits(pos + 1, 1) else 1)

    def noun(self, pos: int) -> tuple[Noun, int]:
        """Decode a whole (small) noun at ``pos``: ``(noun, next position)``."""
        self.budget -= 1
        if self.budget < 0:
            raise CueError("noun too large to peek")
        kind = self.tag(pos)
        if kind == 0:
            value, nxt = self.mat(pos + 1)
        elif kind == 2:
            ref, nxt = self.mat(pos + 2)
            if ref not in self.memo:
                raise CueError("back-reference to an unknown position")
            value = self.memo[ref]
        else:
            head, mid = self.noun(pos + 2)
            tail, nxt = self.noun(mid)
            value = (head, tail)
        self.memo[pos] = value
        return value, nxt


def peek_event(data: bytes | bytearray | memoryview
               ) -> tuple[int | None, str | None, str | None]:
    """``(date, wire, tag)`` of a jammed ``[date [wire [tag data]]]`` event, decoding only
    the head of the noun: the data (which may be megabytes) is never cued.

    ``date`` is the @da atom (see :func:`da_to_datetime`), ``wire`` the path rendered as
    ``/a/b/c`` and ``tag`` the card's tag as text.  Anything that does not have that shape
    (lifecycle events, a date outside years 1..9999, a wire that is not a list of text
    knots, a tag that is not text, bad jam) gives ``(None, None, None)``.
    """
    p = _Peek(bytes(data[:1 << 20]) if len(data) > 1 << 20 else bytes(data))
    try:
        if p.tag(0) != 1:
            return None, None, None
        date, pos = p.noun(2)
        if not is_atom(date):
            return None, None, None
        seconds = (date >> 64) - DA_UNIX_EPOCH
        if not -62135596800 <= seconds <= 253402300799:  # years 1..9999
            return None, None, None
        if p.tag(pos) != 1:  # ovum
            return None, None, None
        p.memo[pos] = _MISSING  # a cell still being decoded: never a valid reference
        wire, pos = p.noun(pos + 2)
        knots: list[str] = []
        while is_cell(wire):
            knot, wire = wire
            if not is_atom(knot):
                return None, None, None
            knots.append(uncord(knot))
        if wire != 0:
            return None, None, None
        if p.tag(pos) != 1:  # card
            return None, None, None
        tag, _ = p.noun(pos + 2)
        if not is_atom(tag):
            return None, None, None
        return date, "/" + "/".join(knots), uncord(tag)
    except (CueError, UnicodeDecodeError, ValueError, RecursionError):
        return None, None, None
