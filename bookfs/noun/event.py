"""One event's payload as text: its date, wire and card tag, size and mug, and the noun in
the dojo's notation (:mod:`bookfs.noun.render`). ``bookfs show`` prints it and the mount's
``pretty/N`` files serve it.

A ship event ``[date [wire card]]`` shows the card as its noun; any other event (the
lifecycle nouns a pill boots with) shows the whole noun. The jam is read in place
(:class:`~bookfs.noun.view.JamView`) within :class:`~bookfs.noun.render.Limits` and a CPU
budget, so memory and time do not grow with the event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator

from bookfs.noun.aura import da_to_datetime, format_da, parse_patp
from bookfs.noun.codec import CueError, cue
from bookfs.noun.render import (DEFAULT, FULL_RENDER_CPU, RENDER_CPU, SHIP_MIN, Budget, Limits,
                                OutOfTime, human_size, knot_text, render, render_text)
from bookfs.noun.view import Exhausted, JamView, NounView

MAX_WIRE_KNOTS = 256  # a longer list is not read as a wire
MUG_BYTES = 4  # a payload is a 4-byte mug, then the jam

Pread = Callable[[int, int], bytes]  # (offset, size) -> bytes of an event's payload


class ShapeOf:
    """What an event's noun is: a ship event ``[date [wire card]]`` (``date``, ``wire``,
    ``tag`` set, ``card`` the card's node) or not (all None)."""

    __slots__ = ("date", "wire", "tag", "card", "ships")

    def __init__(self, view, root):
        self.date = self.wire = self.tag = self.card = None
        self.ships: set[int] = set()
        try:
            self._read(view, root)
        except (Exhausted, CueError, OutOfTime):
            self.date = self.wire = self.tag = self.card = None

    def _read(self, view, root) -> None:
        if not view.is_cell(root) or view.is_cell(view.head(root)):
            return
        date = view.atom(view.head(root))
        if not isinstance(date, int) or date.bit_length() != 128:
            return
        try:
            da_to_datetime(date)
        except ValueError:
            return
        ovum = view.tail(root)
        if not view.is_cell(ovum):
            return
        node, knots = view.head(ovum), []
        while view.is_cell(node) and len(knots) < MAX_WIRE_KNOTS:
            knot = view.head(node)
            text = None if view.is_cell(knot) else knot_text(view.atom(knot))
            if text is None:
                return
            knots.append(text)
            node = view.tail(node)
        if view.is_cell(node) or view.atom(node) != 0:
            return
        card = view.tail(ovum)
        tag = None
        if view.is_cell(card) and not view.is_cell(view.head(card)):
            tag = knot_text(view.atom(view.head(card)))
        self.date, self.wire, self.tag, self.card = date, "/" + "/".join(knots), tag, card
        for k in knots:
            if k.startswith("~"):
                with contextlib.suppress(ValueError):  # a knot like ~foo that is no @p
                    self.ships.add(parse_patp(k))


def _when(date: int) -> str:
    return da_to_datetime(date).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def event_text(event: int, size: int, pread: Pread, *, limits: Limits | None = DEFAULT,
               who: int | None = None, as_json: bool = False,
               cpu: float | None = None) -> Iterator[str]:
    """The rendering of one event, in pieces ending with a newline: ``key: value`` lines
    (or one JSON object).  ``pread`` reads the event's payload (already checked by the
    caller); ``limits=None`` cues the whole event and shows everything; ``who`` (the log's
    ship) is shown as an @p where it appears.  A payload that is not ``mug ++ jam`` is
    said so in the output (``error`` line), never raised.

    Bounded in time as well as in size: one :class:`~bookfs.noun.render.Budget` of CPU
    (:data:`~bookfs.noun.render.RENDER_CPU`, :data:`~bookfs.noun.render.FULL_RENDER_CPU` with
    ``limits=None``; ``cpu`` seconds if given) covers reading the event's shape and
    rendering it; a rendering that a limit cut short ends with a ``stopped:`` line saying
    which, and where (a ``stopped`` field in JSON)."""
    mug = int.from_bytes(pread(0, MUG_BYTES), "little") if size >= MUG_BYTES else None
    fields: dict = {"event": event, "size": size, "mug": mug}
    cpu = Budget(cpu if cpu is not None else
                 RENDER_CPU if limits is not None else FULL_RENDER_CPU)
    try:
        if size <= MUG_BYTES:
            raise CueError(f"a payload of {size} bytes holds no jam after its 4-byte mug")
        if limits is None:
            view, root = NounView(), cue(pread(MUG_BYTES, size - MUG_BYTES))
        else:
            view = JamView(size - MUG_BYTES, lambda off, n: pread(MUG_BYTES + off, n),
                           budget=cpu)
            root = view.root
        shape = ShapeOf(view, root)
        ships = set(shape.ships)
        if who is not None and who >= SHIP_MIN:
            ships.add(who)
        noun = root if shape.card is None else shape.card
        if as_json:
            fields.update({
                "date": None if shape.date is None else format_da(shape.date),
                "time": None if shape.date is None else da_to_datetime(shape.date).isoformat(),
                "wire": shape.wire, "card": shape.tag})
            fields["noun"] = render_text(view, noun, limits, as_json=True, cpu=cpu)
            fields["text"] = render_text(view, noun, limits, ships, cpu=cpu)
            if cpu.said() is not None:
                fields["stopped"] = cpu.said()
        else:
            yield f"event: {event}\n"
            if shape.date is None:
                yield "kind:  not [date [wire card]] (a lifecycle event of the boot)\n"
            else:
                yield f"date:  {format_da(shape.date)} ({_when(shape.date)})\n"
                yield f"wire:  {shape.wire}\n"
                yield f"card:  {'%' + shape.tag if shape.tag else '(no tag)'}\n"
            yield f"size:  {human_size(size)}, mug 0x{mug:08x}\n"
            yield "noun:  "
            yield from render(view, noun, limits, ships, cpu=cpu)
            stopped = cpu.said()
            yield "\n" if stopped is None else f"\n{stopped}\n"
            yield "\n"
            return
    except CueError as e:
        if as_json:
            fields["error"] = f"not a valid jam: {e}"
        else:
            yield f"event: {event}\nsize:  {human_size(size)}\nerror: not a valid jam: {e}\n\n"
            return
    if as_json:
        noun = fields.pop("noun", None)
        text = json.dumps(fields)
        if noun is not None:  # the noun is already JSON (it may hold huge numbers)
            text = text[:-1] + f', "noun": {noun}}}'
        yield text + "\n"
