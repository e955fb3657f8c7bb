"""``bookfs show SOURCE N[..M]``: events as a person reads them.

For each event: its number, date, wire and card tag, its size and mug, and the noun in the
dojo's notation (:mod:`bookfs.render`).  A ship event ``[date [wire card]]`` shows the card
as its noun; any other event (the lifecycle nouns a pill boots with) shows the whole noun.

SOURCE is a bookfs mount (its ``events/N`` files are read) or any log
:func:`~bookfs.pier.open_source` opens (a pier, a Book directory, an LMDB epoch).

By default the rendering is abbreviated (:data:`bookfs.render.DEFAULT`) and the jam is
read in place (:class:`~bookfs.render.JamView`): a 100 MB event costs a few reads of its
bytes and prints in well under a second, and memory does not grow with the event.
``--full`` cues the whole event (memory as :func:`~bookfs.noun.cue` needs) and shows
everything.  ``--json`` prints one JSON object per line (the exact noun, no heuristics).

The same :func:`event_text` renders the mount's ``pretty/N`` files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator

from .info import parse as parse_info
from .noun import CueError, cue, da_to_datetime, format_da, parse_patp
from .render import (DEFAULT, FULL_RENDER_CPU, RENDER_CPU, SHIP_MIN, Budget, Exhausted,
                     JamView, Limits, NounView, OutOfTime, human_size, knot_text, render,
                     render_text)

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

    Bounded in time as well as in size: one :class:`~bookfs.render.Budget` of CPU
    (:data:`~bookfs.render.RENDER_CPU`, :data:`~bookfs.render.FULL_RENDER_CPU` with
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


# --- sources -----------------------------------------------------------------------------


class _MountSource:
    """A bookfs mount: ``events/N`` files, ``info`` and ``meta/who``."""

    def __init__(self, path: str):
        self.path = path
        with open(os.path.join(path, "info")) as f:
            fields = {"first": "0", "last": "0", **parse_info(f.read())}
        self.range = int(fields["first"]), int(fields["last"])
        try:
            with open(os.path.join(path, "meta", "who"), "rb") as f:
                self.who = int.from_bytes(f.read(), "little")
        except OSError:
            self.who = None

    def payload(self, event: int) -> tuple[int, Pread, Callable[[], None]]:
        fd = os.open(os.path.join(self.path, "events", str(event)), os.O_RDONLY)
        return os.fstat(fd).st_size, lambda off, n: os.pread(fd, n, off), lambda: os.close(fd)

    def close(self) -> None:
        """Nothing to release: each payload's descriptor is closed by its own closer."""


class _LogSource:
    """A log :func:`~bookfs.pier.open_source` opens, read-only."""

    SMALL = 1 << 20  # payloads up to this are read whole; larger ones in slices

    def __init__(self, path: str):
        from .errors import MetaAbsent
        from .pier import open_source

        self.log = open_source(path)
        self.range = self.log.gulf()
        try:
            self.who = int.from_bytes(self.log.read_meta("who"), "little")
        except MetaAbsent:
            self.who = None

    def payload(self, event: int) -> tuple[int, Pread, Callable[[], None]]:
        size = self.log.payload_size(event)
        if size <= self.SMALL:
            data = self.log.read(event)
            return size, lambda off, n: data[off:off + n], lambda: None
        self.log.verify_event(event)  # the format's check, streamed
        return size, lambda off, n: self.log.read_slice(event, off, n), lambda: None

    def close(self) -> None:
        self.log.close()


def is_mount(path: str) -> bool:
    """True if ``path`` looks like a bookfs mount (``events/`` and ``info``)."""
    return os.path.isdir(os.path.join(path, "events")) and os.path.isfile(
        os.path.join(path, "info"))


def open_any(path: str):
    """A mount or a log source for ``show`` and ``report`` (``range``, ``who``,
    ``payload(event)`` and ``close()``)."""
    return _MountSource(path) if is_mount(path) else _LogSource(path)


_RANGE = re.compile(r"(\d+)(?:\.\.(\d+))?")


def parse_range(text: str) -> tuple[int, int]:
    """``N`` or ``N..M`` (N <= M, both >= 1); ``ValueError`` with a one-line reason."""
    m = _RANGE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"expected an event number N or a range N..M, got {text!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else first
    if first < 1 or last < first:
        raise ValueError(f"expected 1 <= N <= M in N..M, got {text!r}")
    return first, last


def run(args) -> int:
    try:
        first, last = parse_range(args.events)
    except ValueError as e:
        print(f"bookfs show: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(args.source):
        print(f"bookfs show: {args.source}: no such file or directory; expected a bookfs "
              "mount, a pier, a Book directory or an LMDB epoch", file=sys.stderr)
        return 2
    source = open_any(args.source)
    try:
        have = source.range
        if not have[1] or first < have[0] or last > have[1]:
            held = f"it holds {have[0]}..{have[1]}" if have[1] else "it is empty"
            print(f"bookfs show: no event {first if first < have[0] or not have[1] else last}"
                  f" in {args.source} ({held})", file=sys.stderr)
            return 1
        limits = None if args.full else DEFAULT
        out = sys.stdout
        for event in range(first, last + 1):
            size, pread, done = source.payload(event)
            try:
                for piece in event_text(event, size, pread, limits=limits, who=source.who,
                                        as_json=args.json):
                    out.write(piece)
            finally:
                done()
        out.flush()
    except OSError as e:
        if not isinstance(e, BrokenPipeError):
            print(f"bookfs show: {e.filename or args.source}: {e.strerror}", file=sys.stderr)
            return 1
        # show 1..100000 | head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        source.close()
    return 0


def register(sub) -> None:
    s = sub.add_parser("show", help="print events as readable nouns", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("source", help="a bookfs mount, a pier, a Book directory or an LMDB epoch")
    s.add_argument("events", metavar="N[..M]", help="an event number or an inclusive range")
    s.add_argument("--full", action="store_true",
                   help="show everything: no abbreviation (cues the whole event)")
    s.add_argument("--json", action="store_true",
                   help="one JSON object per event: the exact noun, date, wire, card")
    s.set_defaults(func=run)
