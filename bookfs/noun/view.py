"""The views the renderer (:mod:`bookfs.noun.render`) reads a noun through: :class:`View` is
what it asks of a noun (is a node a cell, its head, its tail, its atom).

* :class:`NounView`: a Python noun (ints and 2-tuples, :mod:`bookfs.noun`), e.g. what
  :func:`~bookfs.noun.cue` returned;
* :class:`JamView`: a jam read **in place**, lazily: only the nodes the renderer shows are
  decoded, atoms wider than :data:`CORD_MAX_BYTES` are never built (only their first and
  last hex digits are read, a :class:`BigAtom`), and subtrees the renderer elides are
  skipped by walking the bit stream (at most :data:`SKIP_NODES` nodes, then the rest is
  ``...``).  Its bytes come from a ``pread(offset, size)`` callable in small blocks, so
  rendering a 100 MB event with the default :class:`~bookfs.noun.render.Limits` costs
  bounded time and memory.

For the same noun and limits both views render the same text (a property test checks it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bookfs.noun.codec import CueError, Noun


class Budget(Protocol):
    """The CPU budget a skip walk looks at (``render.py``'s :class:`~bookfs.noun.render.Budget`,
    declared here so that this module, which ``render.py`` imports, imports nothing back)."""

    def check(self) -> None:
        """Raise the renderer's ``OutOfTime`` once the CPU time is spent."""


CORD_MAX_BYTES = 4096  # atoms up to this wide are checked for text; wider ones never are
HEX_EDGE = 8  # hex digits shown at each end of an abbreviated atom
SKIP_NODES = 100_000  # nodes a JamView walks to skip elided parts before giving up
CPU_CHECK_EVERY = 256  # a JamView's skip walk looks at the clock once per this many nodes
BLOCK = 1 << 16  # JamView reads its source in blocks of this size ...
BLOCKS = 16  # ... and keeps this many


class Exhausted(Exception):
    """A :class:`JamView` used up its skip budget: what follows is not known."""


@dataclass(frozen=True)
class BigAtom:
    """An atom wider than :data:`CORD_MAX_BYTES`, as a :class:`JamView` returns it: its
    width and the hex digits at both ends, never the value."""

    bits: int
    head: str  # the most significant HEX_EDGE hex digits
    tail: str  # the least significant HEX_EDGE hex digits, zero-padded

    @property
    def nbytes(self) -> int:
        return (self.bits + 7) >> 3


class View(Protocol):
    """What the renderer asks of a noun; a node is whatever the view hands out."""

    def is_cell(self, node) -> bool: ...

    def head(self, node): ...

    def tail(self, node): ...

    def atom(self, node) -> int | BigAtom: ...


class NounView:
    """A Python noun: nodes are the nouns themselves."""

    def is_cell(self, node: Noun) -> bool:
        return isinstance(node, tuple)

    def head(self, node):
        return node[0]

    def tail(self, node):
        return node[1]

    def atom(self, node: int) -> int:
        return node


class JamView:
    """A jam read in place (see the module docstring).  Nodes are bit positions where a
    cell or atom is written (back-references are followed).  ``root`` is position 0.

    ``pread(offset, size)`` returns up to ``size`` bytes of the jam from ``offset``;
    ``size`` is the jam's length in bytes.  Memory: :data:`BLOCKS` blocks of
    :data:`BLOCK` bytes, plus a few words per node visited (at most the renderer's node
    budget and :data:`SKIP_NODES`).  Malformed input raises :class:`CueError`;
    a back-reference must point to an earlier position where a noun was seen to start.
    """

    root = 0

    def __init__(self, size: int, pread: Callable[[int, int], bytes],
                 skip_nodes: int = SKIP_NODES, budget: Budget | None = None):
        if size <= 0:
            raise CueError("cannot read an empty jam")
        self.budget = budget  # CPU time: the skip walk looks at it (render sets it too)
        self.total = size * 8
        self._size = size
        self._pread = pread
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._skip = skip_nodes
        self._starts: set[int] = {0}
        self._tail_raw: dict[int, int] = {}  # cell position -> raw position of its tail
        self._ends: dict[int, int] = {}  # cell position -> end of its encoding

    @classmethod
    def of_bytes(cls, data: bytes | memoryview, **kw) -> "JamView":
        view = memoryview(data)
        return cls(len(view), lambda off, n: bytes(view[off:off + n]), **kw)

    # bits

    def _bytes(self, start: int, end: int) -> bytes:
        first, last = start // BLOCK, (end - 1) // BLOCK
        if last - first > 2:  # a wide read (an atom's edge never is): no caching
            return self._pread(start, end - start)
        parts = []
        for b in range(first, last + 1):
            block = self._blocks.get(b)
            if block is None:
                block = self._pread(b * BLOCK, BLOCK)
                self._blocks[b] = block
                if len(self._blocks) > BLOCKS:
                    self._blocks.popitem(last=False)
            else:
                self._blocks.move_to_end(b)
            parts.append(block)
        joined = b"".join(parts) if len(parts) > 1 else parts[0]
        return joined[start - first * BLOCK:end - first * BLOCK]

    def _bits(self, pos: int, width: int) -> int:
        if width == 0:
            return 0
        if pos + width > self.total:
            raise CueError(f"jam ends inside a noun (bit {pos + width} of {self.total})")
        chunk = int.from_bytes(self._bytes(pos >> 3, (pos + width + 7) >> 3), "little")
        return (chunk >> (pos & 7)) & ((1 << width) - 1)

    def _kind(self, pos: int) -> int:
        """0 atom, 1 cell, 2 back-reference."""
        bits = self._bits(pos, min(2, self.total - pos))
        return 0 if not bits & 1 else (2 if bits & 2 else 1)

    def _mat(self, pos: int) -> tuple[int, int, int]:
        """``(start, width, end)`` of the mat-encoded atom at ``pos`` (value not read)."""
        if pos >= self.total:
            raise CueError(f"jam ends before bit {pos}")
        window = self._bits(pos, min(64, self.total - pos))
        if window & 1:
            return pos + 1, 0, pos + 1
        if not window:
            raise CueError(f"mat length prefix at bit {pos} runs past the end")
        c = (window & -window).bit_length() - 1
        b = (1 << (c - 1)) | self._bits(pos + c + 1, c - 1)
        start = pos + 2 * c
        if start + b > self.total:
            raise CueError(f"mat at bit {pos} claims {b} bits, past the end")
        return start, b, start + b

    def _resolve(self, raw: int) -> int:
        """The position of the noun written (or referred to) at ``raw``.  As in ``cue``, a
        back-reference names a position where an atom or a cell is written, never another
        back-reference: one hop (a chain of them was followed hop by hop, for minutes)."""
        self._starts.add(raw)
        if self._kind(raw) == 2:
            start, width, _ = self._mat(raw + 2)
            target = self._bits(start, width)
            if target >= raw or target not in self._starts or self._kind(target) == 2:
                raise CueError(f"back-reference at bit {raw} to unknown position {target}")
            raw = target
        return raw

    def _leaf_end(self, raw: int, kind: int) -> int:
        return self._mat(raw + (1 if kind == 0 else 2))[2]

    def _walk(self, raw: int) -> int:
        """End of the encoding at ``raw`` found by walking it (spends the skip budget)."""
        pos, need = raw, 1
        budget = self.budget
        while need:
            self._skip -= 1
            if self._skip < 0:
                raise Exhausted
            if budget is not None and not self._skip % CPU_CHECK_EVERY:
                budget.check()
            self._starts.add(pos)
            kind = self._kind(pos)
            if kind == 1:
                pos += 2
                need += 1
            else:
                pos = self._leaf_end(pos, kind)
                need -= 1
        return pos

    def _end(self, raw: int) -> int:
        """End of the encoding at ``raw``: known tails are followed, the rest walked."""
        chain = []
        pos = raw
        while True:
            kind = self._kind(pos)
            if kind != 1:
                end = self._leaf_end(pos, kind)
                break
            if pos in self._ends:
                end = self._ends[pos]
                break
            nxt = self._tail_raw.get(pos)
            if nxt is None:
                end = self._walk(pos)
                break
            chain.append(pos)
            pos = nxt
        for cell in chain:
            self._ends[cell] = end
        return end

    # the View interface

    def is_cell(self, node: int) -> bool:
        return self._kind(node) == 1

    def head(self, node: int) -> int:
        return self._resolve(node + 2)

    def tail(self, node: int) -> int:
        raw = self._tail_raw.get(node)
        if raw is None:
            raw = self._tail_raw[node] = self._end(node + 2)
        return self._resolve(raw)

    def atom(self, node: int) -> int | BigAtom:
        start, width, _ = self._mat(node + 1)
        if width <= 8 * CORD_MAX_BYTES:
            return self._bits(start, width)
        digits = (width + 3) >> 2
        cut = 4 * (digits - HEX_EDGE)
        head = self._bits(start + cut, width - cut)
        return BigAtom(width, f"{head:x}", f"{self._bits(start, 4 * HEX_EDGE):0{HEX_EDGE}x}")
