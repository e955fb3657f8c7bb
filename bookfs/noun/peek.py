"""An event's head read without cueing the event: :func:`peek_event` decodes the ``date``,
``wire`` and card ``tag`` of a jammed ``[date [wire [tag data]]]`` and never the data.

A multi-megabyte event costs the few hundred bits of its head; ``info``, ``report`` and
the Spark source date and sort events with it.  It reads the jam's bit layout as
:func:`~bookfs.noun.codec.cue` does, only as far as the head, with bounds on the width of
an atom and the number of nodes it decodes.
"""

from __future__ import annotations

from bookfs.noun.aura import DA_UNIX_EPOCH
from bookfs.noun.codec import _MISSING, CueError, Noun, is_atom, is_cell, uncord

__all__ = ["event_head", "peek_event"]

_PEEK_MAX_ATOM_BITS = 1 << 16  # a date, a knot or a tag is far smaller than this
#: An @da read as a date must fall in years 1..9999 (seconds from the Unix epoch).
SECONDS_MIN, SECONDS_MAX = -62135596800, 253402300799
#: Texts of knots and tags an :func:`event_head` cache holds before it is emptied.
TEXTS_MAX = 1 << 14
_NO_HEAD = (None, None, None)


def event_head(noun, texts: dict) -> tuple[int | None, str | None, str | None]:
    """``(date, wire, tag)`` of a cued ``[date [wire [tag data]]]`` event, by
    :func:`peek_event`'s rules (a date in years 1..9999, a wire that is a null-terminated
    list of UTF-8 knots, a UTF-8 tag; atoms of at most 2^16 bits), else three Nones.
    ``texts`` caches the text of knots and tags (they repeat from event to event; emptied
    at :data:`TEXTS_MAX`).  A :class:`bookfs.noun.ram.BobRef` is not an atom here.  The
    pure reference; the compiled core has the same function (``bookfs.noun.event_head``
    picks it when it built)."""
    if type(noun) is not tuple:
        return _NO_HEAD
    date, ovum = noun
    if type(date) is not int or date.bit_length() > _PEEK_MAX_ATOM_BITS \
            or type(ovum) is not tuple:
        return _NO_HEAD
    if not SECONDS_MIN <= (date >> 64) - DA_UNIX_EPOCH <= SECONDS_MAX:
        return _NO_HEAD
    wire, card = ovum
    knots = []
    try:
        while type(wire) is tuple:
            knot, wire = wire
            if type(knot) is not int or knot.bit_length() > _PEEK_MAX_ATOM_BITS:
                return _NO_HEAD
            knots.append(_text(knot, texts))
        if type(wire) is not int or wire != 0 or type(card) is not tuple:
            return _NO_HEAD
        tag = card[0]
        if type(tag) is not int or tag.bit_length() > _PEEK_MAX_ATOM_BITS:
            return _NO_HEAD
        return date, "/" + "/".join(knots), _text(tag, texts)
    except UnicodeDecodeError:
        return _NO_HEAD


def _text(atom: int, texts: dict) -> str:
    """:func:`uncord` of ``atom``, remembered in ``texts`` (UnicodeDecodeError if not
    UTF-8)."""
    text = texts.get(atom)
    if text is None:
        text = uncord(atom)
        if len(texts) >= TEXTS_MAX:
            texts.clear()
        texts[atom] = text
    return text
_PEEK_MAX_NODES = 4096  # wire nodes decoded at most


class _Peek:
    """Just enough of :func:`cue` to decode the first few nouns of a jam, on demand."""

    __slots__ = ("buf", "total", "memo", "budget")
    ATOM_TAG = 1  # bits of an atom's tag: 1 in jam, 2 in ram

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
            value, nxt = self.mat(pos + self.ATOM_TAG)
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


class _RamPeek(_Peek):
    """The same over vere's ram bits (:mod:`bookfs.noun.ram`): 2-bit tags (``0`` atom,
    ``1`` bob, ``2`` cell, ``3`` back-reference), positions counted after the 5-byte
    header.  A bob (an atom stored outside the log) is never a date, wire or tag."""

    __slots__ = ()
    ATOM_TAG = 2

    def tag(self, pos: int) -> int:
        v = self.bits(pos, 2)
        if v == 1:
            raise CueError("a bob atom: not read by a peek")
        return (0, None, 1, 2)[v]


def peek_event(data: bytes | bytearray | memoryview
               ) -> tuple[int | None, str | None, str | None]:
    """``(date, wire, tag)`` of a jammed ``[date [wire [tag data]]]`` event, decoding only
    the head of the noun: the data (which may be megabytes) is never cued.  ``data`` is
    the payload after its 4-byte mug: a jam, or vere's ram encoding (``"RAM\\0"``,
    version 1), whose head is read the same way.

    ``date`` is the @da atom (see :func:`da_to_datetime`), ``wire`` the path rendered as
    ``/a/b/c`` and ``tag`` the card's tag as text.  Anything that does not have that shape
    (lifecycle events, a date outside years 1..9999, a wire that is not a list of text
    knots, a tag that is not text, bad jam) gives ``(None, None, None)``.
    """
    head = bytes(data[:1 << 20]) if len(data) > 1 << 20 else bytes(data)
    if head[:5] == b"RAM\x00\x01":  # bookfs.noun.ram.RAM_HEADER (ram imports codec)
        p: _Peek = _RamPeek(head[5:])
    else:
        p = _Peek(head)
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
