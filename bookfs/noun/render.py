"""Nouns as a person reads them: the dojo's notation, as far as it goes without types.

The renderer reads a noun through a view (:mod:`bookfs.noun.view`):
:class:`~bookfs.noun.view.NounView` for a Python noun, :class:`~bookfs.noun.view.JamView`
for a jam read in place and lazily, so rendering a 100 MB event with the default
:class:`Limits` costs bounded time and memory.  For the same noun and limits both views
render the same text (a property test checks it).

Notation (what :func:`render` writes):

* a cell is ``[a b c]``, right-nested cells flattened; a list's terminating 0 is ``~``;
* a list of two or more knots (``a-z 0-9 - ~ . _``) ending in ``~`` is a path ``/d/term/1``;
  a list of two or more bytes that are printable UTF-8 is a tape ``"text"``, and so is the
  end of a flattened cell (``[%txt "ls"]``, which is ``[%txt 108 115 ~]``);
* an atom is, in this order: an ``@p`` when it is one of the ``ships`` the context names
  (the log's own ship, ships in the wire; at least a planet, so ``0`` never turns into
  ``~zod``); an ``@da`` such as ``~2024.1.5..12.00.00..8000`` when it is 128 bits wide and
  falls in years 1970..2200; a term ``%belt`` (``[a-z][a-z0-9-]*``) or a cord ``'Text'``
  when its bytes are printable UTF-8 of at least :data:`MIN_TEXT` characters (ASCII if
  shorter than :data:`ASCII_BELOW`); decimal with
  dots (``1.234``) below 2^32; hex with dots (``0x1f90.7f00.0001``) above.
* With limits (the default), cells nested deeper than ``depth`` and list elements after
  ``width`` are ``...``, text is cut after ``text`` characters (``'abc'...``), atoms wider
  than ``atom_bytes`` show their ends and size (``0x1234abcd...89abcdef (4.1 MiB)``), and
  rendering stops after ``nodes`` nodes or ``chars`` characters (so its size is bounded).
  Every rendering is bounded in time too: a :class:`Budget` of CPU seconds
  (:data:`RENDER_CPU`, :data:`FULL_RENDER_CPU` without limits); past it the rest is ``...``
  and the budget says where the rendering stopped (:meth:`Budget.said`), which
  ``bookfs show`` and ``pretty/N`` print as a final ``stopped:`` line.
  Without limits (``--full``) everything is shown,
  up to :data:`FULL_MAX_NODES` nodes (a noun that shares subtrees can be exponentially
  large as a tree).

These are heuristics: the noun carries no types.  ``render(..., as_json=True)`` is the
exact machine form: a cell is a JSON array of its flattened elements (the last one an
atom), an atom a number below 2^53 and a ``"0x..."`` string above; an elided part is the
string ``"..."`` and an abbreviated atom ``{"bytes": N, "hex_head": ..., "hex_tail": ...}``.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bookfs.noun.aura import DA_UNIX_EPOCH, format_da, patp
from bookfs.noun.view import CORD_MAX_BYTES, HEX_EDGE, BigAtom, Exhausted, JamView, View

MAX_DEPTH = 8  # cells nested deeper than this are shown as ...
MAX_WIDTH = 16  # elements shown of one [a b c ...]
MAX_NODES = 2000  # nodes rendered in all
MAX_TEXT = 80  # characters shown of a cord or tape
MAX_ATOM_BYTES = 32  # wider atoms (not text) are shown as 0xhead...tail (size)
MAX_CHARS = 64 << 10  # rendering stops (...) once it has written this many characters
MIN_TEXT = 3  # shorter byte strings are numbers, not terms or cords
ASCII_BELOW = 16  # shorter cords must be ASCII (a 32-bit number is often valid UTF-8)
DECIMAL_BELOW = 1 << 32  # atoms below are decimal, the rest hex
SHIP_MIN = 1 << 16  # only planets and above are recognised as ships from context
DATE_YEARS = (1970, 2200)  # 128-bit atoms whose seconds fall in these years are @da
FULL_MAX_NODES = 10_000_000  # even --full stops here (shared subtrees multiply)
RENDER_CPU = 1.0  # seconds of CPU one abbreviated rendering may spend (pretty/N, show)
FULL_RENDER_CPU = 10.0  # ... and one rendering without limits (show --full)
JSON_SAFE = 1 << 53  # JSON numbers above this lose precision in most readers

_TERM = re.compile(r"[a-z][a-z0-9-]*")
_KNOT = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-~._")
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


@dataclass(frozen=True)
class Limits:
    """How much of a noun :func:`render` shows (see the module docstring)."""

    depth: int = MAX_DEPTH
    width: int = MAX_WIDTH
    nodes: int = MAX_NODES
    text: int = MAX_TEXT
    atom_bytes: int = MAX_ATOM_BYTES
    chars: int = MAX_CHARS


DEFAULT = Limits()


class OutOfTime(Exception):
    """A rendering used up its :class:`Budget` of CPU time."""


class Budget:
    """The CPU time one rendering may spend (this thread's own CPU time, from creation)
    and, once it has stopped early, where: ``seconds`` None is no time limit.

    :func:`render` counts the nodes it renders here and records why it stopped when a
    limit cut the rendering short (CPU time, its node or character budget);
    :meth:`said` is the ``stopped:`` line for the reader (None if nothing stopped it)."""

    def __init__(self, seconds: float | None = RENDER_CPU):
        self.seconds = seconds
        self.start = time.thread_time()
        self.nodes = 0  # nodes rendered
        self.why: str | None = None  # the limit that stopped the rendering
        self.at: int | None = None  # the jam's bit where it stopped (a JamView's)

    def spent(self) -> float:
        return time.thread_time() - self.start

    def check(self) -> None:
        """:class:`OutOfTime` once the CPU time is spent."""
        if self.seconds is not None and self.spent() > self.seconds:
            raise OutOfTime

    def stop(self, why: str, at=None) -> None:
        if self.why is None:
            self.why = why
            self.at = at if isinstance(at, int) and not isinstance(at, bool) else None

    def said(self) -> str | None:
        """``stopped: ...``: which limit cut the rendering, after how many nodes, where."""
        if self.why is None:
            return None
        where = f" (at bit {self.at:,} of the jam)" if self.at is not None else ""
        nodes = f"{self.nodes:,} node" + ("" if self.nodes == 1 else "s")
        return (f"stopped: {self.why} after {nodes}{where}; "
                "what follows is shown as ...")


def human_size(n: int) -> str:
    """``n`` bytes in binary units: ``97 B``, ``4.1 MiB``, ``1.2 GiB``."""
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{value:.1f} {_UNITS[unit]}"


def human_bytes(n: int) -> str:
    """A size as ``info`` shows it: ``1.2 GiB (1,234,567,890 bytes)``."""
    return f"{human_size(n)} ({n:,} bytes)" if n >= 1024 else f"{n} bytes"


def da_plausible(atom: int) -> bool:
    """True if ``atom`` reads as an @da of years :data:`DATE_YEARS` (128 bits wide)."""
    if atom.bit_length() != 128:
        return False
    seconds = (atom >> 64) - DA_UNIX_EPOCH
    low = _dt.datetime(DATE_YEARS[0], 1, 1, tzinfo=_dt.timezone.utc).timestamp()
    high = _dt.datetime(DATE_YEARS[1], 1, 1, tzinfo=_dt.timezone.utc).timestamp()
    return low <= seconds < high


def knot_text(atom: int | BigAtom) -> str | None:
    """The text of an atom that is a knot (``a-z 0-9 - ~ . _``, not empty), else None."""
    if not isinstance(atom, int) or not atom or atom.bit_length() > 8 * CORD_MAX_BYTES:
        return None
    raw = atom.to_bytes((atom.bit_length() + 7) >> 3, "little")
    return raw.decode("ascii") if _KNOT.issuperset(raw) else None


def _text(atom: int) -> str | None:
    """The text of an atom whose bytes are printable UTF-8 (no control characters)."""
    if atom.bit_length() > 8 * CORD_MAX_BYTES:
        return None
    try:
        s = atom.to_bytes((atom.bit_length() + 7) >> 3, "little").decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not s.isprintable() or (len(s) < ASCII_BELOW and not s.isascii()):
        return None
    return s


def _quote(s: str, mark: str, limit: int | None) -> str:
    cut = limit is not None and len(s) > limit
    if cut:
        s = s[:limit]
    s = s.replace("\\", "\\\\").replace(mark, "\\" + mark)
    return f"{mark}{s}{mark}" + ("..." if cut else "")


def _dots(digits: str, group: int) -> str:
    head = len(digits) % group or group
    return ".".join([digits[:head]] + [digits[i:i + group]
                                       for i in range(head, len(digits), group)])


def _edges(atom: int) -> BigAtom:
    digits = (atom.bit_length() + 3) >> 2
    head = atom >> (4 * max(0, digits - HEX_EDGE))
    return BigAtom(atom.bit_length(), f"{head:x}", f"{atom & ((1 << 4 * HEX_EDGE) - 1):0{HEX_EDGE}x}")


def atom_text(atom: int | BigAtom, limits: Limits | None = DEFAULT,
              ships: frozenset[int] = frozenset()) -> str:
    """One atom in the notation of the module docstring (a ram event's bob atom whose
    file is not present, a :class:`~bookfs.noun.ram.BobRef`, says so)."""
    if not isinstance(atom, (int, BigAtom)):
        return str(atom)
    if isinstance(atom, BigAtom) or atom.bit_length() > 8 * CORD_MAX_BYTES:
        if limits is None and not isinstance(atom, BigAtom):
            return "0x" + _dots(f"{atom:x}", 4)
        big = atom if isinstance(atom, BigAtom) else _edges(atom)
        return f"0x{big.head}...{big.tail} ({human_size(big.nbytes)})"
    if atom >= SHIP_MIN and atom in ships:
        return patp(atom)
    if da_plausible(atom):
        return format_da(atom)
    if atom >= 1 << 8 * (MIN_TEXT - 1):
        text = _text(atom)
        if text is not None:
            if _TERM.fullmatch(text) and (limits is None or len(text) <= limits.text):
                return "%" + text
            return _quote(text, "'", limits and limits.text)
    if atom < DECIMAL_BELOW:
        return _dots(str(atom), 3)
    if limits is not None and atom.bit_length() > 8 * limits.atom_bytes:
        big = _edges(atom)
        return f"0x{big.head}...{big.tail} ({human_size(big.nbytes)})"
    return "0x" + _dots(f"{atom:x}", 4)


def atom_json(atom: int | BigAtom, limits: Limits | None = DEFAULT) -> str:
    """One atom in the JSON form of the module docstring (a missing bob atom:
    ``{"bob": [mug, seq], "present": false}``)."""
    if not isinstance(atom, (int, BigAtom)):
        return json.dumps({"bob": [atom.mug, atom.seq], "present": False})
    if isinstance(atom, int) and (limits is None or atom.bit_length() <= 8 * CORD_MAX_BYTES):
        return str(atom) if atom < JSON_SAFE else f'"0x{atom:x}"'
    big = atom if isinstance(atom, BigAtom) else _edges(atom)
    return json.dumps({"bytes": big.nbytes, "hex_head": big.head, "hex_tail": big.tail})


# --- the renderer --------------------------------------------------------------------------

_NODE, _TERMINAL, _SEP, _TEXT, _ELIDED, _WORD = range(6)


def _chain(view: View, node, limit: int | None) -> tuple[list, object, bool]:
    """``(elements, terminal, complete)`` of the flattened cell ``node``: at most ``limit``
    elements; ``terminal`` is the final atom when the chain ended within them."""
    elements = []
    try:
        while view.is_cell(node):
            if limit is not None and len(elements) >= limit:
                return elements, None, False
            elements.append(view.head(node))
            node = view.tail(node)
    except Exhausted:
        return elements, None, False
    return elements, node, True


def _special(view: View, elements: list, terminal, complete: bool,
             limits: Limits | None) -> str | None:
    """A path or tape rendering of a chain, or None."""
    if len(elements) < 2 or any(view.is_cell(e) for e in elements):
        return None
    if complete and view.atom(terminal) != 0:
        return None
    atoms = [view.atom(e) for e in elements]
    if complete:
        knots = [knot_text(a) for a in atoms]
        if all(k is not None and (limits is None or len(k) <= limits.text) for k in knots):
            return "/" + "/".join(knots)  # type: ignore[arg-type]
    if all(isinstance(a, int) and a < 256 for a in atoms):
        raw = bytes(atoms)  # type: ignore[arg-type]
        text = None
        for trim in range(1 if complete else 4):  # a cut list may end inside a character
            try:
                text = raw[:len(raw) - trim].decode("utf-8")
                break
            except UnicodeDecodeError:
                continue
        if not text:
            return None
        if not text.isprintable():
            return None
        out = _quote(text, '"', limits and limits.text)
        return out if complete or out.endswith("...") else out + "..."
    return None


def _byte(atom: int | BigAtom) -> bool:
    return isinstance(atom, int) and atom < 256


def render(view: View, node, limits: Limits | None = DEFAULT,
           ships: Iterable[int] = (), as_json: bool = False,
           cpu: Budget | None = None) -> Iterator[str]:
    """The text of ``node`` (module docstring), in pieces.  Iterative: any depth is fine.

    A :class:`CueError` from a :class:`JamView` (malformed jam) propagates; running out of
    the view's skip budget shows the rest as ``...``.  ``cpu``: the time budget (default:
    :data:`RENDER_CPU`, :data:`FULL_RENDER_CPU` without limits); past it the rest is
    ``...`` and ``cpu`` records where the rendering stopped.
    """
    if cpu is None:
        cpu = Budget(RENDER_CPU if limits is not None else FULL_RENDER_CPU)
    jam = isinstance(view, JamView)
    if jam and view.budget is None:
        view.budget = cpu

    def at(item: tuple) -> int | None:  # the jam's bit a node is written at
        return item[1] if jam and item[0] in (_NODE, _TERMINAL) else None

    ships = frozenset(ships)
    nodes = FULL_MAX_NODES if limits is None else limits.nodes
    budget = nodes
    chars = None if limits is None else limits.chars
    take = None if limits is None else max(limits.width, limits.text if not as_json else 0)
    sep = ", " if as_json else " "
    elided = '"..."' if as_json else "..."
    stack: list[tuple] = [(_NODE, node, 0)]
    pending = last_elided = False
    used = 0
    while stack:
        out: list[str] = []
        item = stack.pop()
        kind = item[0]
        if kind == _SEP:
            pending = True
            continue
        if kind == _TEXT:
            pending = last_elided = False
            yield item[1]
            continue
        if budget > 0 and chars is not None and used >= chars:
            budget = 0
            cpu.stop(f"the rendering's limit of {chars:,} characters", at(item))
        elif budget > 0 and kind != _ELIDED:
            try:
                cpu.check()
            except OutOfTime:
                budget = 0
                cpu.stop(f"the rendering's {cpu.seconds:g} s of CPU ran out", at(item))
        if budget <= 0 and kind != _ELIDED and cpu.why is None:
            cpu.stop(f"the rendering's limit of {nodes:,} nodes", at(item))
        if budget <= 0 or kind == _ELIDED:
            if not last_elided:
                yield (sep if pending else "") + elided
                last_elided = True
            pending = False
            continue
        budget -= 1
        cpu.nodes += 1
        if pending:
            out.append(sep)
            pending = False
        last_elided = False
        if kind == _WORD:
            out.append(item[1])
        else:
            try:
                last_elided = _render_node(view, item, limits, ships, as_json, take,
                                           elided, out, stack)
            except OutOfTime:  # in a skip walk: this node is not shown, nor the rest
                del out[1 if out and out[0] == sep else 0:]
                out.append(elided)
                last_elided = True
                budget = 0
                cpu.stop(f"the rendering's {cpu.seconds:g} s of CPU ran out", at(item))
        for piece in out:
            used += len(piece)
            yield piece


def _render_node(view: View, item: tuple, limits: Limits | None, ships: frozenset[int],
                 as_json: bool, take: int | None, elided: str, out: list[str],
                 stack: list[tuple]) -> bool:
    """Render one node into ``out``, pushing its children on ``stack``; True if it was
    elided."""
    kind, x, depth = item
    try:
        if not view.is_cell(x):
            a = view.atom(x)
            if as_json:
                out.append(atom_json(a, limits))
            elif kind == _TERMINAL and a == 0:
                out.append("~")
            else:
                out.append(atom_text(a, limits, ships))
            return False
        if limits is not None and depth >= limits.depth:
            out.append(elided)
            return True
        elements, terminal, complete = _chain(view, x, take)
    except Exhausted:
        out.append(elided)
        return True
    tape = None
    if not as_json:
        special = _special(view, elements, terminal, complete, limits)
        if special is not None:
            out.append(special)
            return False
        # [%txt "ls"] is [%txt 108 115 ~]: a tape may end a flattened cell
        k = len(elements)
        while k > 1 and not view.is_cell(elements[k - 1]) and _byte(view.atom(elements[k - 1])):
            k -= 1
        if len(elements) - k >= MIN_TEXT:
            tape = _special(view, elements[k:], terminal, complete, limits)
            if tape is not None and tape.startswith('"'):
                elements = elements[:k]
            else:
                tape = None
    shown = elements if limits is None else elements[:limits.width]
    truncated = tape is None and (not complete or len(shown) < len(elements))
    if tape is not None and len(shown) < len(elements):
        tape, truncated = None, True
    out.append("[")
    stack.append((_TEXT, "]"))
    if tape is not None:
        stack += [(_WORD, tape), (_SEP,)]
    elif truncated:
        stack += [(_ELIDED,), (_SEP,)]
    else:
        stack += [(_TERMINAL, terminal, depth + 1), (_SEP,)]
    for i in range(len(shown) - 1, -1, -1):
        stack.append((_NODE, shown[i], depth + 1))
        if i:
            stack.append((_SEP,))
    return False


def render_text(view: View, node, limits: Limits | None = DEFAULT,
                ships: Iterable[int] = (), as_json: bool = False,
                cpu: Budget | None = None) -> str:
    """:func:`render` joined into one string."""
    return "".join(render(view, node, limits, ships, as_json, cpu))
