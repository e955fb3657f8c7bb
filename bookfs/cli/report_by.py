"""``bookfs report SRC --by KEY``: what fills a log, grouped by vane, wire, card, agent or
ship, as a table (a person), JSON (``--json``, a script) or an HTML page with charts
(``--out DIR``).

SRC is anything the other tools take: a Book directory, an LMDB epoch, a pier, a bookfs
mount, a fleet mount or a fleet directory (every ship in it).  Each event's head is read
once (:mod:`bookfs.cli.heads`), grouped (:mod:`bookfs.cli.breakdown`), and never cued
past what the key needs.  For a pier it also says how many bytes each epoch holds and what
a ``roll`` then a ``chop`` would free now (:func:`bookfs.cli.breakdown.epochs_report`).

``--since``/``--until`` take an event number (``1000``) or a date, UTC (``2024-01-05``,
``2024-01-05T12:00``, ``2024-01-05 12:00:30``, or an @da ``~2024.1.5..12.00.00``); both
bounds are inclusive, and an ``--until`` date includes the whole of its last unit (a day
alone: that whole day; ``12:00``: that minute; ``12:00:30``: that second).
A date bound leaves out the events without a date (the boot's).  ``--top N`` shows the N
largest groups and sums the rest into ``(other)``, so the groups always add up to the
total.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import sys

from bookfs.cli.breakdown import (
    OTHER,
    Breakdown,
    Group,
    decoder_wants,
    epochs_report,
    iso,
    key_function,
    unix,
)
from bookfs.errors import UsageError
from bookfs.noun.render import human_size

PROGRESS_EVERY = 4096


def parse_bound(text: str, upper: bool) -> tuple[str, float]:
    """``("event", n)`` or ``("date", unix seconds)`` for a ``--since``/``--until``
    value (module docstring); :class:`UsageError` (one line) otherwise."""
    flag = "--until" if upper else "--since"
    t = text.strip().replace("_", "").replace(",", "")
    if t.isdigit():
        if int(t) < 1:
            raise UsageError(f"{flag} {text!r}: expected an event number >= 1 or a date")
        return "event", int(t)
    if t.startswith("~"):
        from bookfs.noun import parse_da

        try:
            return "date", unix(parse_da(t))
        except ValueError:
            pass
    else:
        day = re.fullmatch(r"\d{4}-\d{2}-\d{2}", t)
        try:
            when = _dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
        except ValueError:
            when = None
        if when is not None:
            if when.tzinfo is None:
                when = when.replace(tzinfo=_dt.UTC)
            seconds = when.timestamp()
            if upper:  # the whole of the last unit written: a day, a minute, a second
                clock = re.search(r"[T ](\d{2}):(\d{2})(:\d{2})?(\.\d+)?", t)
                unit = 86400 if day else (0 if clock is None or clock.group(4)
                                          else 1 if clock.group(3) else 60)
                seconds += max(0, unit - 1e-6)
            return "date", seconds
    raise UsageError(f"{flag} {text!r}: expected an event number or a date (2024-01-05, "
                     "2024-01-05T12:00, ~2024.1.5..12.00.00)")


class Window:
    """The events ``--since``/``--until`` select."""

    def __init__(self, since: str | None, until: str | None):
        self.lo_event, self.hi_event = 1, None
        self.lo_date = self.hi_date = None
        for text, upper in ((since, False), (until, True)):
            if text is None:
                continue
            kind, value = parse_bound(text, upper)
            if kind == "event":
                if upper:
                    self.hi_event = int(value)
                else:
                    self.lo_event = int(value)
            elif upper:
                self.hi_date = value
            else:
                self.lo_date = value
        if self.hi_event is not None and self.hi_event < self.lo_event:
            raise UsageError(f"--since {since} is after --until {until}")
        if (self.lo_date is not None and self.hi_date is not None
                and self.hi_date < self.lo_date):
            raise UsageError(f"--since {since} is after --until {until}")
        self.dated = self.lo_date is not None or self.hi_date is not None

    def events(self, first: int, last: int) -> tuple[int, int]:
        hi = last if self.hi_event is None else min(last, self.hi_event)
        return max(first, self.lo_event), hi

    def keeps(self, date: int | None) -> bool:
        if not self.dated:
            return True
        if date is None:
            return False
        t = unix(date)
        return ((self.lo_date is None or t >= self.lo_date)
                and (self.hi_date is None or t <= self.hi_date))


def gather(ships, key: str, depth: int, window: Window, progress=None,
           bins: bool = False, stats=None) -> tuple[Breakdown, dict]:
    """One pass over every ship: the :class:`Breakdown` by ``key``, and ``(ship, epoch)
    -> Group`` of the events counted in each pier epoch.  ``stats``: an optional
    ``add(event, size, date, tag, ...)`` sink (the classic report's charts)."""
    from bookfs.cli.heads import Decoder

    keyf = key_function(key, depth)
    decode = Decoder(**decoder_wants(key))
    bd = Breakdown(key, depth, bins=bins)
    per_epoch: dict = {}
    done = 0
    for ship in ships:
        lo, hi = window.events(*ship.range) if ship.range[1] else (1, 0)
        for h in ship.heads(decode, lo, hi):
            done += 1
            if progress is not None and done % PROGRESS_EVERY == 0:
                progress(PROGRESS_EVERY)
            if not window.keeps(h.date):
                continue
            bd.add(keyf(h, ship.name), h.size, h.date, h.event, ship.name)
            if stats is not None:
                stats(h)
            if h.epoch is not None:
                g = per_epoch.get((ship.name, h.epoch))
                if g is None:
                    g = per_epoch[(ship.name, h.epoch)] = Group()
                g.add(h.size, None, h.event, ship.name)
    if progress is not None:
        progress(done % PROGRESS_EVERY)
    return bd, per_epoch


def planned(ships, window: Window) -> int:
    """How many events the pass reads (the progress bar's total)."""
    n = 0
    for s in ships:
        if s.range[1]:
            lo, hi = window.events(*s.range)
            n += max(0, hi - lo + 1)
    return n


# --- text --------------------------------------------------------------------------------


def _rate(n: int | None) -> str:
    return "-" if n is None else human_size(n) + "/day"


def _label(key: str, value: str) -> str:
    if key == "card" and value and not value.startswith("("):
        return "%" + value
    return value


def render_text(result: dict, source: str) -> str:
    t = result["total"]
    key = result["key"]
    head = f"{key} (first {result['depth']} segments)" if key == "wire" else key
    span = (f"{t['first_date']} .. {t['last_date']}" if t["first_date"] else "no dates")
    lines = [f"{source}: events {t['first_event'] or 0:,}..{t['last_event'] or 0:,}: "
             f"{t['events']:,} events, {human_size(t['bytes'])} ({t['bytes']:,} bytes), "
             f"{span}, {_rate(t['bytes_per_day'])}",
             f"by {head}: {t['groups']:,} group{'s' if t['groups'] != 1 else ''}", ""]
    rows = [(_label(key, g["key"]), f"{g['events']:,}", f"{100 * g['events_share']:.1f}%",
             human_size(g["bytes"]), f"{100 * g['share']:.1f}%", _rate(g["bytes_per_day"]),
             (f"{g['biggest']['event']} ({human_size(g['biggest']['bytes'])})"
              + (f" {g['biggest']['ship']}" if "ship" in g["biggest"] else ""))
             if g["biggest"] else "-") for g in result["groups"]]
    titles = (key, "events", "%", "bytes", "%", "growth", "biggest event")
    widths = [max(len(r[i]) for r in [titles, *rows]) for i in range(len(titles))]
    for r in [titles, *rows]:
        lines.append("  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    if result.get("epochs"):
        lines += ["", "epochs (pier):"]
        for e in result["epochs"]:
            who = f"{e['ship']} " if "ship" in e else ""
            span = f"{e['first']:,}..{e['last']:,}" if e["events"] else "empty"
            lines.append(f"  {who}{e['epoch']:<10} {span:>22}  {e['events']:>10,} events  "
                         f"{human_size(e['counted_bytes']):>10} counted  "
                         f"{human_size(e['disk_bytes']):>10} on disk"
                         + ("  (chop frees)" if e["chop_frees"] else ""))
        c = result["chop"]
        lines.append(f"roll then chop would free {human_size(c['frees_disk_bytes'])} now"
                     + (f" (deletes {', '.join(c['deletes'])}; keeps "
                        f"{', '.join(c['keeps'])})" if c["deletes"] else
                        f" (keeps {', '.join(c['keeps'])}: nothing older to delete)")
                     + f": {c['rule']}")
    return "\n".join(lines) + "\n"


# --- the command ----------------------------------------------------------------------------


def run(args) -> int:
    """``bookfs report SRC --by KEY`` (the module docstring)."""
    from bookfs.cli.commands import _progress_bar
    from bookfs.cli.heads import open_ships

    if not os.path.exists(args.source):
        raise UsageError(f"{args.source}: no such file or directory; expected a bookfs "
                         "mount, a fleet, a pier, a Book directory or an LMDB epoch")
    if args.depth is not None and args.by != "wire":
        raise UsageError(f"--depth is for --by wire, not --by {args.by}")
    window = Window(args.since, args.until)
    out = getattr(args, "out", None)
    if out is not None:
        from bookfs.cli.breakdown_html import check_out

        check_out(out)
    ships = open_ships(args.source)
    try:
        if not ships or not any(s.range[1] for s in ships):
            raise UsageError(f"{args.source} holds no events; nothing to break down")
        total = planned(ships, window)
        with _progress_bar(total, "report", unit="ev") as bar:
            stats = None
            if out is not None:
                from bookfs.cli.report_stats import prepare_stats

                charts = prepare_stats(ships, window)
                stats = charts.add_head
            bd, per_epoch = gather(ships, args.by, args.depth or 2, window, bar.update,
                                   bins=out is not None, stats=stats)
        result = bd.result(args.top)
        result["source"] = os.path.abspath(args.source)
        result["window"] = {"since": args.since, "until": args.until}
        epochs, chop = epochs_report(ships, per_epoch)
        if epochs:
            result["epochs"], result["chop"] = epochs, chop
    finally:
        for s in ships:
            s.close()
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(result, args.source))
    if out is not None:
        from bookfs.cli.breakdown_html import write_page

        write_page(out, result, bd, charts, args.source)
        print(f"bookfs report: wrote {os.path.join(out, 'index.html')}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


__all__ = ["OTHER", "Window", "gather", "iso", "parse_bound", "render_text", "run"]
