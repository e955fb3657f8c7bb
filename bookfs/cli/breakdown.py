"""What fills a log: events grouped by a key, with their bytes, share, growth and biggest
event (``bookfs report --by KEY`` and ``bookfs top``).

:class:`Breakdown` takes events one at a time (:meth:`Breakdown.add`: the key's value,
the payload size as stored, the date, the event number) and keeps, per group, events,
bytes, the first and last date, and the biggest event; and, for the charts, bytes per
time bin per group (:class:`Bins`).  :meth:`Breakdown.result` is the JSON shape::

    {"key": "vane", "total": {"events": E, "bytes": B, ...},
     "groups": [{"key": "ames", "events": ..., "bytes": ..., "share": ..., ...}, ...]}

groups largest first (by bytes, then events, then key); with ``top``, the groups past
the first ``top`` are summed into one :data:`OTHER` group, so the groups always add up to
the total, in events and in bytes.

Keys (:data:`KEYS`): ``vane`` and ``agent`` (:mod:`bookfs.noun.route`), ``wire`` (its
first ``depth`` segments), ``card`` (the tag) and ``ship`` (the @p of the log, one per
ship of a fleet).  An event without a ``[date [wire card]]`` head (the boot's lifecycle
events) is :data:`~bookfs.noun.route.UNDATED` for every key but ``ship``.

Memory is bounded by the number of groups: bins are kept for the first
:data:`MAX_BINNED` groups seen, the rest are drawn as ``(other)``; bins coarsen (a
minute, then 5 and 15 minutes, an hour, 6 hours, a day, a week) so there are never more
than :data:`MAX_BINS` of them.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from bookfs.noun import DA_UNIX_EPOCH
from bookfs.noun.route import UNDATED, agent_of, vane_of, wire_prefix

KEYS = ("vane", "wire", "card", "agent", "ship")
OTHER = "(other)"
MAX_BINNED = 1000
MAX_BINS = 2000
BIN_STEPS = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
MIN_SPAN = 60.0  # seconds: a group's span counts as at least this for its rate
DA_SECOND = 1 << 64


def key_function(key: str, depth: int = 2):
    """``f(head, ship) -> str``: the group of an event (a :class:`~bookfs.cli.heads.Head`)
    for ``key``."""
    if key == "vane":
        return lambda h, ship: vane_of(h.wire, h.tag, (h.extras or {}).get("crud_wire"))
    if key == "wire":
        return lambda h, ship: wire_prefix(h.wire, depth)
    if key == "card":
        return lambda h, ship: UNDATED if h.wire is None else (h.tag or "")
    if key == "agent":
        return lambda h, ship: UNDATED if h.wire is None else agent_of(h.wire, h.tag,
                                                                       h.extras)
    if key == "ship":
        return lambda h, ship: ship
    raise ValueError(f"unknown key {key!r}; expected one of {', '.join(KEYS)}")


def decoder_wants(key: str) -> dict:
    """What :class:`~bookfs.cli.heads.Decoder` must look for inside the card."""
    return {"agent": key == "agent", "crud": key == "vane"}


def unix(da: int) -> float:
    """Unix seconds of the @da ``da`` (its 64-bit fraction kept to a float's precision)."""
    return ((da >> 64) - DA_UNIX_EPOCH) + (da & (DA_SECOND - 1)) / DA_SECOND


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Group:
    events: int = 0
    bytes: int = 0
    first: float | None = None  # unix seconds of the first and last dated event
    last: float | None = None
    big_event: int = 0
    big_bytes: int = -1
    big_ship: str | None = None

    def add(self, size: int, t: float | None, event: int, ship: str | None) -> None:
        self.events += 1
        self.bytes += size
        if t is not None:
            if self.first is None or t < self.first:
                self.first = t
            if self.last is None or t > self.last:
                self.last = t
        if size > self.big_bytes:
            self.big_bytes, self.big_event, self.big_ship = size, event, ship

    def merge(self, other: Group) -> None:
        self.events += other.events
        self.bytes += other.bytes
        for t in (other.first, other.last):
            if t is not None:
                self.first = t if self.first is None else min(self.first, t)
                self.last = t if self.last is None else max(self.last, t)
        if other.big_bytes > self.big_bytes:
            self.big_bytes, self.big_event = other.big_bytes, other.big_event
            self.big_ship = other.big_ship

    def days(self) -> float | None:
        if self.first is None:
            return None
        return max(self.last - self.first, MIN_SPAN) / 86400

    def as_dict(self, total: Group, ships: bool) -> dict:
        days = self.days()
        out = {"events": self.events, "bytes": self.bytes,
               "share": round(self.bytes / total.bytes, 6) if total.bytes else 0.0,
               "events_share": round(self.events / total.events, 6) if total.events else 0.0,
               "first_date": iso(self.first), "last_date": iso(self.last),
               "days": round(days, 6) if days is not None else None,
               "bytes_per_day": round(self.bytes / days) if days else None,
               "biggest": ({"event": self.big_event, "bytes": self.big_bytes}
                           if self.events else None)}
        if ships and self.events:
            out["biggest"]["ship"] = self.big_ship
        return out


class Bins:
    """Bytes per (time bin, group), coarsened to stay under :data:`MAX_BINS` bins."""

    def __init__(self):
        self.seconds = BIN_STEPS[0]
        self.data: dict[tuple[int, str], int] = {}
        self.bins: set[int] = set()

    def add(self, t: float, group: str, size: int) -> None:
        b = int(t // self.seconds)
        key = (b, group)
        self.data[key] = self.data.get(key, 0) + size
        if b not in self.bins:
            self.bins.add(b)
            if len(self.bins) > MAX_BINS and self.seconds != BIN_STEPS[-1]:
                self._coarsen()

    def _coarsen(self) -> None:
        while len(self.bins) > MAX_BINS and self.seconds != BIN_STEPS[-1]:
            new = BIN_STEPS[BIN_STEPS.index(self.seconds) + 1]
            data: dict[tuple[int, str], int] = {}
            for (b, g), n in self.data.items():
                k = (b * self.seconds // new, g)
                data[k] = data.get(k, 0) + n
            self.seconds, self.data = new, data
            self.bins = {b for b, _ in data}


class Breakdown:
    """Events grouped by ``key`` (see the module docstring)."""

    def __init__(self, key: str, depth: int = 2, bins: bool = False):
        self.key, self.depth = key, depth
        self.groups: dict[str, Group] = {}
        self.total = Group()
        self.first_event: int | None = None
        self.last_event: int | None = None
        self.bins = Bins() if bins else None
        self.ships: set[str] = set()
        self._binned: set[str] = set()  # the groups whose bins are kept

    def add(self, group: str, size: int, date: int | None, event: int,
            ship: str | None = None) -> None:
        t = unix(date) if date is not None else None
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = Group()
        g.add(size, t, event, ship)
        self.total.add(size, t, event, ship)
        if ship is not None:
            self.ships.add(ship)
        if self.first_event is None or event < self.first_event:
            self.first_event = event
        if self.last_event is None or event > self.last_event:
            self.last_event = event
        if self.bins is not None and t is not None:
            if group not in self._binned and len(self._binned) < MAX_BINNED:
                self._binned.add(group)
            self.bins.add(t, group if group in self._binned else OTHER, size)

    def ranked(self) -> list[tuple[str, Group]]:
        return sorted(self.groups.items(), key=lambda kv: (-kv[1].bytes, -kv[1].events,
                                                           kv[0]))

    def top(self, n: int | None) -> list[tuple[str, Group]]:
        """The groups, largest first; past ``n``, one :data:`OTHER` group of the rest."""
        ranked = self.ranked()
        if n is None or len(ranked) <= n:
            return ranked
        rest = Group()
        for _, g in ranked[n:]:
            rest.merge(g)
        return ranked[:n] + [(OTHER, rest)]

    def result(self, top: int | None = None) -> dict:
        ships = len(self.ships) > 1
        total = self.total.as_dict(self.total, ships)
        total.pop("share"), total.pop("events_share")
        total.update({"first_event": self.first_event, "last_event": self.last_event,
                      "groups": len(self.groups)})
        out = {"key": self.key, "total": total,
               "groups": [{"key": k, **g.as_dict(self.total, ships)}
                          for k, g in self.top(top)]}
        if self.key == "wire":
            out["depth"] = self.depth
        return out


# --- epochs and chop -----------------------------------------------------------------------

CHOP_RULE = ("vere's chop keeps the newest two epochs and deletes every other epoch "
             "directory (pkg/vere/disk.c, u3_disk_chop); a roll first starts a new, empty "
             "epoch (u3_disk_roll), so after it only the current newest epoch is kept")


def epochs_report(ships, per_epoch: dict) -> tuple[list[dict], dict | None]:
    """Bytes per epoch of each pier among ``ships`` (``per_epoch``: ``(ship, epoch) ->
    Group`` of the events counted), and what a ``roll`` then a ``chop`` would free now:
    every epoch but the newest non-empty one (a roll refuses an empty newest epoch:
    ``roll: latest epoch is empty``, and chop then keeps it and the one before)."""
    rows, frees, keeps, dropped = [], 0, [], []
    piers = [s for s in ships if s.pier]
    for ship in piers:
        eps = ship.epochs
        keep = len(eps) - 1 if eps and eps[-1].last else len(eps) - 2
        for k, ep in enumerate(eps):
            g = per_epoch.get((ship.name, ep.name), Group())
            row = {"epoch": ep.name, "first": ep.first or None, "last": ep.last or None,
                   "events": (ep.last - ep.first + 1) if ep.last else 0,
                   "counted_events": g.events, "counted_bytes": g.bytes,
                   "disk_bytes": ep.disk_bytes, "chop_frees": k < keep}
            if len(piers) > 1 or len(ships) > 1:
                row["ship"] = ship.name
            rows.append(row)
            if k < keep:
                frees += ep.disk_bytes
                dropped.append(ep.name if len(ships) == 1 else f"{ship.name}/{ep.name}")
            else:
                keeps.append(ep.name if len(ships) == 1 else f"{ship.name}/{ep.name}")
    if not piers:
        return [], None
    return rows, {"frees_disk_bytes": frees, "deletes": dropped, "keeps": keeps,
                  "rule": CHOP_RULE}
