"""One event's payload as text: its date, wire and card tag, size and mug, and the noun in
the dojo's notation (:mod:`bookfs.noun.render`). ``bookfs show`` prints it and the mount's
``pretty/N`` files serve it.

A ship event ``[date [wire card]]`` shows the card as its noun; any other event shows the
whole noun, and is called a lifecycle event of the boot only when it is among the first
``life`` events of the log (meta key ``life``). The jam is read in place
(:class:`~bookfs.noun.view.JamView`) within :class:`~bookfs.noun.render.Limits` and a CPU
budget, so memory and time do not grow with the event.

A payload is first checked to be an event's (:func:`bookfs.noun.payload.payload_problem`: a 4-byte mug, then a
jam that cues completely and exactly, or vere's ram encoding); one that is not is shown as
"not a noun" in one line: which event, the byte of its payload where parsing failed, why.
A ram event (vere ``ml/bob``, :mod:`bookfs.noun.ram`) is decoded whole and shown as its jam
twin is; a bob atom whose file is not in ``.urb/bob`` is shown as a reference, and a
``bobs:`` line says so.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from bookfs.noun.aura import da_to_datetime, format_da, parse_patp
from bookfs.noun.codec import CueError
from bookfs.noun.payload import MUG_BYTES, Pread, not_a_noun, payload_problem
from bookfs.noun.render import (DEFAULT, FULL_RENDER_CPU, RENDER_CPU, SHIP_MIN, Budget, Limits,
                                OutOfTime, human_size, knot_text, render, render_text)
from bookfs.noun.view import Exhausted, JamView, NounView

MAX_WIRE_KNOTS = 256  # a longer list is not read as a wire
MAX_BOBS_NAMED = 4  # bob files named on the bobs: line


def _one_line(text: str) -> str:
    return " ".join(text.split())


class RamView:
    """A noun :func:`~bookfs.noun.ram.ram_decode` built (ints, 2-tuples and
    :class:`~bookfs.noun.ram.BobRef`\\ s, shown by the renderer as the reference they
    are)."""

    def is_cell(self, node) -> bool:
        return isinstance(node, tuple)

    def head(self, node):
        return node[0]

    def tail(self, node):
        return node[1]

    def atom(self, node):
        return node


def _bob_refs(noun, most: int = 1 << 20) -> list:
    """The :class:`~bookfs.noun.ram.BobRef`\\ s in ``noun`` (each shared cell once), in
    order, looking at no more than ``most`` nodes."""
    from bookfs.noun.ram import BobRef

    out, seen, stack = [], set(), [noun]
    while stack and most > 0:
        most -= 1
        x = stack.pop()
        if isinstance(x, tuple):
            if id(x) in seen:
                continue
            seen.add(id(x))
            stack += [x[1], x[0]]
        elif type(x) is BobRef and x not in out:
            out.append(x)
    return out


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
               cpu: float | None = None, life: int | None = None,
               bob_dir=None) -> Iterator[str]:
    """The rendering of one event, in pieces ending with a newline: ``key: value`` lines
    (or one JSON object).  ``pread`` reads the event's payload (already checked by the
    caller against its format); ``limits=None`` cues the whole event and shows everything;
    ``who`` (the log's ship) is shown as an @p where it appears; ``life`` (meta key
    ``life``) is how many events of the boot have no date; ``bob_dir`` is the pier's
    ``.urb/bob``.  A payload that is not an event's (:func:`payload_problem`) is said so
    in one ``error: event N is not a noun: ...`` line (an ``error`` field in JSON), never
    raised.

    Bounded in time as well as in size: one :class:`~bookfs.noun.render.Budget` of CPU
    (:data:`~bookfs.noun.render.RENDER_CPU`, :data:`~bookfs.noun.render.FULL_RENDER_CPU` with
    ``limits=None``; ``cpu`` seconds if given) covers reading the event's shape and
    rendering it; a rendering that a limit cut short ends with a ``stopped:`` line saying
    which, and where (a ``stopped`` field in JSON)."""
    mug = int.from_bytes(pread(0, MUG_BYTES), "little") if size >= MUG_BYTES else None
    fields: dict = {"event": event, "size": size, "mug": mug}
    cpu = Budget(cpu if cpu is not None else
                 RENDER_CPU if limits is not None else FULL_RENDER_CPU)
    problem = payload_problem(size, pread, bob_dir)
    if problem is not None:
        yield from _refused(event, size, mug, not_a_noun(event, problem), problem.offset,
                            as_json, fields)
        return
    from bookfs.noun.ram import is_ram, ram_decode

    ram = is_ram(pread(MUG_BYTES, 5))
    bobs: list = []
    try:
        if ram:
            view, root = RamView(), ram_decode(pread(MUG_BYTES, size - MUG_BYTES), bob_dir)
            bobs = _bob_refs(root)
        elif limits is None:
            from bookfs.noun import cue

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
        boot = life is not None and event <= life
        if as_json:
            fields.update({
                "date": None if shape.date is None else format_da(shape.date),
                "time": None if shape.date is None else da_to_datetime(shape.date).isoformat(),
                "wire": shape.wire, "card": shape.tag})
            if ram:
                fields["encoding"] = "ram"
            if shape.date is None:
                fields["kind"] = "lifecycle" if boot else "not a ship event"
            if bobs:
                fields["bobs_missing"] = [f".urb/bob/{b.mug}/{b.seq}" for b in bobs]
            fields["noun"] = render_text(view, noun, limits, as_json=True, cpu=cpu)
            fields["text"] = render_text(view, noun, limits, ships, cpu=cpu)
            if cpu.said() is not None:
                fields["stopped"] = cpu.said()
        else:
            yield f"event: {event}\n"
            if shape.date is None:
                yield ("kind:  not [date [wire card]] (a lifecycle event of the boot)\n"
                       if boot else "kind:  not a ship event (no date and wire)\n")
            else:
                yield f"date:  {format_da(shape.date)} ({_when(shape.date)})\n"
                yield f"wire:  {shape.wire}\n"
                yield f"card:  {'%' + shape.tag if shape.tag else '(no tag)'}\n"
            yield (f"size:  {human_size(size)}, mug 0x{mug:08x}"
                   f"{', ram encoding (vere ml/bob)' if ram else ''}\n")
            if bobs:
                named = ", ".join(f".urb/bob/{b.mug}/{b.seq}" for b in bobs[:MAX_BOBS_NAMED])
                more = (f" and {len(bobs) - MAX_BOBS_NAMED} more"
                        if len(bobs) > MAX_BOBS_NAMED else "")
                yield (f"bobs:  {len(bobs)} atom(s) stored outside the log, file(s) not "
                       f"present ({named}{more}): each shown as a reference, not its value\n")
            yield "noun:  "
            yield from render(view, noun, limits, ships, cpu=cpu)
            stopped = cpu.said()
            yield "\n" if stopped is None else f"\n{stopped}\n"
            yield "\n"
            return
    except CueError as e:  # the payload scanned as a noun; the view could not read it
        yield from _refused(event, size, mug,
                            f"event {event} is not a noun: {_one_line(str(e))}", None,
                            as_json, fields)
        return
    noun = fields.pop("noun", None)
    text = json.dumps(fields)
    if noun is not None:  # the noun is already JSON (it may hold huge numbers)
        text = text[:-1] + f', "noun": {noun}}}'
    yield text + "\n"


def _refused(event: int, size: int, mug: int | None, line: str, byte: int | None,
             as_json: bool, fields: dict) -> Iterator[str]:
    """An event that is not a noun: its number, size and mug, and the one line why."""
    if as_json:
        fields.update({"error": line, "error_byte": byte})
        yield json.dumps(fields) + "\n"
        return
    yield f"event: {event}\n"
    yield (f"size:  {human_size(size)}" + (f", mug 0x{mug:08x}" if mug is not None else "")
           + "\n")
    yield f"error: {line}\n\n"
