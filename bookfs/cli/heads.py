"""Every event's head, from any source, fast: what ``bookfs report --by`` and ``bookfs
top`` group by.

:func:`sources` opens what a user points at as a list of :class:`Ship` (one for a log, a
pier, an LMDB epoch or a bookfs mount; one per ship for a fleet mount or a fleet
directory); :meth:`Ship.heads` yields a :class:`Head` per event: its number, its payload
size as stored (mug included), its date, wire and card tag, its epoch (on a pier) and,
when asked, :func:`bookfs.noun.route.card_extras`' look into its card.

Only the start of each payload is read (:data:`HEAD_BYTES`); nothing is cued past it:

* a payload of at most :data:`CUE_BYTES` is cued whole by the noun core (compiled when it
  built: about a microsecond) and its head read from the noun
  (:func:`bookfs.noun.event_head`); a payload that does not cue, a larger one and a
  ram-encoded one have their head peeked (:func:`bookfs.noun.peek_event`) from the
  first :data:`HEAD_BYTES`;
* a Book log (either layout, on its own or as a pier's epoch) is read in runs of
  consecutive deeds, one ``pread`` of up to :data:`RUN_BYTES` each
  (``read_payloads_unchecked``: the deeds' CRCs are not checked here, `bookfs verify`
  does that); an event over :data:`CUE_BYTES` alone, only its first bytes; an LMDB epoch
  event by event;
* a mount: ``events/N`` is opened and its first bytes read (the mount checks what it
  serves).

The size is always the payload's whole size, from the log's index (or the event file's
``st_size``), so the bytes counted are exactly the log's payload bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from bookfs.noun import CueError, cue, event_head, peek_event
from bookfs.noun.route import card_extras

HEAD_BYTES = 64 << 10  # bytes of a large payload read for its head
CUE_BYTES = 64 << 10  # payloads up to this are cued whole (their head read from the noun)
RUN_BYTES = 8 << 20  # a run of consecutive small deeds read with one pread
RUN_EVENTS = 4096
RAM = b"RAM\x00"


class Head(NamedTuple):
    """One event as the breakdown sees it."""

    event: int
    size: int  # payload bytes as stored (mug + jam)
    date: int | None  # the @da, None for an event without a [date [wire card]] head
    wire: str | None
    tag: str | None
    epoch: str | None  # the pier's epoch directory (0iN) holding it, else None
    extras: dict | None  # card_extras(), when asked for


class Decoder:
    """The head of a payload: ``(date, wire, tag, extras)``; ``agent``/``crud``: what
    :func:`~bookfs.noun.route.card_extras` is asked to look for."""

    def __init__(self, agent: bool = False, crud: bool = False):
        self.agent, self.crud = agent, crud
        self.texts: dict = {}

    def __call__(self, data, size: int):
        """``data``: the payload from its start (the whole of it when ``size`` is at most
        :data:`CUE_BYTES`, else at least its first :data:`HEAD_BYTES` + 4)."""
        jam = memoryview(data)[4:]
        if not len(jam):
            return None, None, None, None
        if size <= CUE_BYTES and jam[:4] != RAM:
            try:
                noun = cue(jam)
            except (CueError, ValueError, RecursionError, MemoryError):
                noun = None
            if noun is not None:
                date, wire, tag = event_head(noun, self.texts)
                extras = None
                if (self.agent or self.crud) and date is not None:
                    from bookfs.noun.view import NounView

                    extras = card_extras(NounView(), noun, tag, agent=self.agent,
                                         crud=self.crud)
                return date, wire, tag, extras
        date, wire, tag = peek_event(jam[:HEAD_BYTES])
        extras = None
        if (self.agent or self.crud) and date is not None and jam[:4] != RAM:
            from bookfs.noun.view import JamView

            extras = card_extras(JamView.of_bytes(jam[:HEAD_BYTES]), 0, tag,
                                 agent=self.agent, crud=self.crud)
        return date, wire, tag, extras


@dataclass
class Epoch:
    """One epoch of a pier (or the one log of anything else: ``name`` None)."""

    name: str | None
    first: int
    last: int  # 0 when empty
    disk_bytes: int  # what its directory's files take on disk (st_blocks)
    log: object = None  # the open EventLog (None through a mount)


def _disk_bytes(directory: str) -> int:
    total = 0
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
    except OSError:
        pass
    return total


class Ship:
    """One log to read: ``name`` (the ship's @p, or the directory's name), ``path``,
    ``range`` ``(first, last)``, ``epochs`` (:class:`Epoch`, oldest first)."""

    def __init__(self, name: str, path: str):
        self.name, self.path = name, path
        self.range = (0, 0)
        self.epochs: list[Epoch] = []
        self.pier = False

    def heads(self, decode: Decoder, first: int, last: int) -> Iterator[Head]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what reading the heads holds: nothing here (a mount's ship reads
        through files it opens and closes per event); an opened log closes it."""


def _who_name(who: int | None, fallback: str) -> str:
    if not who:
        return fallback
    from bookfs.noun import patp

    return patp(who)


class LogShip(Ship):
    """A log :func:`~bookfs.formats.pier.open_source` opens, read-only."""

    def __init__(self, path: str, name: str | None = None):
        from bookfs.errors import MetaAbsent
        from bookfs.formats.pier import Pier, open_source

        super().__init__(name or os.path.basename(os.path.abspath(path)), path)
        self.log = open_source(path)
        try:
            if name is None:
                self.name = _who_name(int.from_bytes(self.log.read_meta("who"), "little"),
                                      self.name)
            self.range = tuple(self.log.gulf())
            if isinstance(self.log, Pier):
                self.pier = True
                for e in self.log.epochs:
                    first, last = e.log.gulf()
                    self.epochs.append(Epoch(e.name, first, last, _disk_bytes(
                        os.path.join(self.log.log_dir, e.name)), e.log))
            else:
                first, last = self.range
                self.epochs.append(Epoch(None, first, last, 0, self.log))
        except MetaAbsent:
            self.range = tuple(self.log.gulf())
            self.epochs.append(Epoch(None, *self.range, 0, self.log))
        except BaseException:
            self.log.close()
            raise

    def heads(self, decode: Decoder, first: int, last: int) -> Iterator[Head]:
        for ep in self.epochs:
            if not ep.last or ep.last < first or ep.first > last:
                continue
            yield from _log_heads(ep.log, ep.name, decode, max(first, ep.first),
                                  min(last, ep.last))

    def close(self) -> None:
        self.log.close()


def _log_heads(log, epoch: str | None, decode: Decoder, lo: int, hi: int
               ) -> Iterator[Head]:
    size_of = log.payload_size
    bulk = getattr(log, "read_payloads_unchecked", None)
    event = lo
    while event <= hi:
        size = size_of(event)
        if size > CUE_BYTES:
            date, wire, tag, extras = decode(log.read_slice(event, 0, HEAD_BYTES + 4), size)
            yield Head(event, size, date, wire, tag, epoch, extras)
            event += 1
            continue
        if bulk is None:
            data = log.read(event)
            date, wire, tag, extras = decode(data, size)
            yield Head(event, size, date, wire, tag, epoch, extras)
            event += 1
            continue
        # a run of small deeds, read with one pread
        end, total = event, size
        while end < hi and end - event < RUN_EVENTS:
            nxt = size_of(end + 1)
            if nxt > CUE_BYTES or total + nxt > RUN_BYTES:
                break
            end += 1
            total += nxt
        for k, data in enumerate(bulk(event, end)):
            date, wire, tag, extras = decode(data, len(data))
            yield Head(event + k, len(data), date, wire, tag, epoch, extras)
        event = end + 1


class MountShip(Ship):
    """A bookfs mount (or one ship of a fleet mount): its ``events/N`` files."""

    def __init__(self, path: str, name: str | None = None):
        from bookfs.formats.info import parse

        super().__init__(name or path, path)
        with open(os.path.join(path, "info")) as f:
            fields = {"first": "0", "last": "0", **parse(f.read())}
        self.range = (int(fields["first"]), int(fields["last"]))
        if name is None:
            try:
                with open(os.path.join(path, "meta", "who"), "rb") as f:
                    self.name = _who_name(int.from_bytes(f.read(), "little"), path)
            except OSError:
                pass
        epochs_dir = os.path.join(path, "epochs")
        if os.path.isdir(epochs_dir):
            self.pier = True
            for name_ in sorted(os.listdir(epochs_dir), key=_epoch_base):
                with open(os.path.join(epochs_dir, name_, "info")) as f:
                    ep = {"first": "0", "last": "0", **parse(f.read())}
                disk = _disk_bytes(ep["path"]) if ep.get("path") else 0
                self.epochs.append(Epoch(name_, int(ep["first"]), int(ep["last"]), disk))
        else:
            self.epochs.append(Epoch(None, *self.range, 0))

    def epoch_of(self, event: int) -> str | None:
        for ep in reversed(self.epochs):
            if ep.name is not None and ep.last and ep.first <= event:
                return ep.name
        return None

    def read_head(self, event: int) -> tuple[int, bytes]:
        """``(size, first bytes)`` of ``events/N`` (FileNotFoundError: not committed)."""
        fd = os.open(os.path.join(self.path, "events", str(event)), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            return size, os.pread(fd, min(size, max(CUE_BYTES, HEAD_BYTES + 4)), 0)
        finally:
            os.close(fd)

    def heads(self, decode: Decoder, first: int, last: int) -> Iterator[Head]:
        for event in range(first, last + 1):
            size, data = self.read_head(event)
            date, wire, tag, extras = decode(data, size)
            yield Head(event, size, date, wire, tag,
                       self.epoch_of(event) if self.pier else None, extras)


def _epoch_base(name: str) -> int:
    return int(name[2:]) if name[2:].isdigit() else -1


def fleet_ships(path: str) -> list[Ship] | None:
    """The ships of a fleet mount or a fleet directory at ``path`` (each opened), or None
    when ``path`` is neither.  A ship that cannot be read is skipped, and said so on
    stderr."""
    import sys

    from bookfs.cli.fleetinfo import is_fleet_mount

    ships: list[Ship] = []
    if is_fleet_mount(path):
        for name in sorted(os.listdir(path)):
            where = os.path.join(path, name)
            if not os.path.isdir(where):
                print(f"bookfs: {where}: ship cannot be read (skipped)", file=sys.stderr)
                continue
            ships.append(MountShip(where, name))
        return ships
    from bookfs.errors import BookError
    from bookfs.formats.pier import identify

    try:
        identify(path)
        return None  # a log of its own
    except (BookError, OSError):
        pass  # not a log: perhaps a directory of them
    if not os.path.isdir(path):
        return None
    from bookfs.formats.fleet import FleetDir

    fleet = FleetDir(path)
    fleet.scan()
    if not fleet.ships:
        return None
    for name, ship in sorted(fleet.ships.items()):
        try:
            ships.append(LogShip(ship.path, name))
        except (BookError, OSError) as e:
            print(f"bookfs: {ship.path}: {e} (skipped)", file=sys.stderr)
    return ships


def open_ships(path: str) -> list[Ship]:
    """What ``path`` names, as ships: a fleet (mount or directory), a bookfs mount or a
    log.  Raises what :func:`~bookfs.formats.pier.open_source` raises for a bad log."""
    from bookfs.cli.fleetinfo import is_fleet_mount
    from bookfs.cli.show import is_mount

    if is_mount(path) and not is_fleet_mount(path):
        return [MountShip(path)]
    fleet = fleet_ships(path)
    if fleet is not None:
        return fleet
    return [LogShip(path)]


Progress = Callable[[int], None]
